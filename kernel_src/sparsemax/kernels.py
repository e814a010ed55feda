"""Sparsemax over the last dim (Martins & Astudillo 2016), forward and backward, no sort.

    forward   y = max(x - tau, 0),  tau the root of  g(tau) = sum(max(x - tau, 0)) - 1
    backward  dx = s * (dy - sum(dy * s) / sum(s)),  s = [y > 0] (the support)

g is decreasing and g(max - 1) >= 0 > g(max), so tau lies in [max - 1, max). All of it runs
on x - max (exact near the max), so y = x - tau keeps its digits when x and tau are large and
close (a wide support). The forward
  1. bisects that interval n_bisect times, keeping lo <= tau (g(lo) >= 0);
  2. refines from lo with Michelot's fixed point, tau <- (sum_{x > tau} x - 1) / #{x > tau},
     which rises monotonically to tau and stops when the support stops shrinking (tau is
     clamped to never decrease, so rounding cannot make it cycle; usually 1-2 steps after
     the bisection; the loop runs until every row of the tile has converged);
  3. takes tau = (sum_S x - 1) / |S| on the final support S: the exact threshold.
Rows are (n_rows, n_cols) with a contiguous last dim and their own row strides. Whole-row
configs (LOOP=False) hold BLOCK_M rows in registers; the looped config (LOOP=True, one row per
program) makes each step a pass over the row in BLOCK_N chunks. Masked lanes load -inf, which
is never in the support; -inf entries give 0; a row holding NaN or +inf gives NaN (as a
sort-based reference would). Arithmetic in fp32, cast at the store.
"""
import triton
import triton.language as tl


@triton.jit
def _row_tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return rows[:, None], cols[None, :], mask


@triton.jit
def _excess(x_row, n_cols, top, t, BLOCK_N: tl.constexpr):
    """sum(max((x - top) - t, 0)) over one row, in BLOCK_N chunks."""
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK_N):
        c = c0 + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + c, mask=c < n_cols, other=float("-inf")).to(tl.float32)
        acc += tl.maximum((x - top) - t, 0.0)
    return tl.sum(acc, axis=0)


@triton.jit
def _support(x_row, n_cols, top, t, BLOCK_N: tl.constexpr):
    """(#{x - top > t}, sum of those x - top) over one row, in BLOCK_N chunks."""
    cnt = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK_N):
        c = c0 + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + c, mask=c < n_cols, other=float("-inf")).to(tl.float32) - top
        inside = x > t
        cnt += inside.to(tl.float32)
        acc += tl.where(inside, x, 0.0)
    return tl.sum(cnt, axis=0), tl.sum(acc, axis=0)


