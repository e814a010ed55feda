"""Experiment (session 4): do cache hints lift the RMSNorm forward? Times a minimal RMSNorm
forward (one program per row, llama casting) with and without eviction / store hints, each
kernel alone (triton.testing.do_bench, L2 flushed), against the copy bandwidth, for N = 1K..64K
at M*N = 64M bf16. JIT (this is an experiment, not the library's path); needs a CUDA GPU.

  python benchmarks/experiment_norm_hints.py
"""
import argparse

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def fwd(Y, X, W, n_cols, eps, BLOCK_N: tl.constexpr, LOOP: tl.constexpr,
        XE1: tl.constexpr, XE2: tl.constexpr, YC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    x_row = X + row * n_cols
    y_row = Y + row * n_cols
    if not LOOP:
        m = cols < n_cols
        xf = tl.load(x_row + cols, mask=m, other=0.0, eviction_policy=XE1).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
        w = tl.load(W + cols, mask=m, other=0.0, eviction_policy="evict_last")
        y = (xf * rstd).to(tl.bfloat16).to(tl.float32) * w.to(tl.float32)
        tl.store(y_row + cols, y.to(tl.bfloat16), mask=m, cache_modifier=YC)
    else:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for s in tl.range(0, n_cols, BLOCK_N):
            c = s + cols
            xf = tl.load(x_row + c, mask=c < n_cols, other=0.0, eviction_policy=XE1).to(tl.float32)
            acc += xf * xf
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for s in tl.range(0, n_cols, BLOCK_N):
            c = s + cols
            m = c < n_cols
            xf = tl.load(x_row + c, mask=m, other=0.0, eviction_policy=XE2).to(tl.float32)
            w = tl.load(W + c, mask=m, other=0.0, eviction_policy="evict_last")
            y = (xf * rstd).to(tl.bfloat16).to(tl.float32) * w.to(tl.float32)
            tl.store(y_row + c, y.to(tl.bfloat16), mask=m, cache_modifier=YC)


VARIANTS = {  # name: (XE1, XE2, YC)
    "plain": ("", "", ""),
    "x evict_first": ("evict_first", "evict_first", ""),
    "x evict_first, y .cs": ("evict_first", "evict_first", ".cs"),
    "loop: evict_last then first, y .cs": ("evict_last", "evict_first", ".cs"),
}
CONFIGS = {  # N: list of (BLOCK_N, LOOP, warps)
    1024: [(1024, False, 4)], 2048: [(2048, False, 4)], 4096: [(4096, False, 8), (4096, False, 4)],
    8192: [(8192, False, 16), (8192, False, 8)], 16384: [(16384, False, 16), (16384, False, 32)],
    32768: [(32768, False, 32), (8192, True, 8)],
    65536: [(16384, True, 16), (8192, True, 8), (8192, True, 16), (4096, True, 8)],
}


def main():
    dev = "cuda"
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200)
    copy_gbps = 2 * src.numel() / copy_ms / 1e6
    print(f"copy: {copy_gbps:.0f} GB/s")
    print(f"{'N':>6} {'BLOCK_N':>7} {'loop':>5} {'w':>3}  "
          + "  ".join(f"{v:>34}" for v in VARIANTS))
    for n, configs in CONFIGS.items():
        m = (1 << 26) // n
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        xf = x.float()
        ref = ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
               .float() * w.float())
        for block_n, loop, warps in configs:
            cells = []
            for name, (e1, e2, yc) in VARIANTS.items():
                if name.startswith("loop") and not loop:
                    cells.append(f"{'-':>34}")
                    continue
                call = lambda: fwd[(m,)](y, x, w, n, 1e-6, BLOCK_N=block_n, LOOP=loop, XE1=e1,
                                        XE2=e2, YC=yc, num_warps=warps)
                call()
                err = (y.float() - ref).norm() / ref.norm()
                assert err < 1e-2, (n, name, float(err))
                ms = do_bench(call, warmup=25, rep=100)
                pct = 2 * x.numel() * 2 / ms / 1e6 / copy_gbps * 100
                cells.append(f"{ms * 1000:>9.1f} us {pct:>5.1f}%".rjust(34))
            print(f"{n:>6} {block_n:>7} {str(loop):>5} {warps:>3}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
