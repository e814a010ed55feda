"""KL divergence with the input in log-space, like torch.nn.functional.kl_div.

For input x (log q) and target t, elementwise:
    log_target=0:  loss = t * (log(max(t, eps)) - x)        dloss/dx = -t
    log_target=1:  loss = exp(t) * (t - x)                  dloss/dx = -exp(t)
The gradient does not depend on x, so the backward reads only the target (and grad_output).

Both kernels tile the (n_rows, n_cols) matrix in BLOCK_M x BLOCK_N tiles on a 2-D grid
(axis 0: row tiles, axis 1: column tiles), so the whole GPU is busy for any row count and a
vocab of 262144 is just more column tiles. Forward either stores the elementwise loss
(reduction "none") or one fp32 partial sum per tile, which the host side sums with torch
(no atomics, no host sync). Row offsets are int64. Arithmetic is fp32.
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
def kl_div_fwd(OUT, X, T, n_rows, n_cols, stride_out, stride_x, stride_t, eps, log_target,
               per_element, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT: (n_rows, n_cols) fp32 elementwise loss when per_element, else one fp32 partial
    sum per program at OUT[pid0 * num_programs(1) + pid1]."""
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    x = tl.load(X + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    t = tl.load(T + rows * stride_t + cols, mask=mask, other=0.0).to(tl.float32)
    if log_target != 0:
        loss = tl.exp(t) * (t - x)
    else:
        loss = t * (tl.log(tl.maximum(t, eps)) - x)
    if per_element != 0:
        tl.store(OUT + rows * stride_out + cols, loss, mask=mask)
    else:
        total = tl.sum(tl.sum(tl.where(mask, loss, 0.0), axis=1), axis=0)
        tile = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        tl.store(OUT + tile, total)


@triton.jit
def kl_div_bwd(DX, T, GO, n_rows, n_cols, stride_dx, stride_t, stride_go, scale, log_target,
               go_per_element, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx = -(t or exp(t)) * grad_output * scale; GO is fp32, one value (go_per_element=0)
    or an (n_rows, n_cols) matrix (reduction "none")."""
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    t = tl.load(T + rows * stride_t + cols, mask=mask, other=0.0).to(tl.float32)
    if log_target != 0:
        g = -tl.exp(t)
    else:
        g = -t
    if go_per_element != 0:
        go = tl.load(GO + rows * stride_go + cols, mask=mask, other=0.0)
    else:
        go = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32) + tl.load(GO)
    dx = g * (go * scale)
    tl.store(DX + rows * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