@triton.jit
def sparsemax_fwd(Y, X, n_rows, n_cols, stride_y, stride_x, n_bisect,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr):
    if not LOOP:
        rows, cols, mask = _row_tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
        x = tl.load(X + rows * stride_x + cols, mask=mask, other=float("-inf")).to(tl.float32)
        top = tl.max(x, axis=1)
        top = tl.where(top == float("-inf"), 0.0, top)  # rows past n_rows
        x = x - top[:, None]  # shifted: the row max is 0
        lo = tl.full([BLOCK_M], -1.0, tl.float32)
        hi = tl.zeros([BLOCK_M], dtype=tl.float32)
        for _ in range(0, n_bisect):
            mid = 0.5 * (lo + hi)
            ge = tl.sum(tl.maximum(x - mid[:, None], 0.0), axis=1) >= 1.0
            lo = tl.where(ge, mid, lo)
            hi = tl.where(ge, hi, mid)
        tau = lo
        k = tl.sum((x > tau[:, None]).to(tl.float32), axis=1)
        # The loop condition is a carried scalar: a reduction inside the condition region
        # of the while loop crashes Triton 3.6's layout pass.
        go = tl.sum(k, axis=0) >= 0.0
        while go:
            s = tl.sum(tl.where(x > tau[:, None], x, 0.0), axis=1)
            tau = tl.maximum(tau, (s - 1.0) / tl.maximum(k, 1.0))
            k_new = tl.sum((x > tau[:, None]).to(tl.float32), axis=1)
            go = tl.sum((k_new != k).to(tl.int32), axis=0) > 0
            k = k_new
        s = tl.sum(tl.where(x > tau[:, None], x, 0.0), axis=1)
        tau = (s - 1.0) / tl.maximum(k, 1.0)
        y = tl.maximum(x - tau[:, None], 0.0)
        bad = tl.sum(((x != x) | (x == float("inf"))).to(tl.int32), axis=1) > 0
        y = tl.where(bad[:, None], float("nan"), y)
        tl.store(Y + rows * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    else:
        row = tl.program_id(0).to(tl.int64)
        x_row = X + row * stride_x
        top_acc = tl.full([BLOCK_N], float("-inf"), tl.float32)
        n_bad = tl.zeros([BLOCK_N], dtype=tl.int32)
        for c0 in range(0, n_cols, BLOCK_N):
            c = c0 + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + c, mask=c < n_cols, other=float("-inf")).to(tl.float32)
            top_acc = tl.maximum(top_acc, x)
            n_bad += ((x != x) | (x == float("inf"))).to(tl.int32)
        top = tl.max(top_acc, axis=0)
        top = tl.where(top == float("-inf"), 0.0, top)
        lo = top * 0.0 - 1.0  # thresholds are relative to the row max
        hi = top * 0.0
        for _ in range(0, n_bisect):
            mid = 0.5 * (lo + hi)
            ge = _excess(x_row, n_cols, top, mid, BLOCK_N) >= 1.0
            lo = tl.where(ge, mid, lo)
            hi = tl.where(ge, hi, mid)
        tau = lo
        k, s = _support(x_row, n_cols, top, tau, BLOCK_N)
        k_prev = k + 1.0
        while k != k_prev:
            k_prev = k
            tau = tl.maximum(tau, (s - 1.0) / tl.maximum(k, 1.0))
            k, s = _support(x_row, n_cols, top, tau, BLOCK_N)
        tau = (s - 1.0) / tl.maximum(k, 1.0)
        tau = tl.where(tl.sum(n_bad, axis=0) > 0, float("nan"), tau)
        y_row = Y + row * stride_y
        for c0 in range(0, n_cols, BLOCK_N):
            c = c0 + tl.arange(0, BLOCK_N)
            cm = c < n_cols
            x = tl.load(x_row + c, mask=cm, other=0.0).to(tl.float32) - top
            y = tl.where(tau != tau, float("nan"), tl.maximum(x - tau, 0.0))
            tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=cm)


@triton.jit
def sparsemax_bwd(DX, DY, Y, n_rows, n_cols, stride_dx, stride_dy, stride_y,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr):
    if not LOOP:
        rows, cols, mask = _row_tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
        y = tl.load(Y + rows * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        inside = y > 0.0
        k = tl.maximum(tl.sum(inside.to(tl.float32), axis=1), 1.0)
        v = tl.sum(tl.where(inside, dy, 0.0), axis=1) / k
        dx = tl.where(inside, dy - v[:, None], 0.0)
        tl.store(DX + rows * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    else:
        row = tl.program_id(0).to(tl.int64)
        y_row = Y + row * stride_y
        dy_row = DY + row * stride_dy
        cnt = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c0 in range(0, n_cols, BLOCK_N):
            c = c0 + tl.arange(0, BLOCK_N)
            cm = c < n_cols
            y = tl.load(y_row + c, mask=cm, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + c, mask=cm, other=0.0).to(tl.float32)
            inside = y > 0.0
            cnt += inside.to(tl.float32)
            acc += tl.where(inside, dy, 0.0)
        v = tl.sum(acc, axis=0) / tl.maximum(tl.sum(cnt, axis=0), 1.0)
        dx_row = DX + row * stride_dx
        for c0 in range(0, n_cols, BLOCK_N):
            c = c0 + tl.arange(0, BLOCK_N)
            cm = c < n_cols
            y = tl.load(y_row + c, mask=cm, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + c, mask=cm, other=0.0).to(tl.float32)
            tl.store(dx_row + c, tl.where(y > 0.0, dy - v, 0.0).to(DX.dtype.element_ty),
                     mask=cm)
