"""Experiment (written in session 8, not yet run on a GPU: the session's device time ran out;
checked on CPU with --smoke): the RMSNorm backward of long rows (32K-64K columns) as
two kernels that read x and dy twice but never read-modify-write a weight-gradient row.

The library's looped backward moves ~14 bytes a column against the floor's 6 (x and dy read
in pass 1 and again in pass 2, dx written, the fp32 dw partial row read and written per step
of two rows) and reads 38-42% of copy at 32K-64K on an H200 (docs/perf-notes.md, session 8).
Here:
  1. row_dot: one program per row, looped: k = rstd^3 * sum(dy * w * x) / n   (x, dy: 4 B)
  2. split_dx_dw: a 2-D grid of column blocks x row groups; a program keeps its column block
     of w and of the dw sum in registers and walks its rows (software-pipelined):
     dx = rstd * dy * w - k * x, dw += dy * xhat                              (x, dy, dx: 6 B)
  3. dw = the row groups' partial rows summed (fp32, G x n: small).
10 bytes a column: at most 60% of copy. Prediction: ~50-55% at 32K and 64K (each kernel at
85-90% of its own traffic), against the library's 38-42%.

Prints, per shape, the library's looped backward as `liger-aot tune` times it (JIT of the
shipped kernel, the sm90 table's config) and the split pair over tile shapes, row groups and
stages, each checked against fp32 torch first (dx and dw), with % of copy counting 6 bytes a
column. JIT; needs a CUDA GPU (--smoke: tiny shapes in Triton's interpreter, checks only).

  python benchmarks/experiment_norm_bwd_split.py [--ns 32768,65536] [--out DIR]
  python benchmarks/experiment_norm_bwd_split.py --smoke
"""
import argparse
import csv
import os
import sys

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from _gpu import copy_bandwidth, rms_norm_backward_case  # noqa: E402


