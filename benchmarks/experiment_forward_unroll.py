"""Experiment (session 7): how many column blocks should the looped norm forward's first pass
load before it sums them? Inductor's RMSNorm forward (static shapes) unrolls that loop fully
(16 loads of 8 bytes a thread in flight at 32K columns) and read 90% of copy at 2048 x 32768
on an H200, against 80-81% for the library. A minimal looped RMSNorm forward (one program per
row, llama casting, the library's eviction hints) takes UNROLL blocks a step through
tl.static_range; each kernel is timed alone (triton.testing.do_bench median, L2 flushed)
against the copy bandwidth, at M*N = 64M bf16. JIT; needs a CUDA GPU.
Outcome (docs/results/2026-11-30-forward-unroll-session7-h200.txt): unrolling gained at most
a few percent; 32 warps (8192 columns, 8 a thread) did the work, 0.0707 ms at 2048 x 32768
against 0.0818 on 16 warps. The tuner now offers looped forwards on 32 warps.

  python benchmarks/experiment_forward_unroll.py
"""
import argparse

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from _gpu import copy_bandwidth


@triton.jit
def looped_rms_fwd(Y, X, W, n_cols, eps, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    x_row = X + row * n_cols
    y_row = Y + row * n_cols
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N * UNROLL):
        for u in tl.static_range(UNROLL):
            c = start + u * BLOCK_N + cols
            xf = tl.load(x_row + c, mask=c < n_cols, other=0.0,
                         eviction_policy="evict_last").to(tl.float32)
            acc += xf * xf
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in tl.range(0, n_cols, BLOCK_N):
        c = start + cols
        m = c < n_cols
        xf = tl.load(x_row + c, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(W + c, mask=m, other=0.0).to(tl.float32)
        y = (xf * rstd).to(Y.dtype.element_ty).to(tl.float32) * w
        tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=m)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", default="16384,32768,65536")
    args = p.parse_args()
    torch.manual_seed(0)
    copy_tbps = copy_bandwidth() / 1e12
    print(f"copy: {copy_tbps:.2f} TB/s")
    print(f"{'shape':>12} {'BLOCK_N':>7} {'warps':>5} {'UNROLL':>6} {'ms':>8} {'of copy':>7}")
    for n in map(int, args.ns.split(",")):
        m = 2**26 // n
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        xf = x.float()
        ref = ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w)
        for block_n, warps in ((2048, 16), (4096, 16), (8192, 16), (8192, 32)):
            for unroll in (1, 2, 4, 8, 16):
                if block_n * unroll > n:
                    continue

                def run():
                    looped_rms_fwd[(m,)](y, x, w, n, 1e-6, BLOCK_N=block_n, UNROLL=unroll,
                                         num_warps=warps)

                y.zero_()
                run()
                torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2)
                ms = do_bench(run, return_mode="median")
                pct = 2 * x.numel() * 2 / ms / 1e9 / copy_tbps
                print(f"{m}x{n:>6} {block_n:>7} {warps:>5} {unroll:>6} {ms:8.4f} {pct:7.0%}",
                      flush=True)


if __name__ == "__main__":
    main()
