"""Generalized Jensen-Shannon divergence between a student and a teacher distribution.

x = log q (student, the input), y = log p (teacher, the target), per element:
    beta == 0:  loss = p (y - x)  (forward KL(p || q)),  dloss/dx = -p
    beta == 1:  loss = q (x - y)  (reverse KL(q || p)),  dloss/dx = q (x - y) + q
    otherwise:  m = beta p + (1 - beta) q,
                loss = beta p (y - log m) + (1 - beta) q (x - log m),
                dloss/dx = (1 - beta) q (x - log m)
(the last is beta KL(p || m) + (1 - beta) KL(q || m)). log m is evaluated as
    max(x, y) + log(beta e^(y - max) + (1 - beta) e^(x - max))
so with e = exp(-|x - y|) and E = exp(max(x, y)) the general case costs two exp and one log
per element (p and q are E and E e). A term whose log-probability is -inf (probability 0)
contributes 0 instead of 0 * inf; NaN inputs still give NaN.

jsd: the inputs are already log-probabilities, so loss and gradient are elementwise. The
kernel tiles (n_rows, n_cols) in BLOCK_M x BLOCK_N tiles on a 2-D grid; rows whose label is
ignore_index are skipped (not even read). It writes one fp32 partial loss sum per tile
(has_loss) and/or dx = dloss/dx * grad_output / n_valid (has_grad), n_valid read from the
device (the number of labels != ignore_index, clamped to 1) or inv_n without labels.

fused_linear_jsd_rows: one program per row of student and teacher logits (from the fused
linear layer, one chunk of tokens at a time). With temperature T, zs = s / T, zt = t / T,
x = zs - lse(zs), y = zt - lse(zt). Pass 1 streams both rows for the two log-sum-exps (online:
running max and per-lane sums rescaled when the max grows); pass 2 sums the loss and
S = sum_i dloss/dx_i; pass 3 overwrites the student logits in place with the gradient
w.r.t. the raw logits, (dloss/dx_i - q_i S) / T / n_valid (softmax Jacobian of x). Row
offsets are int64; all arithmetic is fp32.
"""
import triton
import triton.language as tl


@triton.jit
def _jsd_terms(x, y, beta):
    """Elementwise (loss, dloss/dx) for fp32 log-probabilities x (student), y (teacher)."""
    neg_inf = float("-inf")
    if beta == 0.0:
        p = tl.exp(y)
        loss = tl.where(y == neg_inf, 0.0, p * (y - x))
        dx = -p
    elif beta == 1.0:
        q = tl.exp(x)
        loss = tl.where(x == neg_inf, 0.0, q * (x - y))
        dx = loss + q
    else:
        x_big = x > y
        top = tl.maximum(x, y)
        e = tl.exp(-tl.abs(x - y))
        big = tl.exp(top)
        p = tl.where(x_big, big * e, big)
        q = tl.where(x_big, big, big * e)
        log_m = top + tl.log(tl.where(x_big, beta * e + (1.0 - beta), beta + (1.0 - beta) * e))
        dx = tl.where(x == neg_inf, 0.0, (1.0 - beta) * q * (x - log_m))
        loss = tl.where(y == neg_inf, 0.0, beta * p * (y - log_m)) + dx
    return loss, dx


@triton.jit
def jsd(LOSS_PARTIAL, DX, X, Y, LABELS, N_VALID, GO, n_rows, n_cols, stride_dx, stride_x,
        stride_y, ignore_index, beta, inv_n, has_label, has_loss, has_grad,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    if has_label != 0:
        label = tl.load(LABELS + rows, mask=row_ok, other=0)
        row_ok = row_ok & (label != ignore_index)
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    y = tl.load(Y + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0)
    loss, dx = _jsd_terms(x.to(tl.float32), y.to(tl.float32), beta)
    if has_loss != 0:
        total = tl.sum(tl.sum(tl.where(mask, loss, 0.0), axis=1), axis=0)
        tile = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        tl.store(LOSS_PARTIAL + tile, total)
    if has_grad != 0:
        if has_label != 0:
            inv_n = 1.0 / tl.maximum(tl.load(N_VALID), 1).to(tl.float32)
        scale = tl.load(GO).to(tl.float32) * inv_n
        dx = tl.where(mask, dx * scale, 0.0)
        out_mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=out_mask)


