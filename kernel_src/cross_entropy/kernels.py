"""Cross entropy over rows of logits, with ignore_index and label smoothing, loss and grad.

For a row x of V logits, target t and smoothing eps, the target distribution is
q_i = (1 - eps) [i == t] + eps / V, and with lse = log(sum_i exp(x_i)):
    loss   = sum_i q_i (lse - x_i) = lse - (1 - eps) x_t - (eps / V) sum_i x_i
    dloss/dx_i = softmax(x)_i - q_i
Rows whose target is ignore_index have loss 0 and gradient 0.

One program per row. Pass 1 streams the row in BLOCK_V chunks with an online softmax: a
running scalar max m and a per-lane sum of exp(x - m) rescaled by exp(m_old - m_new) when m
grows (one exp per element plus one per chunk, one cross-lane max per chunk); the per-lane
sums of exp and of x are reduced once at the end. Pass 2 (only when has_grad) reads the row
again (mostly from L2) and writes (softmax - q) * scale, where scale is 1 / (number of
non-ignored targets) for reduction "mean" (read from N_VALID, computed on the device) and 1
otherwise. Row offsets are int64 so n_rows * V may exceed 2^31. All arithmetic is fp32.
"""
import triton
import triton.language as tl


@triton.jit
def cross_entropy_fwd(LOSS, GRAD, LOGITS, TARGET, N_VALID, n_cols, stride_grad, stride_logits,
                      ignore_index, label_smoothing, has_grad, mean,
                      BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    target = tl.load(TARGET + row)
    x_row = LOGITS + row * stride_logits
    g_row = GRAD + row * stride_grad
    cols = tl.arange(0, BLOCK_V)
    if target == ignore_index:
        tl.store(LOSS + row, 0.0)
        if has_grad != 0:
            zero = tl.zeros([BLOCK_V], dtype=GRAD.dtype.element_ty)
            for start in range(0, n_cols, BLOCK_V):
                c = start + cols
                tl.store(g_row + c, zero, mask=c < n_cols)
    else:
        m = tl.max(tl.full([BLOCK_V], float("-inf"), tl.float32), axis=0)
        d = tl.zeros([BLOCK_V], dtype=tl.float32)
        sx = tl.zeros([BLOCK_V], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_V):
            c = start + cols
            mask = c < n_cols
            x = tl.load(x_row + c, mask=mask, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            d = d * tl.exp(m - m_new) + tl.exp(x - m_new)
            sx += tl.where(mask, x, 0.0)
            m = m_new
        lse = m + tl.log(tl.sum(d, axis=0))
        # An out-of-range target would make PyTorch raise; here it must not read out of bounds.
        in_range = (target >= 0) & (target < n_cols)
        x_t = tl.load(x_row + target, mask=in_range, other=0.0).to(tl.float32)
        smooth = label_smoothing / n_cols
        loss = lse - (1.0 - label_smoothing) * x_t - smooth * tl.sum(sx, axis=0)
        tl.store(LOSS + row, loss)
        if has_grad != 0:
            # N_VALID always points at readable memory; it is only used for "mean".
            scale = tl.where(mean != 0, 1.0 / tl.load(N_VALID).to(tl.float32), 1.0)
            for start in range(0, n_cols, BLOCK_V):
                c = start + cols
                mask = c < n_cols
                x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
                g = tl.exp(x - lse) - smooth - tl.where(c == target, 1.0 - label_smoothing, 0.0)
                tl.store(g_row + c, (g * scale).to(GRAD.dtype.element_ty), mask=mask)
