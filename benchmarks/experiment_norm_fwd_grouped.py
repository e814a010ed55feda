"""Experiment (session 17): norm forwards on the grouped backward's layout, each row read once
and split over a group of programs that exchange the row's statistics by tagged words.

The library's forwards from 16K columns run at 80-87% of copy for RMSNorm, 70-76% for
LayerNorm and 82% for the fused add at 64K (H200, graphs; docs/perf-notes.md, sessions
12-15): the looped kernels read x twice (pass 2 from L2), the staged ones stream a whole row
through one program's ring at 1-3 programs an SM. The grouped backwards (rms_norm_bwd_grouped,
layer_norm_bwd_grouped) reached 86-90% of their floors with 4-warp programs, 6-8 an SM, each
owning a 2048-column slice of its group's rows. Here the same layout computes y:
rms_norm_fwd_grouped (kernel_src/rms_norm/kernels.py; HAS_RESIDUAL for the fused add) and
layer_norm_fwd_grouped (kernel_src/layer_norm/kernels.py, which combines the slices' means
and squared deviations exactly). Prediction: the backwards' 86-88% of copy at 16K-64K.

Outcome (H200, docs/perf-notes.md "Session 17"; raw: docs/results/2026-12-02-norm-fwd-
grouped-session17-h200.txt): RMSNorm 86% and the fused add 91% at every length from 16K to
64K (2048,3,4,10,48 and 2048,3,4,6,80), LayerNorm 79% (2048,3,4,9,56, after its slice
statistics became the looped forward's shifted sums in one reduction). The library took
them as rms_norm_fwd_grouped and layer_norm_fwd_grouped for the lengths where they were
ahead, so with the defaults its "library" row is the grouped kernel there too:
LIGER_AOT_GROUPED_NORM_FWD=0 times the other forwards.

Configs BLOCK_N,SLOTS,warps,per_sm,maxnreg[,NAME=INT...] (NAME=INT: more of the kernel's
constexprs, for trials). Prints ms and % of copy (4 bytes a column; 8 for the fused add: x and
r read, y and s written) for the library's forward as shipped (the AOT build where
LIGER_AOT_ARTIFACT_DIR names one) and for the grouped kernel (JIT) on each config, each a
CUDA-graph replay of the whole forward (outputs allocated, the words zeroed, the kernel),
checked first against an fp32 torch reference; and the library with one more memset of the
words' size in the same graph (what a forward without that memset could save at most).
Needs a CUDA GPU (--compile-only: sm90 ptxas here, registers, stack and shared memory of each
config).

  python benchmarks/experiment_norm_fwd_grouped.py [--op rms_norm|fused_add|layer_norm]
      [--cols 16384 32768 65536] [--configs ...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

from kernel_src.layer_norm import spec as ln_spec  # noqa: E402
from kernel_src.rms_norm import spec as rms_spec  # noqa: E402
from kernel_src.spec import Config, grouped_grid  # noqa: E402
from _sm90 import compile_sm90, programs_fit  # noqa: E402  (tests/: sm90 ptxas, residency)
from _gpu import extra_constexprs, extra_tag  # noqa: E402

OPS = {"rms_norm": rms_spec.FWD_GROUPED, "fused_add": rms_spec.FWD_GROUPED,
       "layer_norm": ln_spec.FWD_GROUPED}
CONFIGS = {"rms_norm": "2048,3,4,8,64;2048,4,4,8,64;2048,3,4,10,48;2048,4,4,10,48;"
                       "2048,3,4,12,40;2048,3,4,6,80",
           "fused_add": "2048,3,4,8,64;2048,3,4,7,72;2048,3,4,6,80;2048,4,4,6,80",
           "layer_norm": "2048,3,4,8,64;2048,4,4,8,64;2048,3,4,9,56;2048,3,4,6,80"}


def parse_configs(text, op):
    out = []
    for item in text.split(";"):
        fields = item.split(",")
        block_n, slots, warps, per_sm, maxnreg = map(int, fields[:5])
        constexprs = {"BLOCK_N": block_n, "SLOTS": slots, "PROGRAMS_PER_SM": per_sm}
        if op != "layer_norm":
            constexprs["HAS_RESIDUAL"] = int(op == "fused_add")
        constexprs.update(extra_constexprs(fields[5:], item))
        out.append(Config(constexprs, num_warps=warps, maxnreg=maxnreg))
    return out


def tag(c):
    k = c.constexprs
    return (f"{k['BLOCK_N']},{k['SLOTS']},{c.num_warps},{k['PROGRAMS_PER_SM']},{c.maxnreg}"
            + extra_tag(k))


def options_of(op):
    return [] if op == "layer_norm" else [["CASTING", 0]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cols", type=int, nargs="+", default=[16384, 32768, 65536])
    parser.add_argument("--elements", type=int, default=1 << 26, help="rows x cols a shape")
    parser.add_argument("--configs", help="'BLOCK_N,SLOTS,warps,per_sm,maxnreg;...'")
    parser.add_argument("--op", choices=sorted(OPS), default="rms_norm")
    parser.add_argument("--compile-only", action="store_true",
                        help="sm90 ptxas only (no GPU): registers, stack, shared memory")
    args = parser.parse_args()
    spec = OPS[args.op]
    configs = parse_configs(args.configs or CONFIGS[args.op], args.op)
    if args.compile_only:
        for c in configs:
            k = compile_sm90(spec, options_of(args.op), c)
            fit = programs_fit(k, c, c.constexprs["PROGRAMS_PER_SM"])
            print(f"{args.op} {tag(c)}: regs {k['regs']}, stack {k['stack']} B, shared "
                  f"{k['shared']} B, {'fits' if fit else 'DOES NOT FIT'}", flush=True)
        return

    import torch.nn.functional as F

    from _gpu import checked_timing, copy_bandwidth, graph_ms
    from liger_aot.kernel_src import jit_function
    from liger_aot.ops import layer_norm as ln_mod
    from liger_aot.ops import rms_norm as rms_mod

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    print(f"{args.op}: copy {bw / 1e12:.2f} TB/s, {sms} SMs", flush=True)
    fused = args.op == "fused_add"
    bytes_a_col = 8 if fused else 4

    for n in args.cols:
        m = args.elements // n
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
        b = (0.1 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
        if args.op == "layer_norm":
            x = x + 3.0  # a mean far from 0: the exact variance combination is tested
            refs = [F.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-6)]
        else:
            s = (x + r) if fused else x  # rounded to bf16, as the kernels' s
            sf = s.float()
            refs = [sf * torch.rsqrt(sf.pow(2).mean(1, keepdim=True) + 1e-6) * w.float()]
            if fused:
                refs.append(sf)
        floor_ms = bytes_a_col * m * n / bw * 1e3

        def err(*outs):
            return max(((o.float() - ref).norm() / ref.norm()).item()
                       for o, ref in zip(outs, refs))

        def library():
            if args.op == "layer_norm":
                return ln_mod.layer_norm_forward(x, w, b, 1e-6)[:1]
            y, s_out, _ = rms_mod._forward(x, w, 1e-6, 0.0, 0, residual=r if fused else None)
            return (y, s_out) if fused else (y,)

        # a buffer of the words' size: memset alone, and once more in the library's graph (the
        # most that a forward without its words' memset could gain, session 36)
        slice_cols = (ln_spec if args.op == "layer_norm" else rms_spec).GROUPED_BLOCK_N
        spare_words = torch.zeros(m * (n // slice_cols), device="cuda", dtype=torch.int64)

        def library_and_memset():
            spare_words.zero_()
            return library()

        runs = [("library", library), ("library + a words memset", library_and_memset)]
        for c in configs:
            split = n // c.constexprs["BLOCK_N"]
            if n % c.constexprs["BLOCK_N"] or split > rms_spec.MAX_GROUPED_SPLIT:
                continue
            _, programs = grouped_grid(m, n, sms, c)
            fn = jit_function(spec, c)
            launch = dict(**c.constexprs, num_warps=c.num_warps, maxnreg=c.maxnreg)
            if args.op != "layer_norm":
                launch["CASTING"] = 0

            def kernel_args(split):
                y = torch.empty_like(x)
                words = torch.zeros(m * split, device="cuda", dtype=torch.int64)
                stats = torch.empty(m, device="cuda", dtype=torch.float32)
                if args.op == "layer_norm":
                    mean = torch.empty(m, device="cuda", dtype=torch.float32)
                    return (y,), (y, mean, stats, words, x, w, b, m, n, n, n, 1e-6, 1)
                s_out = torch.empty_like(x) if fused else y
                return ((y, s_out) if fused else (y,),
                        (y, stats, words, x, w, m, n, n, n, 1e-6, 0.0, s_out, r, n, n))

            def grouped(split=split, programs=programs, launch=launch, fn=fn):
                outs, kargs = kernel_args(split)
                fn[(programs,)](*kargs, **launch)
                return outs

            def resident(split=split, launch=launch, fn=fn, c=c):
                """All programs resident, or the exchange could wait forever."""
                k = fn.warmup(*kernel_args(split)[1], **launch, grid=(1,))
                k._init_handles()  # loads the binary: n_regs is known from then on
                if not programs_fit({"regs": k.n_regs, "shared": k.metadata.shared}, c,
                                    c.constexprs["PROGRAMS_PER_SM"]):
                    raise RuntimeError(f"not resident: {k.n_regs} registers, "
                                       f"{k.metadata.shared} B shared")
            runs.append((f"grouped {tag(c)}", grouped, resident))
        for name, fn, *check in runs:
            e, ms, status = checked_timing(fn, err, graph_ms, *check)
            print(f"{m:5d} x {n:5d} {name:28s} {ms:7.4f} ms {100 * floor_ms / ms:5.1f}% of copy"
                  f"  err {e:.1e} {status}", flush=True)
        print(f"{m:5d} x {n:5d} {'memset of the words alone':28s} "
              f"{graph_ms(spare_words.zero_):7.4f} ms", flush=True)


if __name__ == "__main__":
    main()
