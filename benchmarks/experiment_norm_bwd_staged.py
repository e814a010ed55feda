"""Experiment (session 14): RMSNorm backward with each row read once, split over a group of
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

Prints ms and % of copy (6 bytes a column) for the library's backward (liger_aot.ops.
rms_norm._backward as shipped: the grouped kernel on sm90 unless LIGER_AOT_GROUPED_NORM_BWD=0;
the AOT build where LIGER_AOT_ARTIFACT_DIR names one) and the grouped kernel (JIT) on each
config, each a CUDA-graph replay of the whole backward (buffers zeroed, the kernel),
checked first against an fp32 torch reference. Needs a CUDA GPU (--compile-only: sm90 ptxas
here, registers and shared memory of each config).

  python benchmarks/experiment_norm_bwd_staged.py [--cols 16384 32768 65536] [--configs ...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp  # noqa: E402

from kernel_src import staged_rows  # noqa: E402
from kernel_src.rms_norm import spec  # noqa: E402
from kernel_src.rms_norm.kernels import rms_norm_bwd_grouped  # noqa: E402
from kernel_src.spec import Config, grouped_grid  # noqa: E402
from _sm90 import compile_sm90, programs_fit  # noqa: E402  (tests/: sm90 ptxas, residency)

LN_MAX_SPLIT = gl.constexpr(32)


# LayerNorm's grouped backward, experiment only (session 14; not in the library: see the
# docstring). The layout of rms_norm_bwd_grouped (kernel_src/rms_norm/kernels.py, which
# explains it):
# program `part` of a group of split = n_cols / BLOCK_N owns a column slice of every row of
# its group, holds its slices of w, dw and db in registers, streams x and dy through a ring,
# and the row's two sums sum(g * xhat) and sum(g) (g = dy * w) are the group's shares,
# exchanged as two tagged words a (row, part), a row behind.

@gluon.jit
def _row_shares(ring_x, ring_dy, slot, w, mean, rstd, layout: gl.constexpr):
    """This program's shares of a row's sum(g * xhat) and sum(g), from the ring."""
    x = ring_x.index(slot).load(layout).to(gl.float32)
    g = ring_dy.index(slot).load(layout).to(gl.float32) * w
    return gl.sum(g * ((x - mean) * rstd), axis=0), gl.sum(g, axis=0)


@gluon.jit
def layer_norm_bwd_grouped(DX, DW_SUM, DB_SUM, DW, DB, SYNC, WORDS, DY, X, W, MEAN, RSTD,
                           n_rows, n_cols, stride_dx, stride_dy, stride_x,
                           BLOCK_N: gl.constexpr, SLOTS: gl.constexpr,
                           PROGRAMS_PER_SM: gl.constexpr):
    """layer_norm_bwd's function on the grouped layout: dx = rstd * (g - mean(g) - xhat *
    mean(g * xhat)), dw = sum over rows of dy * xhat, db = sum of dy. DW_SUM and DB_SUM
    (n_cols fp32 each), SYNC (split int32) and WORDS (2 * n_rows * split int64) zeroed by the
    op. The grid is whole groups, all resident (PROGRAMS_PER_SM: the op's grid)."""
    gl.static_assert(SLOTS >= 3)  # rows k and k + 1 held, one more streaming in
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [gl.num_warps()], [0])
    ring_x = gl.allocate_shared_memory(X.dtype.element_ty, [SLOTS, BLOCK_N],
                                       staged_rows.RING_LAYOUT)
    ring_dy = gl.allocate_shared_memory(DY.dtype.element_ty, [SLOTS, BLOCK_N],
                                        staged_rows.RING_LAYOUT)
    split = n_cols // BLOCK_N
    n_groups = gl.num_programs(0) // split
    group = gl.program_id(0) // split
    part = gl.program_id(0) % split
    cols = part * BLOCK_N + gl.arange(0, BLOCK_N, layout)
    for t in gl.static_range(SLOTS):
        staged_rows.issue_pair(ring_x, ring_dy, X, DY, stride_x, stride_dy, n_rows, t, group,
                               n_groups, cols, SLOTS)
    w = gl.load(W + cols).to(gl.float32)
    dw = gl.zeros([BLOCK_N], gl.float32, layout)
    db = gl.zeros([BLOCK_N], gl.float32, layout)
    n_mine = gl.cdiv(n_rows - group, n_groups)
    mean = gl.load(MEAN + group)
    rstd = gl.load(RSTD + group)
    cp.wait_group(SLOTS - 1)  # row 0 of the group (groups <= n_rows: there is one)
    s_gx, s_g = _row_shares(ring_x, ring_dy, 0, w, mean, rstd, layout)
    if split > 1:
        staged_rows.publish_word(WORDS, (group * split + part) * 2, s_gx)
        staged_rows.publish_word(WORDS, (group * split + part) * 2 + 1, s_g)
    for k in range(n_mine):
        row = group + k * n_groups
        nxt = row + n_groups
        mean_next = gl.load(MEAN + nxt, mask=nxt < n_rows, other=0.0)
        rstd_next = gl.load(RSTD + nxt, mask=nxt < n_rows, other=0.0)
        # pass 1 of row k + 1: SLOTS + k copies issued, rows k and k + 1 complete
        cp.wait_group(SLOTS - 2)
        n_gx, n_g = _row_shares(ring_x, ring_dy, (k + 1) % SLOTS, w, mean_next, rstd_next,
                                layout)
        if (split > 1) & (k + 1 < n_mine):
            staged_rows.publish_word(WORDS, (nxt * split + part) * 2, n_gx)
            staged_rows.publish_word(WORDS, (nxt * split + part) * 2 + 1, n_g)
        if split > 1:
            shares, _ = staged_rows.collect_words(WORDS, row * split * 2, 2, split,
                                                  LN_MAX_SPLIT)
            s_gx = gl.sum(shares, axis=0)
            shares, _ = staged_rows.collect_words(WORDS, row * split * 2 + 1, 2, split,
                                                  LN_MAX_SPLIT)
            s_g = gl.sum(shares, axis=0)
        # pass 2 of row k, its slot then refilled with row k + SLOTS
        x = ring_x.index(k % SLOTS).load(layout).to(gl.float32)
        dy = ring_dy.index(k % SLOTS).load(layout).to(gl.float32)
        staged_rows.issue_pair(ring_x, ring_dy, X, DY, stride_x, stride_dy, n_rows, k + SLOTS,
                               group, n_groups, cols, SLOTS)
        xhat = (x - mean) * rstd
        dx = rstd * (dy * w - s_g / n_cols - xhat * (s_gx / n_cols))
        gl.store(DX + row.to(gl.int64) * stride_dx + cols, dx.to(DX.dtype.element_ty))
        dw += dy * xhat
        db += dy
        s_gx, s_g, mean, rstd = n_gx, n_g, mean_next, rstd_next
    cp.wait_group(0)  # the ring's last copies (rows past the end)
    gl.atomic_add(DW_SUM + cols, dw, sem="relaxed", scope="gpu")
    gl.atomic_add(DB_SUM + cols, db, sem="relaxed", scope="gpu")
    if staged_rows.last_of_slice(SYNC, part, n_groups):
        staged_rows.write_total(DW_SUM, DW, cols)
        staged_rows.write_total(DB_SUM, DB, cols)


