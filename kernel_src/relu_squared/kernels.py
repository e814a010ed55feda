"""ReLU squared, elementwise over a flat contiguous tensor of n elements.

    forward   y = r^2,          r = relu(x)
    backward  dx = 2 r dy

relu is written as where(x < 0, 0, x) so NaN propagates as in PyTorch. Each program handles
BLOCK consecutive elements (int64 offsets: n may exceed 2^31). Arithmetic in fp32, cast at
the store.
"""
import triton
import triton.language as tl


@triton.jit
def relu_squared_fwd(Y, X, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.where(x < 0.0, 0.0, x)
    tl.store(Y + offs, (r * r).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def relu_squared_bwd(DX, DY, X, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.where(x < 0.0, 0.0, x)
    tl.store(DX + offs, (2.0 * r * dy).to(DX.dtype.element_ty), mask=mask)
