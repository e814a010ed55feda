"""Experiment (sessions 14-15): norm backwards with each row read once, split over a group of
programs that hold their slices in shared memory and exchange the row's dot by tagged words.

The library's backwards from 16K columns read x and dy twice (the looped layouts) or pair
row programs with column programs (interleaved) and run at 53-74% of copy (H200, the 6-byte
floor: read x and dy, write dx). A whole row does not fit one program at 32K-64K columns,
but its dw accumulator is what never fitted: here a program owns a column slice of
BLOCK_N columns for all the rows of its group, so its slice of w and of the dw sum stay in
registers for the whole kernel. The staged cross-entropy's layout (kernel_src/cross_entropy/
kernels.py) applied to the backward:

  group g of split = n_cols / BLOCK_N programs takes rows g, g + n_groups, ...; program part p
  streams its slice of x and dy through a ring of SLOTS row slices (cp.async), computes its
  share of the row's dot sum(dy * w * x), publishes it as a tagged word, polls the group's
  words, then writes its slice of dx and adds dy * x * rstd into its dw accumulator; at the
  end it adds the accumulator into a zeroed fp32 row (atomics), cast to the weight's dtype.

Configs BLOCK_N,SLOTS,warps,per_sm,maxnreg: slice columns, ring slots, warps, programs an
SM (the grid), ptxas's register cap. The grid is at most per_sm programs an SM, and a config
runs only if its registers and shared memory let them all be resident (the exchange waits on
the rest of the group). Prediction: two-pass traffic like the staged cross-entropy (84% of
copy there), so the 32K and 64K backwards from 53-58% to 75-85%.

Outcome (H200, docs/perf-notes.md "Session 14"; raw: docs/results/2026-12-01-norm-bwd-
grouped-session14-h200.txt): with the exchange in line (each row's dot collected before its
pass 2) 59-72% at best, the exchange costing 10-30% (timing-only variants without it: 88%),
and 4-warp programs holding x, dy, w and dw in registers at 64 spilled. A row behind (pass 1
of row k + 1 before row k's wait) with 2048-column slices, 4 warps, 8 an SM, 64 registers:
85.0 / 84.9 / 84.8% at 16K / 32K / 64K, against the library's 70 / 59 / 55%. The library
took that as rms_norm_bwd_grouped (kernel_src/rms_norm/kernels.py), which this script now
runs on each config (the in-line kernel and the timing-only variants are in the commit before).

Session 15 ran the same layout for the fused add (rms_norm_bwd_grouped with HAS_DRES) and
LayerNorm (kernel_src/layer_norm/kernels.py: layer_norm_bwd_grouped): --op fused_add and
--op layer_norm (docs/perf-notes.md "Session 15"; raw: docs/results/2026-12-02-norm-bwd-
grouped-sweeps-session15-h200.txt).

Prints ms and % of copy (6 bytes a column; 8 for the fused add, which also reads dres) for
the library's backward, first with the grouped kernels off (LIGER_AOT_GROUPED_NORM_BWD=0:
the old kernels), then as shipped (the grouped kernel on sm90; the AOT build where
LIGER_AOT_ARTIFACT_DIR names one), and the grouped kernel (JIT) on each config, each a
CUDA-graph replay of the whole backward (buffers zeroed, the kernel), checked first against
an fp32 torch reference. Needs a CUDA GPU (--compile-only: sm90 ptxas here, registers,
stack and shared memory of each config).

  python benchmarks/experiment_norm_bwd_staged.py [--op rms_norm|fused_add|layer_norm]
      [--cols 16384 32768 65536] [--configs ...]
"""
import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

from kernel_src.layer_norm import spec as ln_spec  # noqa: E402
from kernel_src.layer_norm.kernels import layer_norm_bwd_grouped  # noqa: E402
from kernel_src.rms_norm import spec as rms_spec  # noqa: E402
from kernel_src.rms_norm.kernels import rms_norm_bwd_grouped  # noqa: E402
from kernel_src.spec import Config, grouped_grid  # noqa: E402
from _sm90 import compile_sm90, programs_fit  # noqa: E402  (tests/: sm90 ptxas, residency)
from _gpu import extra_constexprs, extra_tag  # noqa: E402