@triton.jit
def row_dot(K, X, DY, W, RSTD, n_cols, stride, BLOCK_N: tl.constexpr):
    """K[row] = rstd^3 * sum(dy * w * x) / n_cols, one program per row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N):
        c = start + cols
        m = c < n_cols
        x = tl.load(X + row * stride + c, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride + c, mask=m, other=0.0).to(tl.float32)
        w = tl.load(W + c, mask=m, other=0.0).to(tl.float32)
        acc += dy * w * x
    rstd = tl.load(RSTD + row)
    tl.store(K + row, rstd * rstd * rstd * tl.sum(acc, axis=0) / n_cols)


@triton.jit
def split_dx_dw(DX, DW_PARTIAL, X, DY, W, RSTD, K, n_rows, n_cols, stride, rows_per_group,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    """Program (j, g): columns [j BLOCK_N, (j + 1) BLOCK_N) of rows [g R, (g + 1) R), R =
    rows_per_group, BLOCK_M rows a step; writes dx there and its dw partial to row g of
    DW_PARTIAL (llama casting: xhat rounded to x's dtype)."""
    j = tl.program_id(0)
    g = tl.program_id(1)
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    first = g.to(tl.int64) * rows_per_group
    last = tl.minimum(first + rows_per_group, n_rows)
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in tl.range(0, rows_per_group, BLOCK_M, num_stages=STAGES):
        rows = first + step + tl.arange(0, BLOCK_M)
        live = rows < last
        mask = live[:, None] & col_ok[None, :]
        offs = rows[:, None] * stride + cols[None, :]
        x = tl.load(X + offs, mask=mask, other=0.0)
        xf = x.to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
        k = tl.load(K + rows, mask=live, other=0.0)[:, None]
        tl.store(DX + offs, (rstd * dy * w - k * xf).to(DX.dtype.element_ty), mask=mask)
        dw += dy * (xf * rstd).to(x.dtype).to(tl.float32)
    tl.store(DW_PARTIAL + g.to(tl.int64) * n_cols + cols, tl.sum(dw, axis=0), mask=col_ok)


def split_backward(x, dy, w, rstd, dot_block, block_m, block_n, warps, groups, stages):
    """Launches the pair; returns (dx, dw) and a function that runs it again."""
    n_rows, n_cols = x.shape
    k = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    dx = torch.empty_like(x)
    rows_per_group = -(-n_rows // groups)
    groups = -(-n_rows // rows_per_group)
    partial = torch.empty(groups, n_cols, dtype=torch.float32, device=x.device)
    dot_warps = max(1, min(32, dot_block // 256))

    def run():
        row_dot[(n_rows,)](k, x, dy, w, rstd, n_cols, x.stride(0), BLOCK_N=dot_block,
                           num_warps=dot_warps)
        split_dx_dw[(triton.cdiv(n_cols, block_n), groups)](
            dx, partial, x, dy, w, rstd, k, n_rows, n_cols, x.stride(0), rows_per_group,
            BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, num_warps=warps)
        return partial.sum(0)
    dw = run()
    return dx, dw, run


def library_ms(n):
    """The library's backward at (rows, n) as the tuner times it: (ms, config tag)."""
    from build_tools import tune
    from kernel_src.tuning import tuned_configs

    case = tune.CASES["rms_norm_bwd"]
    shape = next(s for s in case.shapes if s[1] == n and not tune._flag(s))
    config = tuned_configs(case.spec, "sm90").get(f"n_cols={n},dres=False") \
        or case.spec.rule(n, False)
    (config, ms, why), = tune.measure(case, shape, [config], "cuda", tune.do_bench_median,
                                      torch.bfloat16)
    return ms, config.tag, why


def variants(smoke, sms):
    if smoke:
        yield dict(dot_block=64, block_m=1, block_n=32, warps=1, groups=3, stages=1)
        yield dict(dot_block=64, block_m=2, block_n=64, warps=2, groups=2, stages=3)
        return
    for dot_block in (8192,):
        for block_m, block_n, warps in ((1, 2048, 8), (2, 1024, 8), (1, 4096, 16),
                                        (2, 2048, 16), (4, 1024, 16)):
            for per_sm in (2, 4):
                for stages in (1, 3):
                    yield dict(dot_block=dot_block, block_m=block_m, block_n=block_n,
                               warps=warps, groups=per_sm * sms, stages=stages)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", default="32768,65536", help="row lengths; rows = 2^26 / n")
    p.add_argument("--out", help="folder for norm_bwd_split.csv")
    p.add_argument("--smoke", action="store_true",
                   help="CPU, Triton's interpreter, tiny shapes: checks only, no timings")
    args = p.parse_args()
    torch.manual_seed(0)
    device = "cpu" if args.smoke else "cuda"
    shapes = [(7, 200)] if args.smoke else [(2**26 // n, n) for n in map(int, args.ns.split(","))]
    copy_tbps = float("nan") if args.smoke else copy_bandwidth() / 1e12
    sms = 0 if args.smoke else torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy {copy_tbps:.2f} TB/s; % of copy counts 6 bytes a column (x, dy read, dx written)")
    rows = []
    for n_rows, n_cols in shapes:
        x, dy, w, rstd, error = rms_norm_backward_case(n_rows, n_cols, device)
        floor_ms = 6 * n_rows * n_cols / copy_tbps / 1e9
        if not args.smoke:
            ms, tag, why = library_ms(n_cols)
            print(f"{n_rows}x{n_cols} library {tag}: "
                  + (f"{ms:.4f} ms {floor_ms / ms:.0%}" if ms else f"failed: {why}"), flush=True)
            rows.append(dict(shape=f"{n_rows}x{n_cols}", kernel="library", config=tag, ms=ms,
                             err=""))
        for cfg in variants(args.smoke, sms):
            dx, dw, run = split_backward(x, dy, w, rstd, **cfg)
            err = error(dx, dw)
            ms = float("nan") if args.smoke else triton.testing.do_bench(run, return_mode="median")
            desc = " ".join(f"{k}={v}" for k, v in cfg.items())
            print(f"{n_rows}x{n_cols} split {desc:<72} {ms:7.4f} ms {floor_ms / ms:5.0%} "
                  f"err {err:.1e}" + ("  WRONG" if err > 2e-2 else ""), flush=True)
            rows.append(dict(shape=f"{n_rows}x{n_cols}", kernel="split", config=desc, ms=ms,
                             err=err))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "norm_bwd_split.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
