"""Softmax over the last dim, forward and backward.

    forward   y = exp(x - m) / s,   m = max(x),  s = sum(exp(x - m))
    backward  dx = y * (dy - sum(dy * y))

Rows are (n_rows, n_cols) with a contiguous last dim and their own row strides.

Whole-row configs (LOOP=False): a program holds BLOCK_M rows of up to BLOCK_N columns in
registers: one read, one write. The row/chunk arguments are unused.

Looped configs (LOOP=True), rows longer than the largest whole-row block: the grid is
(n_rows, n_chunks) and program (r, c) owns columns [c * chunk_cols, (c + 1) * chunk_cols) of
row r, walked in BLOCK_N steps. `phase` (runtime, uniform across the grid) says what it does:
    2  n_chunks == 1: statistics of the row, then the output (second read mostly from L2)
    0  statistics of its chunk only, to STATS[r, c]
    1  combine the row's n_chunks statistics (at most 64), then the output of its chunk
Phases 0 and 1 are two launches that split a long row over many programs when there are too
few rows to fill the GPU. Forward statistics are an online (max, sum) pair per lane: a new
larger value rescales the lane's sum, so each element costs one exp. Backward statistics are
partial sums of dy * y.

PyTorch semantics at the edges: a row holding NaN or +inf gives NaN, -inf entries give 0, a row
of only -inf gives NaN. Arithmetic in fp32, cast at the store.
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
def _chunk(n_cols, chunk_cols):
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1).to(tl.int64) * chunk_cols
    end = tl.minimum(start + chunk_cols, n_cols)
    return row, start, end


@triton.jit
def _chunk_max_sum(x_row, start, end, chunk_cols, BLOCK_N: tl.constexpr):
    """(max, sum of exp(x - max)) over columns [start, end), one online pair per lane. The
    lane maxima start at the lowest finite float, so -inf entries never meet -inf - -inf."""
    m = tl.full([BLOCK_N], -3.4028234663852886e38, tl.float32)
    s = tl.zeros([BLOCK_N], dtype=tl.float32)
    for off in range(0, chunk_cols, BLOCK_N):
        cols = start + off + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < end, other=float("-inf")).to(tl.float32)
        gt = x > m
        e = tl.exp(tl.where(gt, m - x, x - m))
        s = tl.where(gt, s * e + 1.0, s + e)
        m = tl.where(gt, x, m)
    row_max = tl.max(m, axis=0)
    safe = tl.where(row_max == float("-inf"), 0.0, row_max)
    return row_max, tl.sum(s * tl.exp(m - safe), axis=0)


@triton.jit
def softmax_fwd(Y, X, STATS, n_rows, n_cols, stride_y, stride_x, chunk_cols, n_chunks, phase,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr):
    if not LOOP:
        rows, cols, mask = _row_tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
        x = tl.load(X + rows * stride_x + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=1)
        m = tl.where(m == float("-inf"), 0.0, m)
        e = tl.exp(x - m[:, None])
        s = tl.sum(e, axis=1)
        s = tl.where(tl.sum(mask.to(tl.int32), axis=1) > 0, s, 1.0)  # rows past n_rows
        y = e * (1.0 / s)[:, None]
        tl.store(Y + rows * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    else:
        row, start, end = _chunk(n_cols, chunk_cols)
        x_row = X + row * stride_x
        stats = STATS + (row * n_chunks + tl.program_id(1)) * 2
        if phase == 1:
            j = tl.arange(0, 64)
            jm = j < n_chunks
            row_stats = STATS + row * n_chunks * 2 + j * 2
            mj = tl.load(row_stats, mask=jm, other=float("-inf"))
            sj = tl.load(row_stats + 1, mask=jm, other=0.0)
            m = tl.max(mj, axis=0)
            safe = tl.where(m == float("-inf"), 0.0, m)
            s = tl.sum(tl.where(jm, sj * tl.exp(mj - safe), 0.0), axis=0)
        else:
            m, s = _chunk_max_sum(x_row, start, end, chunk_cols, BLOCK_N)
        if phase == 0:
            tl.store(stats, m)
            tl.store(stats + 1, s)
        else:
            m = tl.where(m == float("-inf"), 0.0, m)
            inv = 1.0 / s
            y_row = Y + row * stride_y
            for off in range(0, chunk_cols, BLOCK_N):
                cols = start + off + tl.arange(0, BLOCK_N)
                cm = cols < end
                x = tl.load(x_row + cols, mask=cm, other=0.0).to(tl.float32)
                tl.store(y_row + cols, (tl.exp(x - m) * inv).to(Y.dtype.element_ty), mask=cm)


@triton.jit
def softmax_bwd(DX, DY, Y, STATS, n_rows, n_cols, stride_dx, stride_dy, stride_y, chunk_cols,
                n_chunks, phase,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr):
    if not LOOP:
        rows, cols, mask = _row_tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
        y = tl.load(Y + rows * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        dot = tl.sum(dy * y, axis=1)
        dx = y * (dy - dot[:, None])
        tl.store(DX + rows * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    else:
        row, start, end = _chunk(n_cols, chunk_cols)
        y_row = Y + row * stride_y
        dy_row = DY + row * stride_dy
        if phase == 1:
            j = tl.arange(0, 64)
            dot = tl.sum(tl.load(STATS + row * n_chunks + j, mask=j < n_chunks, other=0.0),
                         axis=0)
        else:
            acc = tl.zeros([BLOCK_N], dtype=tl.float32)
            for off in range(0, chunk_cols, BLOCK_N):
                cols = start + off + tl.arange(0, BLOCK_N)
                cm = cols < end
                y = tl.load(y_row + cols, mask=cm, other=0.0).to(tl.float32)
                dy = tl.load(dy_row + cols, mask=cm, other=0.0).to(tl.float32)
                acc += dy * y
            dot = tl.sum(acc, axis=0)
        if phase == 0:
            tl.store(STATS + row * n_chunks + tl.program_id(1), dot)
        else:
            dx_row = DX + row * stride_dx
            for off in range(0, chunk_cols, BLOCK_N):
                cols = start + off + tl.arange(0, BLOCK_N)
                cm = cols < end
                y = tl.load(y_row + cols, mask=cm, other=0.0).to(tl.float32)
                dy = tl.load(dy_row + cols, mask=cm, other=0.0).to(tl.float32)
                tl.store(dx_row + cols, (y * (dy - dot)).to(DX.dtype.element_ty), mask=cm)
