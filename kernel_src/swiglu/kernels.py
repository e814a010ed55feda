"""SwiGLU: c = silu(a) * b, elementwise, forward and backward.

silu(a) = a * sig(a). The backward recomputes sig(a) from a instead of storing silu(a):
    da = dc * b * sig(a) * (1 + a * (1 - sig(a)))
    db = dc * silu(a)

Tensors are viewed as (n_rows, n_cols) with a contiguous last dim and their own row strides.
The grid is 2-D: axis 0 over blocks of BLOCK_M rows (the long axis: CUDA allows 2^31 - 1
programs there), axis 1 over blocks of BLOCK_N columns. All arithmetic is fp32; results are
cast to the tensor dtype at the store.
"""
import triton
import triton.language as tl


@triton.jit
def _tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return rows[:, None], cols[None, :], mask


@triton.jit
def swiglu_fwd(C, A, B, n_rows, n_cols, stride_c, stride_a, stride_b,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    a = tl.load(A + rows * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + rows * stride_b + cols, mask=mask, other=0.0).to(tl.float32)
    c = a * tl.sigmoid(a) * b
    tl.store(C + rows * stride_c + cols, c.to(C.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd(DA, DB, DC, A, B, n_rows, n_cols, stride_da, stride_db, stride_dc,
               stride_a, stride_b, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    dc = tl.load(DC + rows * stride_dc + cols, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + rows * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + rows * stride_b + cols, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    silu = a * sig
    da = dc * b * sig * (1.0 + a * (1.0 - sig))
    db = dc * silu
    tl.store(DA + rows * stride_da + cols, da.to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + rows * stride_db + cols, db.to(DB.dtype.element_ty), mask=mask)