# op -> (spec module, kernel, the library's config for it)
OPS = {"rms_norm": (rms_spec, rms_norm_bwd_grouped, rms_spec.GROUPED_CONFIG),
       "fused_add": (rms_spec, rms_norm_bwd_grouped, rms_spec.GROUPED_DRES_CONFIG),
       "layer_norm": (ln_spec, layer_norm_bwd_grouped, ln_spec.GROUPED_CONFIG)}
# neighbours of the session-14/15 sweeps (the library's config runs first); W_SHARED, the
# sixth field, for layer_norm only
CONFIGS = {"rms_norm": "2048,3,4,7,72;2048,3,4,6,80",
           "fused_add": "2048,3,4,8,64;2048,3,4,6,80",
           "layer_norm": "2048,3,4,7,72,1;2048,3,4,6,80,0"}


def parse_configs(text, op):
    out = []
    for item in text.split(";"):
        words = item.split(",")
        n_fields = 6 if op == "layer_norm" else 5
        extra = extra_constexprs(words[n_fields:], item)
        fields = list(map(int, words[:n_fields]))
        if len(fields) != n_fields:
            raise SystemExit(f"config {item!r}: BLOCK_N,SLOTS,warps,per_sm,maxnreg"
                             + (",W_SHARED" if op == "layer_norm" else ""))
        block_n, slots, warps, per_sm, maxnreg = fields[:5]
        constexprs = {"BLOCK_N": block_n, "SLOTS": slots, "PROGRAMS_PER_SM": per_sm}
        if op == "layer_norm":
            constexprs["W_SHARED"] = fields[5]
        else:
            constexprs["HAS_DRES"] = int(op == "fused_add")
        constexprs.update(extra)
        out.append(Config(constexprs, num_warps=warps, maxnreg=maxnreg))
    return out


def tag(c):
    k = c.constexprs
    return (f"{k['BLOCK_N']},{k['SLOTS']},{c.num_warps},{k['PROGRAMS_PER_SM']},{c.maxnreg}"
            + (f",{k['W_SHARED']}" if "W_SHARED" in k else "")
            + extra_tag(k))


def options_of(op):
    return [] if op == "layer_norm" else [["CASTING", 0]]


