"""Experiment (session 4): which part of liger-aot's RMSNorm forward costs bandwidth? A
minimal one-program-per-row forward reached 90-92% of copy at 1K-16K columns where the
library's kernel reads 84-89% (benchmarks/experiment_norm_hints.py, kernels suite). This
adds the library kernel's features one at a time (constexpr switches), each kernel alone
(do_bench, L2 flushed), M*N = 64M bf16, whole rows on the sm90 tuned table's warps. JIT;
needs a CUDA GPU.

  python benchmarks/experiment_norm_forward.py
"""
import argparse

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def fwd(Y, X, W, RSTD, R, n_rows, n_cols, stride_y, stride_x, eps, has_residual,
        BLOCK_N: tl.constexpr, STORE_RSTD: tl.constexpr, BLOCK_LOOP: tl.constexpr,
        RES_BRANCH: tl.constexpr, INT64_ROWS: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    if BLOCK_LOOP:
        start, step = tl.program_id(0), tl.num_programs(0)
    else:
        start, step = tl.program_id(0), n_rows + 1  # one iteration
    for row in tl.range(start, n_rows, step):
        if INT64_ROWS:  # the library's [BLOCK_M=1, BLOCK_N] tile with int64 row vectors
            rows = tl.arange(0, 1).to(tl.int64) + row
            c = cols[None, :]
            m = (rows < n_rows)[:, None] & (c < n_cols)
            x_ptrs = X + rows[:, None] * stride_x + c
            r_ptrs = R + rows[:, None] * stride_x + c
            y_ptrs = Y + rows[:, None] * stride_y + c
            w_ptrs, w_mask = W + c, c < n_cols
        else:
            m = cols < n_cols
            x_ptrs = X + row * stride_x + cols
            r_ptrs = R + row * stride_x + cols
            y_ptrs = Y + row * stride_y + cols
            w_ptrs, w_mask = W + cols, cols < n_cols
        x = tl.load(x_ptrs, mask=m, other=0.0)
        if RES_BRANCH:
            if has_residual != 0:
                r = tl.load(r_ptrs, mask=m, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=-1, keep_dims=True) / n_cols + eps)
        w = tl.load(w_ptrs, mask=w_mask, other=0.0)
        y = (xf * rstd).to(tl.bfloat16).to(tl.float32) * w.to(tl.float32)
        tl.store(y_ptrs, y.to(tl.bfloat16), mask=m)
        if STORE_RSTD:
            tl.store(RSTD + row + tl.arange(0, 1), tl.reshape(rstd, [1]))


STEPS = [  # cumulative: name, switches
    ("minimal", dict(STORE_RSTD=False, BLOCK_LOOP=False, RES_BRANCH=False, INT64_ROWS=False)),
    ("+ rstd store", dict(STORE_RSTD=True, BLOCK_LOOP=False, RES_BRANCH=False, INT64_ROWS=False)),
    ("+ 2-D int64 rows",
     dict(STORE_RSTD=True, BLOCK_LOOP=False, RES_BRANCH=False, INT64_ROWS=True)),
    ("+ residual branch",
     dict(STORE_RSTD=True, BLOCK_LOOP=False, RES_BRANCH=True, INT64_ROWS=True)),
    ("+ row-block loop", dict(STORE_RSTD=True, BLOCK_LOOP=True, RES_BRANCH=True, INT64_ROWS=True)),
]
WARPS = {1024: 4, 2048: 4, 4096: 8, 8192: 16, 16384: 16, 32768: 32}


def main():
    dev = "cuda"
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_gbps = 2 * src.numel() / do_bench(lambda: dst.copy_(src), warmup=25, rep=200) / 1e6
    print(f"copy: {copy_gbps:.0f} GB/s")
    print(f"{'N':>6} {'w':>3}  " + "  ".join(f"{n:>22}" for n, _ in STEPS))
    for n, warps in WARPS.items():
        m = (1 << 26) // n
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        rstd = torch.empty(m, device=dev, dtype=torch.float32)
        xf = x.float()
        ref = ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
               .float() * w.float())
        cells = []
        for name, sw in STEPS:
            call = lambda: fwd[(m,)](y, x, w, rstd, x, m, n, n, n, 1e-6, 0, BLOCK_N=n,
                                    num_warps=warps, **sw)
            y.zero_()
            call()
            err = float((y.float() - ref).norm() / ref.norm())
            assert err < 1e-2, (n, name, err)
            ms = do_bench(call, warmup=25, rep=100)
            pct = 2 * x.numel() * 2 / ms / 1e6 / copy_gbps * 100
            cells.append(f"{ms * 1000:>8.1f} us {pct:>5.1f}%".rjust(22))
        print(f"{n:>6} {warps:>3}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
