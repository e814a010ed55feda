"""Total variation distance between two distributions given as probabilities.

Elementwise loss = 0.5 |p - q|, d loss / d p = 0.5 sign(p - q) (0 where p == q, NaN where
p - q is NaN, as PyTorch's abs backward). Rows whose label is ignore_index contribute 0 and
get a zero gradient (they are not even read).

Both kernels tile (n_rows, n_cols) in BLOCK_M x BLOCK_N tiles on a 2-D grid (axis 0: row
tiles, axis 1: column tiles). Forward stores the elementwise loss (reduction "none") or one
fp32 partial sum per tile, summed by the host side with torch. Backward writes
dp = 0.5 sign(p - q) * grad_output * scale / n_valid^divide, grad_output one value or a
matrix (reduction "none"), n_valid read from the device (count of labels != ignore_index) or
n_rows without labels. Row offsets are int64; arithmetic is fp32.
"""
import triton
import triton.language as tl


@triton.jit
def _tile(LABELS, n_rows, n_cols, ignore_index, has_label,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row and column offsets of this program's tile, the in-bounds mask and the mask of
    elements of rows that are not ignored."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in = rows < n_rows
    row_ok = row_in
    if has_label != 0:
        label = tl.load(LABELS + rows, mask=row_in, other=0)
        row_ok = row_in & (label != ignore_index)
    col_in = (cols < n_cols)[None, :]
    return rows[:, None], cols[None, :], row_in[:, None] & col_in, row_ok[:, None] & col_in


@triton.jit
def tvd_fwd(OUT, P, Q, LABELS, n_rows, n_cols, stride_out, stride_p, stride_q, ignore_index,
            has_label, per_element, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows, cols, in_bounds, live = _tile(LABELS, n_rows, n_cols, ignore_index, has_label,
                                        BLOCK_M, BLOCK_N)
    p = tl.load(P + rows * stride_p + cols, mask=live, other=0.0).to(tl.float32)
    q = tl.load(Q + rows * stride_q + cols, mask=live, other=0.0).to(tl.float32)
    loss = tl.where(live, 0.5 * tl.abs(p - q), 0.0)
    if per_element != 0:
        tl.store(OUT + rows * stride_out + cols, loss, mask=in_bounds)
    else:
        total = tl.sum(tl.sum(loss, axis=1), axis=0)
        tile = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        tl.store(OUT + tile, total)


@triton.jit
def tvd_bwd(DP, P, Q, LABELS, N_VALID, GO, n_rows, n_cols, stride_dp, stride_p, stride_q,
            stride_go, ignore_index, scale, has_label, go_per_element, divide,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows, cols, in_bounds, live = _tile(LABELS, n_rows, n_cols, ignore_index, has_label,
                                        BLOCK_M, BLOCK_N)
    p = tl.load(P + rows * stride_p + cols, mask=live, other=0.0).to(tl.float32)
    q = tl.load(Q + rows * stride_q + cols, mask=live, other=0.0).to(tl.float32)
    d = p - q
    half_sign = tl.where(d > 0, 0.5, tl.where(d < 0, -0.5, d * 0.0))
    if go_per_element != 0:
        go = tl.load(GO + rows * stride_go + cols, mask=live, other=0.0)
    else:
        go = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32) + tl.load(GO)
    if divide != 0:
        if has_label != 0:
            n_valid = tl.load(N_VALID).to(tl.float32)
        else:
            n_valid = n_rows * 1.0
        scale = scale / tl.maximum(n_valid, 1.0)  # 0 only when every row is ignored
    dp = tl.where(live, half_sign * (go * scale), 0.0)
    tl.store(DP + rows * stride_dp + cols, dp.to(DP.dtype.element_ty), mask=in_bounds)
