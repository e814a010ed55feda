"""Experiment (session 9): the looped RMSNorm forward (rows of 16K-64K columns) with each
program's rows skewed, so pass 2 of one row and pass 1 of the next share one loop.

The library's looped forward runs one program per row: pass 1 reads the row (DRAM) for its
sum of squares, pass 2 reads it again (L2) and writes y. On 32 warps one program fills an
SM, so the SM's DRAM reads stop while it sums and while pass 2 runs: 83% of copy at 32K,
75% at 64K on an H200 (CUDA-graph replays, session 8), against 90% for torch.compile's
one-row kernel at 32K (60% at 64K). Here each program owns a run of rows; one loop over the
column blocks loads row r + 1's block (DRAM, evict_last) for its sum while it normalizes row
r's block (read again from L2, evict_first) and stores y: reads and writes stay in flight
across the row boundaries, and only the first row of a run is read alone.
Prediction: 85-90% of copy at 16K-64K (the floor counts 4 bytes a column: x read, y
written).
Outcome (H200, docs/results/2026-12-01-norm-fwd-skewed-session9-h200.txt): refuted. The
best skewed config read 81 / 76 / 69% of copy at 16K / 32K / 64K (8192 columns, 32 warps, 2
programs an SM at 16K-32K), against 87 / 85 / 76% for the library's one-row kernel and 88 /
89 / 77% for the minimal one. Not adopted. Part of the gap between the library and the
minimal kernel at 32K was one more barrier a row inside the library's block loop, since
removed for looped rows (kernel_src/rms_norm/kernels.py: 83 -> 85% of copy in the suite).

Prints, per shape, the library's forward as `liger-aot tune` times it (JIT of the shipped
kernel, the sm90 table's config), the minimal one-row looped kernel of
experiment_forward_unroll.py on the best config session 7 found (8192 columns, 32 warps),
and the skewed kernel over column blocks, warps and programs per SM; each checked against
torch first (y), timed with triton.testing.do_bench (median). JIT; needs a CUDA GPU
(--smoke: tiny shapes in Triton's interpreter, checks only).

  python benchmarks/experiment_norm_fwd_skewed.py [--ns 16384,32768,65536] [--out DIR]
  python benchmarks/experiment_norm_fwd_skewed.py --smoke
"""
import argparse
import os
import sys

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from _gpu import library_ms, row_length_sweep, write_rows  # noqa: E402
from experiment_forward_unroll import looped_rms_fwd  # noqa: E402

EPS = 1e-6


@triton.jit
def skewed_rms_fwd(Y, X, W, RSTD, n_rows, n_cols, eps, rows_per_program,
                   BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    """Rows [pid R, (pid + 1) R) of R = rows_per_program, llama casting. Pass 1 of the first
    row alone, then per row one loop: pass 1 of the next row and pass 2 of this one."""
    first = tl.program_id(0).to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
        c = start + cols
        x = tl.load(X + first * n_cols + c, mask=(c < n_cols) & (first < last), other=0.0,
                    eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for row in tl.range(first, last):
        has_next = row + 1 < last
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
            c = start + cols
            m = c < n_cols
            xn = tl.load(X + (row + 1) * n_cols + c, mask=m & has_next, other=0.0,
                         eviction_policy="evict_last").to(tl.float32)
            acc += xn * xn
            x = tl.load(X + row * n_cols + c, mask=m, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            w = tl.load(W + c, mask=m, other=0.0).to(tl.float32)
            y = (x * rstd).to(Y.dtype.element_ty).to(tl.float32) * w
            tl.store(Y + row * n_cols + c, y.to(Y.dtype.element_ty), mask=m)
        tl.store(RSTD + row, rstd)
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)


def skewed(x, w, block_n, warps, per_sm, stages, sms):
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    programs = max(1, min(n_rows, per_sm * sms))
    rows_per_program = -(-n_rows // programs)
    programs = -(-n_rows // rows_per_program)

    def run():
        skewed_rms_fwd[(programs,)](y, x, w, rstd, n_rows, n_cols, EPS, rows_per_program,
                                    BLOCK_N=block_n, STAGES=stages, num_warps=warps)
        return y
    return run(), run


def minimal(x, w, block_n, warps):
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)

    def run():
        looped_rms_fwd[(n_rows,)](y, x, w, n_cols, EPS, BLOCK_N=block_n, UNROLL=1,
                                  num_warps=warps)
        return y
    return run(), run


def variants(smoke):
    if smoke:
        yield dict(block_n=64, warps=1, per_sm=1, stages=1)
        yield dict(block_n=128, warps=2, per_sm=2, stages=3)
        return
    for block_n, warps in ((4096, 16), (8192, 16), (8192, 32), (16384, 32), (2048, 8),
                           (4096, 8)):
        for per_sm in ((1, 2) if warps >= 16 else (2, 4)):
            for stages in (1, 3):
                yield dict(block_n=block_n, warps=warps, per_sm=per_sm, stages=stages)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", default="16384,32768,65536", help="row lengths; rows = 2^26 / n")
    p.add_argument("--out", help="folder for norm_fwd_skewed.csv")
    p.add_argument("--smoke", action="store_true",
                   help="CPU, Triton's interpreter, tiny shapes: checks only, no timings")
    args = p.parse_args()
    torch.manual_seed(0)
    device, shapes, copy_tbps = row_length_sweep(args.smoke, args.ns)
    sms = 3 if args.smoke else torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy {copy_tbps:.2f} TB/s; % of copy counts 4 bytes a column (x read, y written)")
    rows = []
    for n_rows, n_cols in shapes:
        x = torch.randn(n_rows, n_cols, device=device, dtype=torch.bfloat16)
        w = torch.randn(n_cols, device=device, dtype=torch.bfloat16)
        xf = x.float()
        ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype).float() \
            * w.float()
        floor_ms = 4 * n_rows * n_cols / copy_tbps / 1e9

        def report(kind, desc, ms, err=0.0):
            print(f"{n_rows}x{n_cols} {kind:<8} {desc:<44} {ms:7.4f} ms {floor_ms / ms:5.0%} "
                  f"err {err:.1e}" + ("  WRONG" if err > 2e-2 else ""), flush=True)
            rows.append(dict(shape=f"{n_rows}x{n_cols}", kernel=kind, config=desc, ms=ms,
                             err=err))

        def timed(kind, desc, out, run):
            err = ((out.float() - ref).norm() / ref.norm()).item()
            ms = float("nan") if args.smoke or err > 2e-2 else \
                triton.testing.do_bench(run, return_mode="median")
            report(kind, desc, ms, err)

        if not args.smoke:
            ms, tag, why = library_ms("rms_norm_fwd", n_cols, f"n_cols={n_cols},residual=False")
            report("library", tag if ms else f"{tag} failed: {why}", ms or float("nan"))
            timed("minimal", "block_n=8192 warps=32", *minimal(x, w, 8192, 32))
        for cfg in variants(args.smoke):
            timed("skewed", " ".join(f"{k}={v}" for k, v in cfg.items()),
                  *skewed(x, w, sms=sms, **cfg))
    if args.out:
        write_rows(args.out, "norm_fwd_skewed.csv", rows)


if __name__ == "__main__":
    main()
