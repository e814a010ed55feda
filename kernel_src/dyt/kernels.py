"""DyT (dynamic tanh): y = gamma * tanh(alpha * x) + beta, forward and backward.

alpha is one element, gamma and beta have one element per column (beta is a runtime flag).
Tensors are viewed as (n_rows, n_cols) with a contiguous last dim and their own row strides;
the grid is 2-D: axis 0 over row blocks (forward) or persistent row ranges (backward), axis 1
over BLOCK_N column blocks, so rows of any length need no loop.

Backward, t = tanh(alpha * x), dt = dy * gamma * (1 - t^2):
    dx = alpha * dt,  dgamma = sum over rows of dy * t,  dbeta = sum over rows of dy,
    dalpha = sum of dt * x
Program (pid, cb) owns rows_per_program rows of column block cb and writes fp32 partials:
DGAMMA_PARTIAL[pid, cols], DBETA_PARTIAL[pid, cols] and DALPHA_PARTIAL[pid, cb]; the host
sums them.

tanh: triton.language has no tanh on every target, so it is computed here: an odd Taylor
polynomial (through z^9, error < 1e-8 relative) for |z| < 0.25, where (1 - e)/(1 + e) with
e = exp(-2|z|) would lose digits, and that formula beyond (e <= 0.61, no cancellation).
"""
import triton
import triton.language as tl


@triton.jit
def _tanh(z):
    a = tl.abs(z)
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    z2 = z * z
    small = a * (1.0 + z2 * (-0.3333333333333333 + z2 * (0.13333333333333333
                 + z2 * (-0.05396825396825397 + z2 * 0.021869488536155203))))
    t = tl.where(a < 0.25, small, big)
    return tl.where(z < 0.0, -t, t)


@triton.jit
def dyt_fwd(Y, X, ALPHA, GAMMA, BETA, n_rows, n_cols, stride_y, stride_x, has_beta,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    alpha = tl.load(ALPHA).to(tl.float32)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0
                ).to(tl.float32)
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = gamma[None, :] * _tanh(alpha * x)
    if has_beta != 0:
        y += tl.load(BETA + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def dyt_bwd(DX, DGAMMA_PARTIAL, DBETA_PARTIAL, DALPHA_PARTIAL, DY, X, ALPHA, GAMMA,
            n_rows, n_cols, stride_dx, stride_dy, stride_x, rows_per_program,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cb = tl.program_id(1)
    cols = cb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    first = pid.to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    alpha = tl.load(ALPHA).to(tl.float32)
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(0, rows_per_program, BLOCK_M):
        rows = first + step + tl.arange(0, BLOCK_M)
        mask = (rows < last)[:, None] & col_mask[None, :]
        c = cols[None, :]
        x = tl.load(X + rows[:, None] * stride_x + c, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + c, mask=mask, other=0.0).to(tl.float32)
        t = _tanh(alpha * x)
        dt = dy * gamma * (1.0 - t * t)
        tl.store(DX + rows[:, None] * stride_dx + c, (alpha * dt).to(DX.dtype.element_ty),
                 mask=mask)
        acc_g += dy * t
        acc_b += dy
        acc_a += dt * x
    out = pid.to(tl.int64) * n_cols + cols
    tl.store(DGAMMA_PARTIAL + out, tl.sum(acc_g, axis=0), mask=col_mask)
    tl.store(DBETA_PARTIAL + out, tl.sum(acc_b, axis=0), mask=col_mask)
    tl.store(DALPHA_PARTIAL + pid.to(tl.int64) * tl.num_programs(1) + cb,
             tl.sum(tl.sum(acc_a, axis=1), axis=0))