@triton.jit
def fused_linear_jsd_rows(LOSS, S_LOGITS, T_LOGITS, LABELS, N_VALID, row0, n_cols, stride_s,
                          stride_t, ignore_index, beta, inv_temp, inv_n, has_label, has_grad,
                          BLOCK_V: tl.constexpr):
    """Program i handles logits row i of the chunk, which is token row0 + i (its entry in
    LOSS and LABELS: the base pointers stay 16-byte aligned for any chunk start)."""
    row = tl.program_id(0).to(tl.int64)
    token = row0 + row
    s_row = S_LOGITS + row * stride_s
    t_row = T_LOGITS + row * stride_t
    cols = tl.arange(0, BLOCK_V)
    ignored = (has_label != 0) & (tl.load(LABELS + token, mask=has_label != 0, other=0)
                                  == ignore_index)
    if ignored:
        tl.store(LOSS + token, 0.0)
        if has_grad != 0:
            zero = tl.zeros([BLOCK_V], dtype=S_LOGITS.dtype.element_ty)
            for start in range(0, n_cols, BLOCK_V):
                c = start + cols
                tl.store(s_row + c, zero, mask=c < n_cols)
    else:
        neg_inf = float("-inf")
        m_s = tl.max(tl.full([BLOCK_V], neg_inf, tl.float32), axis=0)
        m_t = m_s
        d_s = tl.zeros([BLOCK_V], dtype=tl.float32)
        d_t = tl.zeros([BLOCK_V], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_V):
            c = start + cols
            mask = c < n_cols
            zs = tl.load(s_row + c, mask=mask, other=0.0).to(tl.float32) * inv_temp
            zt = tl.load(t_row + c, mask=mask, other=0.0).to(tl.float32) * inv_temp
            zs = tl.where(mask, zs, neg_inf)
            zt = tl.where(mask, zt, neg_inf)
            new_s = tl.maximum(m_s, tl.max(zs, axis=0))
            new_t = tl.maximum(m_t, tl.max(zt, axis=0))
            d_s = d_s * tl.exp(m_s - new_s) + tl.exp(zs - new_s)
            d_t = d_t * tl.exp(m_t - new_t) + tl.exp(zt - new_t)
            m_s = new_s
            m_t = new_t
        lse_s = m_s + tl.log(tl.sum(d_s, axis=0))
        lse_t = m_t + tl.log(tl.sum(d_t, axis=0))
        acc_loss = tl.zeros([BLOCK_V], dtype=tl.float32)
        acc_grad = tl.zeros([BLOCK_V], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_V):
            c = start + cols
            mask = c < n_cols
            x = tl.load(s_row + c, mask=mask, other=0.0).to(tl.float32) * inv_temp - lse_s
            y = tl.load(t_row + c, mask=mask, other=0.0).to(tl.float32) * inv_temp - lse_t
            loss, dx = _jsd_terms(x, y, beta)
            acc_loss += tl.where(mask, loss, 0.0)
            acc_grad += tl.where(mask, dx, 0.0)
        tl.store(LOSS + token, tl.sum(acc_loss, axis=0))
        if has_grad != 0:
            if has_label != 0:
                inv_n = 1.0 / tl.maximum(tl.load(N_VALID), 1).to(tl.float32)
            total_grad = tl.sum(acc_grad, axis=0)
            scale = inv_temp * inv_n
            for start in range(0, n_cols, BLOCK_V):
                c = start + cols
                mask = c < n_cols
                x = tl.load(s_row + c, mask=mask, other=0.0).to(tl.float32) * inv_temp - lse_s
                y = tl.load(t_row + c, mask=mask, other=0.0).to(tl.float32) * inv_temp - lse_t
                _, dx = _jsd_terms(x, y, beta)
                dz = (dx - tl.exp(x) * total_grad) * scale
                tl.store(s_row + c, dz.to(S_LOGITS.dtype.element_ty), mask=mask)
