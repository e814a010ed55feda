"""Experiment (issue 5): explicit software pipelining of row loops with tl.range(num_stages=).

  python benchmarks/pipeline_experiment.py [--out DIR]

Kernel-level num_stages changed nothing for the cross-entropy loops (an earlier run of the
split-row kernel below with STAGES=1 and kernel-level num_stages 2 or 3, docs/results/
2026-11-30-ce-split-experiment-*-h200.txt): Triton pipelines by default only loads that feed
tl.dot. tl.range(..., num_stages=S) asks for
it on one loop, which keeps S iterations' loads in flight per program. Two places need that:
(a) cross-entropy with one row per SM (persistent split-row kernel): enough bytes in flight
for HBM, while the ~132 rows in flight fit L2 so pass 2 re-reads from L2;
(b) the RMSNorm backward's persistent row loop (each program walks its rows one at a time).
"""
import argparse
import csv
import os
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from _gpu import copy_bandwidth, cross_entropy_case, rms_norm_backward_case

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from liger_aot.ops._common import persistent_grid  # noqa: E402


@triton.jit
def ce_split_pipelined(LOSS, GRAD, LOGITS, TARGET, n_rows, n_cols, stride, scale,
                       TILE_ROWS: tl.constexpr, STAGES: tl.constexpr):
    LANE: tl.constexpr = 256
    CH: tl.constexpr = TILE_ROWS * LANE
    offs = tl.arange(0, TILE_ROWS)[:, None] * LANE + tl.arange(0, LANE)[None, :]
    for row in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        x_row = LOGITS + row * stride
        g_row = GRAD + row * stride
        target = tl.load(TARGET + row)
        m = tl.full([TILE_ROWS], float("-inf"), tl.float32)
        d = tl.zeros([TILE_ROWS, LANE], dtype=tl.float32)
        for start in tl.range(0, n_cols, CH, num_stages=STAGES):
            c = start + offs
            x = tl.load(x_row + c, mask=c < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            d = d * tl.exp(m - safe)[:, None] + tl.exp(x - safe[:, None])
            m = m_new
        big = tl.max(m, axis=0)
        total = tl.sum(tl.sum(d, axis=1) * tl.exp(tl.where(m == float("-inf"), big, m) - big)
                       * (m != float("-inf")), axis=0)
        lse = big + tl.log(total)
        tl.store(LOSS + row, lse - tl.load(x_row + target).to(tl.float32))
        for start in tl.range(0, n_cols, CH, num_stages=STAGES):
            c = start + offs
            mask = c < n_cols
            x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
            g = scale * (tl.exp(x - lse) - tl.where(c == target, 1.0, 0.0))
            tl.store(g_row + c, g.to(GRAD.dtype.element_ty), mask=mask)


@triton.jit
def ce_row_pipelined(LOSS, GRAD, LOGITS, TARGET, n_cols, stride, scale,
                     BLOCK: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = LOGITS + row * stride
    g_row = GRAD + row * stride
    target = tl.load(TARGET + row)
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    d = tl.zeros([BLOCK], dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        c = start + cols
        x = tl.load(x_row + c, mask=c < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        d = d * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
    lse = m + tl.log(tl.sum(d, axis=0))
    tl.store(LOSS + row, lse - tl.load(x_row + target).to(tl.float32))
    for start in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        c = start + cols
        mask = c < n_cols
        x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
        g = scale * (tl.exp(x - lse) - tl.where(c == target, 1.0, 0.0))
        tl.store(g_row + c, g.to(GRAD.dtype.element_ty), mask=mask)


@triton.jit
def rms_bwd_pipelined(DX, DW_PARTIAL, DY, X, W, RSTD, n_rows, n_cols, rows_per_program,
                      BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    first = pid.to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    col_mask = cols < n_cols
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for step in tl.range(0, rows_per_program, num_stages=STAGES):
        row = first + step
        mask = col_mask & (row < last)
        x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
        dyf = tl.load(DY + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row, mask=row < last, other=0.0)
        xf = x.to(tl.float32)
        xhat = (xf * rstd).to(x.dtype).to(tl.float32)
        dyw = dyf * w
        dot = tl.sum(dyw * xf, axis=0) / n_cols
        dx = rstd * (dyw - xf * rstd * rstd * dot)
        tl.store(DX + row * n_cols + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dyf * xhat
    tl.store(DW_PARTIAL + pid.to(tl.int64) * n_cols + cols, dw, mask=col_mask)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    copy_bw = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []

    def record(name, shape, cfg, run, check, nbytes):
        try:
            run()
            err = check()
            if not err < 2e-2:
                raise AssertionError(f"rel err {err:.1e}")
            ms = do_bench(run, return_mode="median")
            note = ""
        except Exception as e:
            ms, note = float("nan"), f"{type(e).__name__}: {str(e)[:80]}"
        rate = nbytes / (ms * 1e-3) / copy_bw
        print(f"{name} {shape} {cfg}: {ms:.4f} ms {rate:5.0%} {note}", flush=True)
        rows.append((name, shape, cfg, ms, rate, note))

    n_rows, V = 8192, 128256
    logits, target, ce_error = cross_entropy_case(n_rows, V)
    grad = torch.empty_like(logits)
    loss = torch.empty(n_rows, device="cuda")

    def ce_check():
        return ce_error(loss, grad)

    for tile, warps, per_sm in ((64, 16, 1), (32, 8, 1), (32, 8, 2), (16, 4, 2), (16, 4, 4)):
        for stages in (1, 2, 3, 4):
            grid = (min(n_rows, per_sm * sms),)
            record("ce_split", f"{n_rows}x{V}", f"tile {tile} w{warps} {per_sm}/SM s{stages}",
                   lambda: ce_split_pipelined[grid](loss, grad, logits, target, n_rows, V, V,
                                                    1.0 / n_rows, TILE_ROWS=tile,
                                                    STAGES=stages, num_warps=warps),
                   ce_check, 2 * n_rows * V * 2)
    for block, warps in ((512, 1), (2048, 4), (4096, 8)):
        for stages in (1, 2, 3):
            record("ce_row", f"{n_rows}x{V}", f"BLOCK {block} w{warps} s{stages}",
                   lambda: ce_row_pipelined[(n_rows,)](loss, grad, logits, target, V, V,
                                                       1.0 / n_rows, BLOCK=block,
                                                       STAGES=stages, num_warps=warps),
                   ce_check, 2 * n_rows * V * 2)
    del logits, grad
    torch.cuda.empty_cache()

    for M, N in ((16384, 4096), (8192, 8192), (65536, 1024), (4096, 16384)):
        x, dy, w, rstd, error = rms_norm_backward_case(M, N)
        dx = torch.empty_like(x)
        warps = 4 if N <= 2048 else (8 if N <= 4096 else 16)
        for per_sm in (1, 2, 4):
            programs, rpp = persistent_grid(M, 0, per_sm)
            partial = torch.empty(programs, N, device="cuda", dtype=torch.float32)
            result = {}

            def check():
                return error(dx, result["dw"])
            for stages in (1, 2, 3):
                def run():
                    rms_bwd_pipelined[(programs,)](dx, partial, dy, x, w, rstd, M, N, rpp,
                                                   BLOCK_N=N, STAGES=stages, num_warps=warps)
                    result["dw"] = partial.sum(0)
                record("rms_bwd", f"{M}x{N}", f"{per_sm}/SM w{warps} s{stages}", run, check,
                       3 * M * N * 2)
        del x, dy, dx
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "pipeline_experiment.csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["kernel", "shape", "config", "ms", "of_copy", "note"])
        wr.writerows(rows)


if __name__ == "__main__":
    main()