# the library's config first, then neighbours of the session-14 sweep
CONFIGS = "2048,3,4,8,64;2048,3,4,7,72;2048,3,4,6,80;4096,3,8,3,80;1024,6,4,8,64"


def parse_configs(text):
    out = []
    for item in text.split(";"):
        block_n, slots, warps, per_sm, maxnreg = map(int, item.split(","))
        out.append({"BLOCK_N": block_n, "SLOTS": slots, "warps": warps, "PROGRAMS_PER_SM": per_sm,
                    "maxnreg": maxnreg})
    return out


def tag(c):
    return "{BLOCK_N},{SLOTS},{warps},{PROGRAMS_PER_SM},{maxnreg}".format(**c)


def constexprs(c):
    return {k: c[k] for k in ("BLOCK_N", "SLOTS", "PROGRAMS_PER_SM")}


def config_of(c):
    return Config(constexprs(c), num_warps=c["warps"], maxnreg=c["maxnreg"])


def compile_only(configs):
    for c in configs:
        k = compile_sm90(spec.BWD_GROUPED, [["CASTING", 0]], config_of(c))
        fit = programs_fit(k, config_of(c), c["PROGRAMS_PER_SM"])
        print(f"{tag(c)}: regs {k['regs']}, stack {k['stack']} B, shared {k['shared']} B, "
              f"{'fits' if fit else 'DOES NOT FIT'}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cols", type=int, nargs="+", default=[16384, 32768, 65536])
    parser.add_argument("--elements", type=int, default=1 << 26, help="rows x cols a shape")
    parser.add_argument("--configs", default=CONFIGS,
                        help="'BLOCK_N,SLOTS,warps,per_sm,maxnreg;...' (default: the "
                             "library's config and four neighbours)")
    parser.add_argument("--op", choices=("rms_norm", "layer_norm"), default="rms_norm")
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    configs = parse_configs(args.configs)
    if args.compile_only:
        if args.op != "rms_norm":
            parser.error("--compile-only compiles the library's kernel, rms_norm_bwd_grouped")
        compile_only(configs)
        return
    from triton.testing import do_bench

    import torch.nn.functional as F

    from _gpu import capture_graph, copy_bandwidth
    from liger_aot.ops import layer_norm as ln_mod
    from liger_aot.ops import rms_norm as rms_mod

    max_split = spec.MAX_GROUPED_SPLIT if args.op == "rms_norm" else LN_MAX_SPLIT.value
    kernel = rms_norm_bwd_grouped if args.op == "rms_norm" else layer_norm_bwd_grouped

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    print(f"copy {bw / 1e12:.2f} TB/s, {sms} SMs", flush=True)

    def graph_ms(fn):
        return do_bench(capture_graph(fn).replay, warmup=25, rep=200, return_mode="median")

    for n in args.cols:
        m = args.elements // n
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
        xf, wf, dyf = x.float().requires_grad_(), w.float().requires_grad_(), dy.float()
        bf = torch.zeros(n, device="cuda", requires_grad=True)
        mean = xf.detach().mean(1)
        if args.op == "rms_norm":
            rstd = torch.rsqrt(xf.detach().pow(2).mean(1) + 1e-6)
            (xf * rstd[:, None] * wf).backward(dyf)
        else:
            rstd = torch.rsqrt((xf.detach() - mean[:, None]).pow(2).mean(1) + 1e-6)
            F.layer_norm(xf, (n,), wf, bf, 1e-6).backward(dyf)
        refs = [xf.grad, wf.grad] + ([bf.grad] if args.op == "layer_norm" else [])
        floor_ms = 3 * m * n * 2 / bw * 1e3

        def err(*grads):
            return max(((g.float() - r).norm() / r.norm()).item() for g, r in zip(grads, refs))

        def library():
            if args.op == "rms_norm":
                return rms_mod._backward(dy, x, w, rstd, 0.0, 0)
            return ln_mod.layer_norm_backward(dy, x, w, mean, rstd)

        sums = 1 if args.op == "rms_norm" else 2  # dw (and db)

        def buffers(split):
            """dx, then the kernel's sums, outputs, counters and words (zeroed)."""
            return ([torch.empty_like(x)]
                    + [torch.zeros(n, device="cuda", dtype=torch.float32) for _ in range(sums)]
                    + [torch.empty_like(w) for _ in range(sums)]
                    + [torch.zeros(split, device="cuda", dtype=torch.int32),
                       torch.zeros(m * split * sums, device="cuda", dtype=torch.int64)])

        def args_of(bufs):
            stats = (rstd,) if args.op == "rms_norm" else (mean, rstd)
            tail = (0.0,) if args.op == "rms_norm" else ()
            return (*bufs, dy, x, w, *stats, m, n, n, n, n, *tail)

        runs = [("library", None, library)]
        for c in configs:
            split = n // c["BLOCK_N"]
            if n % c["BLOCK_N"] or split > max_split:
                continue
            _, programs = grouped_grid(m, n, sms, config_of(c))
            launch = dict(**constexprs(c), num_warps=c["warps"], maxnreg=c["maxnreg"])
            if args.op == "rms_norm":
                launch["CASTING"] = 0

            def grouped(split=split, programs=programs, launch=launch):
                bufs = buffers(split)
                kernel[(programs,)](*args_of(bufs), **launch)
                return (bufs[0], *bufs[1 + sums:1 + 2 * sums])  # dx, dw (and db)
            runs.append((f"grouped {tag(c)}", (c, launch, split), grouped))
        for name, c, fn in runs:
            try:
                if c is not None:  # all resident, or the exchange could wait forever
                    c, launch, split = c
                    # the call's own argument types and values: the same specialization
                    k = kernel.warmup(*args_of(buffers(split)), **launch, grid=(1,))
                    k._init_handles()  # loads the binary: n_regs is known from then on
                    if not programs_fit({"regs": k.n_regs, "shared": k.metadata.shared},
                                        config_of(c), c["PROGRAMS_PER_SM"]):
                        raise RuntimeError(f"not resident: {k.n_regs} registers, "
                                           f"{k.metadata.shared} B shared")
                e = err(*fn())
                torch.cuda.synchronize()
                if not e < 2e-2:
                    raise RuntimeError(f"wrong result: rel. error {e:.2e}")
                ms = graph_ms(fn)
                status = "ok"
            except Exception as ex:  # noqa: BLE001 - keep the other configs' numbers
                e, ms, status = float("nan"), float("nan"), f"{type(ex).__name__}: {ex}"[:150]
            print(f"{m:5d} x {n:5d} {name:32s} {ms:7.4f} ms {100 * floor_ms / ms:5.1f}% of copy"
                  f"  err {e:.1e} {status}", flush=True)


if __name__ == "__main__":
    main()
