"""Experiment (session 4): does the grid order matter for SwiGLU? The kernel's 2-D grid puts
rows on axis 0, so consecutive programs walk down a column block; a 1-D grid with the
column block fastest walks memory in order (as torch.compile's flat kernels do). SwiGLU
forward and backward at 8192 x 14336 and 8192 x 4096 bf16, each kernel alone (do_bench,
L2 flushed), % of the copy bandwidth. JIT; needs a CUDA GPU.

  python benchmarks/experiment_glu_grid.py
"""
import argparse

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FLAT: tl.constexpr):
    if FLAT:
        col_blocks = tl.cdiv(n_cols, BLOCK_N)
        pid = tl.program_id(0)
        rb = pid // col_blocks
        cb = pid - rb * col_blocks
    else:
        rb = tl.program_id(0)
        cb = tl.program_id(1)
    rows = rb.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = cb * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return rows[:, None], cols[None, :], mask


@triton.jit
def fwd(C, A, B, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FLAT: tl.constexpr):
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N, FLAT)
    a = tl.load(A + rows * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + rows * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(C + rows * n_cols + cols, (a * tl.sigmoid(a) * b).to(C.dtype.element_ty), mask=mask)


@triton.jit
def bwd(DA, DB, DC, A, B, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        FLAT: tl.constexpr):
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N, FLAT)
    off = rows * n_cols + cols
    dc = tl.load(DC + off, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + off, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + off, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    f = a * sig
    tl.store(DA + off, (dc * b * sig * (1.0 + a * (1.0 - sig))).to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + off, (dc * f).to(DB.dtype.element_ty), mask=mask)


def main():
    dev = "cuda"
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_gbps = 2 * src.numel() / do_bench(lambda: dst.copy_(src), warmup=25, rep=200) / 1e6
    print(f"copy: {copy_gbps:.0f} GB/s")
    for m, n in ((8192, 14336), (8192, 4096), (16384, 4864)):
        a, b, dc = (torch.randn(m, n, device=dev, dtype=torch.bfloat16) for _ in range(3))
        c, da, db = (torch.empty_like(a) for _ in range(3))
        for block_m, block_n, warps in ((1, 2048, 4), (1, 4096, 8), (1, 1024, 4), (2, 2048, 8)):
            cells = []
            for flat in (False, True):
                col_blocks, row_blocks = triton.cdiv(n, block_n), triton.cdiv(m, block_m)
                grid = (row_blocks * col_blocks,) if flat else (row_blocks, col_blocks)
                f = lambda: fwd[grid](c, a, b, m, n, BLOCK_M=block_m, BLOCK_N=block_n, FLAT=flat,
                                      num_warps=warps)
                g = lambda: bwd[grid](da, db, dc, a, b, m, n, BLOCK_M=block_m, BLOCK_N=block_n,
                                      FLAT=flat, num_warps=warps)
                f(); g()
                af = a.float()
                assert torch.allclose(c.float(), af * torch.sigmoid(af) * b.float(),
                                      rtol=2e-2, atol=2e-2)
                tf, tb = do_bench(f, warmup=25, rep=100), do_bench(g, warmup=25, rep=100)
                pf = 3 * a.numel() * 2 / tf / 1e6 / copy_gbps * 100
                pb = 5 * a.numel() * 2 / tb / 1e6 / copy_gbps * 100
                cells.append(f"{'flat' if flat else '2-D '} fwd {tf*1000:7.1f} us {pf:5.1f}%  "
                             f"bwd {tb*1000:7.1f} us {pb:5.1f}%")
            print(f"{m}x{n} [{block_m}x{block_n}] w{warps}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