def compile_only(op, configs):
    for c in configs:
        k = compile_sm90(OPS[op][0].BWD_GROUPED, options_of(op), c)
        fit = programs_fit(k, c, c.constexprs["PROGRAMS_PER_SM"])
        print(f"{tag(c)}: regs {k['regs']}, stack {k['stack']} B, shared {k['shared']} B, "
              f"{'fits' if fit else 'DOES NOT FIT'}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cols", type=int, nargs="+", default=[16384, 32768, 65536])
    parser.add_argument("--elements", type=int, default=1 << 26, help="rows x cols a shape")
    parser.add_argument("--configs",
                        help="'BLOCK_N,SLOTS,warps,per_sm,maxnreg[,W_SHARED][,NAME=INT...];...' "
                             "(W_SHARED: layer_norm only; NAME=INT: more of the kernel's "
                             "constexprs; default: neighbours of the library's config)")
    parser.add_argument("--op", choices=sorted(OPS), default="rms_norm")
    parser.add_argument("--compile-only", action="store_true",
                        help="sm90 ptxas only (no GPU): registers, stack, shared memory")
    args = parser.parse_args()
    op_spec, kernel, library_config = OPS[args.op]
    configs = [library_config] + [c for c in parse_configs(args.configs or CONFIGS[args.op],
                                                           args.op)
                                  if tag(c) != tag(library_config)]
    if args.compile_only:
        compile_only(args.op, configs)
        return

    import torch.nn.functional as F

    from _gpu import checked_timing, copy_bandwidth, graph_ms
    from liger_aot.ops import layer_norm as ln_mod
    from liger_aot.ops import rms_norm as rms_mod

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    print(f"{args.op}: copy {bw / 1e12:.2f} TB/s, {sms} SMs", flush=True)
    dres_op = args.op == "fused_add"
    sums = 2 if args.op == "layer_norm" else 1  # dw (and db)
    bytes_a_col = 8 if dres_op else 6  # x, dy (, dres) read, dx written

    for n in args.cols:
        m = args.elements // n
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        dres = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
        xf, wf, dyf = x.float().requires_grad_(), w.float().requires_grad_(), dy.float()
        bf = torch.zeros(n, device="cuda", requires_grad=True)
        mean = xf.detach().mean(1)
        if args.op == "layer_norm":
            rstd = torch.rsqrt((xf.detach() - mean[:, None]).pow(2).mean(1) + 1e-6)
            F.layer_norm(xf, (n,), wf, bf, 1e-6).backward(dyf)
            refs = [xf.grad, wf.grad, bf.grad]
        else:
            rstd = torch.rsqrt(xf.detach().pow(2).mean(1) + 1e-6)
            (xf * rstd[:, None] * wf).backward(dyf)
            refs = [xf.grad + (dres.float() if dres_op else 0), wf.grad]
        floor_ms = bytes_a_col * m * n / bw * 1e3

        def err(*grads):
            return max(((g.float() - r).norm() / r.norm()).item() for g, r in zip(grads, refs))

        def library():
            if args.op == "layer_norm":
                return ln_mod.layer_norm_backward(dy, x, w, mean, rstd)
            return rms_mod._backward(dy, x, w, rstd, 0.0, 0, dres=dres if dres_op else None)

        def library_old():
            os.environ["LIGER_AOT_GROUPED_NORM_BWD"] = "0"
            ln_mod._grouped_devices.clear()
            rms_mod._grouped_devices.clear()
            try:
                return library()
            finally:
                del os.environ["LIGER_AOT_GROUPED_NORM_BWD"]
                ln_mod._grouped_devices.clear()
                rms_mod._grouped_devices.clear()

        def buffers(split):
            """dx, then the kernel's sums, outputs, counters and words (zeroed)."""
            return ([torch.empty_like(x)]
                    + [torch.zeros(n, device="cuda", dtype=torch.float32) for _ in range(sums)]
                    + [torch.empty_like(w) for _ in range(sums)]
                    + [torch.zeros(split, device="cuda", dtype=torch.int32),
                       torch.zeros(m * split, device="cuda", dtype=torch.int64)])

        def args_of(bufs):
            if args.op == "layer_norm":
                return (*bufs, dy, x, w, mean, rstd, m, n, n, n, n)
            return (*bufs, dy, x, w, rstd, m, n, n, n, n, 0.0, dres, n)

        runs = [("library, old kernels", None, library_old), ("library", None, library)]
        for c in configs:
            split = n // c.constexprs["BLOCK_N"]
            if n % c.constexprs["BLOCK_N"] or split > op_spec.MAX_GROUPED_SPLIT:
                continue
            _, programs = grouped_grid(m, n, sms, c)
            launch = dict(**c.constexprs, num_warps=c.num_warps, maxnreg=c.maxnreg)
            if args.op != "layer_norm":
                launch["CASTING"] = 0

            def grouped(split=split, programs=programs, launch=launch):
                bufs = buffers(split)
                kernel[(programs,)](*args_of(bufs), **launch)
                return (bufs[0], *bufs[1 + sums:1 + 2 * sums])  # dx, dw (and db)
            runs.append((f"grouped {tag(c)}", (c, launch, split), grouped))
        def resident(c):
            """All programs resident, or the exchange could wait forever."""
            c, launch, split = c
            # the call's own argument types and values: the same specialization
            k = kernel.warmup(*args_of(buffers(split)), **launch, grid=(1,))
            k._init_handles()  # loads the binary: n_regs is known from then on
            if not programs_fit({"regs": k.n_regs, "shared": k.metadata.shared},
                                c, c.constexprs["PROGRAMS_PER_SM"]):
                raise RuntimeError(f"not resident: {k.n_regs} registers, "
                                   f"{k.metadata.shared} B shared")

        for name, c, fn in runs:
            e, ms, status = checked_timing(
                fn, err, graph_ms, None if c is None else functools.partial(resident, c))
            print(f"{m:5d} x {n:5d} {name:32s} {ms:7.4f} ms {100 * floor_ms / ms:5.1f}% of copy"
                  f"  err {e:.1e} {status}", flush=True)


if __name__ == "__main__":
    main()
