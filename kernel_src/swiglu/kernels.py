"""Gated activations c = act(a) * b, elementwise, forward and backward: SwiGLU and GeGLU.

`act` is a runtime flag, uniform across the grid (one scalar branch per tile, so GeGLU costs
no extra variants):
    0  SiLU:        f(a) = a * sig(a)
                    f'(a) = sig(a) * (1 + a * (1 - sig(a)))
    1  GELU, tanh approximation (Hugging Face gelu_pytorch_tanh):
                    u = sqrt(2/pi) * (a + 0.044715 a^3),  t = tanh(u)
                    f(a) = 0.5 a (1 + t)
                    f'(a) = 0.5 (1 + t) + 0.5 a (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 a^2)
The backward recomputes f and f' from a instead of storing f(a):
    da = dc * b * f'(a),  db = dc * f(a)
tanh(u) is written as 2 sig(2u) - 1 (portable across CUDA and HIP).

Tensors are viewed as (n_rows, n_cols) with a contiguous last dim and their own row strides.
The grid is 1-D over tiles of BLOCK_M rows x BLOCK_N columns, the column block fastest, so
consecutive programs walk memory in order: with rows on a grid axis of their own, programs
that run together touched one column block of many rows, and an H200 ran SwiGLU at 95% of
copy instead of 99% (docs/perf-notes.md). All arithmetic is fp32; results are cast to the
tensor dtype at the store.
"""
import triton
import triton.language as tl

@triton.jit
def _tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    col_blocks = tl.cdiv(n_cols, BLOCK_N)
    row_block = tl.program_id(0) // col_blocks
    col_block = tl.program_id(0) - row_block * col_blocks
    rows = row_block.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return rows[:, None], cols[None, :], mask


@triton.jit
def _gelu_tanh_t(a):
    """tanh(sqrt(2/pi) * (a + 0.044715 a^3)); |u| is clamped at 15, where tanh is already
    +-1 in fp32, so exp never overflows."""
    u = 0.7978845608028654 * (a + 0.044715 * a * a * a)
    u = tl.minimum(tl.maximum(u, -15.0), 15.0)
    return 2.0 * tl.sigmoid(2.0 * u) - 1.0


@triton.jit
def swiglu_fwd(C, A, B, n_rows, n_cols, stride_c, stride_a, stride_b, act,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    a = tl.load(A + rows * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + rows * stride_b + cols, mask=mask, other=0.0).to(tl.float32)
    if act == 1:
        f = 0.5 * a * (1.0 + _gelu_tanh_t(a))
    else:
        f = a * tl.sigmoid(a)
    tl.store(C + rows * stride_c + cols, (f * b).to(C.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd(DA, DB, DC, A, B, n_rows, n_cols, stride_da, stride_db, stride_dc,
               stride_a, stride_b, act, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    dc = tl.load(DC + rows * stride_dc + cols, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + rows * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + rows * stride_b + cols, mask=mask, other=0.0).to(tl.float32)
    if act == 1:
        t = _gelu_tanh_t(a)
        f = 0.5 * a * (1.0 + t)
        df = 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * 0.7978845608028654 * (
            1.0 + 3.0 * 0.044715 * a * a)
    else:
        sig = tl.sigmoid(a)
        f = a * sig
        df = sig * (1.0 + a * (1.0 - sig))
    tl.store(DA + rows * stride_da + cols, (dc * b * df).to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + rows * stride_db + cols, (dc * f).to(DB.dtype.element_ty), mask=mask)
