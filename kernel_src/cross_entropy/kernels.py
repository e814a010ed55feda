"""Cross entropy over rows of logits: loss and gradient in one kernel, every Liger-Kernel option.

For a row of V raw logits r, target t, class weights w (all 1 without weights), smoothing eps,
z-loss scale s and optional softcap c:
    x_i   = c * tanh(r_i / c)            (identity without softcap)
    lse   = log(sum_i exp(x_i)),  p_i = exp(x_i - lse)
    ce    = (1 - eps) w_t (lse - x_t) + (eps / V) sum_i w_i (lse - x_i)
          = (1 - eps) w_t (lse - x_t) + (eps / V) (W lse - sum_i w_i x_i),  W = sum_i w_i
    z     = s lse^2
and with k_ce, k_z the reduction scales ("mean": 1 / sum of w_t over non-ignored rows and
1 / number of non-ignored rows; otherwise 1), times an optional per-row factor (grad_output
of reduction "none") and the optional detached token scale p_t:
    dL/dx_i = (k_ce ((1 - eps) w_t + eps W / V) + 2 k_z s lse) p_i
              - k_ce (1 - eps) w_t [i == t] - k_ce (eps / V) w_i
    dL/dr_i = dL/dx_i (1 - tanh(r_i / c)^2)
This is PyTorch's F.cross_entropy (weights, smoothing, ignore_index) plus Liger's z-loss,
which is neither weighted nor smoothed and is divided by the non-ignored row count for
"mean". Rows whose target is ignore_index have loss 0 and gradient 0.

One program per row. Pass 1 streams the row in BLOCK_V chunks with an online softmax: a
running scalar max m and per-lane sums of exp(x - m), rescaled by exp(m_old - m_new) when m
grows, reduced once at the end; the sum of w x (for smoothing) is reduced per chunk, like
the max (a per-lane accumulator would cost registers, and registers cost occupancy). Pass 2
(only when the GRAD flag is set) reads the row again (mostly from L2) and writes the
gradient. GRAD may be the LOGITS buffer itself (in place): every element is read before it
is overwritten, by the same program. The loss pieces are stored unscaled per row (LOSS: ce,
ZLOSS: z) and reduced by the caller on the device. SCALES holds device values computed by
the caller: [k_ce, k_z] for "mean" and W (with weights and smoothing), so no count ever goes
through the host. Row offsets are int64, so n_rows * V may exceed 2^31.

Feature switches are bits of the runtime int `flags` (values in spec.py): each costs a
uniform scalar branch per chunk, not a variant. The rarer ones (class weights, softcap,
token accuracy, token scaling) also need the FEATURES=1 variant: their code doubles the
kernel's registers (sm90, bf16: 47 -> 92 aligned, 57 -> 116 unaligned), which would cut the
occupancy of the plain case. All arithmetic is fp32.
"""
import triton
import triton.language as tl


@triton.jit
def _tanh(y):
    # Portable (CUDA, HIP and the interpreter, which has no libdevice): the exp form loses
    # relative accuracy near 0, where a short odd Taylor series is exact to fp32 rounding.
    a = tl.abs(y)
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    a2 = a * a
    small = a * (1.0 + a2 * (-0.3333333333333333 + a2 * (0.13333333333333333
                                                          + a2 * -0.05396825396825397)))
    t = tl.where(a < 0.125, small, big)
    return tl.where(y < 0.0, -t, t)


@triton.jit
def cross_entropy_fwd(LOSS, ZLOSS, ACC, GRAD, LOGITS, TARGET, WEIGHT, SCALES, ROW_SCALE,
                      n_cols, stride_grad, stride_logits, ignore_index,
                      label_smoothing, lse_square_scale, softcap, flags,
                      FEATURES: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    has_grad = (flags & 1) != 0
    mean = (flags & 2) != 0
    store_z = (flags & 16) != 0
    row_scaled = (flags & 128) != 0
    # FEATURES=0 compiles the four switches below out (about half the registers)
    full = FEATURES != 0
    weighted = ((flags & 4) != 0) & full
    capped = ((flags & 8) != 0) & full
    accuracy = ((flags & 32) != 0) & full
    token_scaling = ((flags & 64) != 0) & full
    eps = label_smoothing
    smooth_weighted = weighted & (eps != 0.0)

    target = tl.load(TARGET + row)
    x_row = LOGITS + row * stride_logits
    g_row = GRAD + row * stride_grad
    cols = tl.arange(0, BLOCK_V)
    if target == ignore_index:
        tl.store(LOSS + row, 0.0)
        if store_z:
            tl.store(ZLOSS + row, 0.0)
        if accuracy:
            tl.store(ACC + row, 0.0)
        if has_grad:
            zero = tl.zeros([BLOCK_V], dtype=GRAD.dtype.element_ty)
            for start in range(0, n_cols, BLOCK_V):
                c = start + cols
                tl.store(g_row + c, zero, mask=c < n_cols)
    else:
        inv_cap = 1.0 / softcap  # the caller passes 1.0 when there is no softcap
        m = tl.max(tl.full([BLOCK_V], float("-inf"), tl.float32), axis=0)
        best = tl.min(tl.full([BLOCK_V], 0, tl.int32), axis=0)
        d = tl.zeros([BLOCK_V], dtype=tl.float32)
        sx = tl.sum(d, axis=0)  # scalar: a per-lane sum would cost 16 more registers
        # num_stages=3: three chunks' loads in flight per program (software pipelining);
        # measured 1.60 -> 1.54 ms for loss + gradient at 8192 x 128256 on an H200
        for start in tl.range(0, n_cols, BLOCK_V, num_stages=3):
            c = start + cols
            mask = c < n_cols
            x = tl.load(x_row + c, mask=mask, other=float("-inf")).to(tl.float32)
            if capped:
                x = tl.where(mask, softcap * _tanh(x * inv_cap), float("-inf"))
            c_max = tl.max(x, axis=0)
            if accuracy:
                # first index of the row maximum, as torch.argmax
                first = tl.min(tl.where(x == c_max, c, n_cols), axis=0)
                best = tl.where(c_max > m, first, best)
            m_new = tl.maximum(m, c_max)
            d = d * tl.exp(m - m_new) + tl.exp(x - m_new)
            if smooth_weighted:
                w = tl.load(WEIGHT + c, mask=mask, other=0.0)
                sx += tl.sum(w * tl.where(mask, x, 0.0), axis=0)
            else:
                sx += tl.sum(tl.where(mask, x, 0.0), axis=0)
            m = m_new
        lse = m + tl.log(tl.sum(d, axis=0))
        # An out-of-range target would make PyTorch raise; here it must not read out of bounds.
        in_range = (target >= 0) & (target < n_cols)
        x_t = tl.load(x_row + target, mask=in_range, other=0.0).to(tl.float32)
        if capped:
            x_t = softcap * _tanh(x_t * inv_cap)
        w_t = tl.load(WEIGHT + target, mask=in_range & weighted, other=1.0)
        # W = sum of the class weights: SCALES[2], computed once by the caller
        w_total = tl.where(smooth_weighted, tl.load(SCALES + 2, mask=smooth_weighted, other=0.0),
                           n_cols * 1.0)
        smooth = eps / n_cols
        ce = (1.0 - eps) * w_t * (lse - x_t) + smooth * (w_total * lse - sx)
        z = lse_square_scale * lse * lse
        # token scaling: the row's loss times its detached target probability
        k = tl.where(token_scaling, tl.exp(x_t - lse), 1.0)
        tl.store(LOSS + row, ce * k)
        if store_z:
            tl.store(ZLOSS + row, z * k)
        if accuracy:
            tl.store(ACC + row, tl.where(best.to(tl.int64) == target, 1.0, 0.0))
        if has_grad:
            # SCALES (reduction "mean") and ROW_SCALE are only read when their flag is set.
            k = k * tl.load(ROW_SCALE + row, mask=row_scaled, other=1.0)
            k_ce = k * tl.load(SCALES, mask=mean, other=1.0)
            k_z = k * tl.load(SCALES + 1, mask=mean, other=1.0)
            a_coef = k_ce * ((1.0 - eps) * w_t + smooth * w_total) \
                + 2.0 * k_z * lse_square_scale * lse
            t_coef = k_ce * (1.0 - eps) * w_t
            s_coef = k_ce * smooth
            for start in tl.range(0, n_cols, BLOCK_V, num_stages=3):
                c = start + cols
                mask = c < n_cols
                x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
                if capped:
                    th = _tanh(x * inv_cap)
                    x = softcap * th
                    dcap = 1.0 - th * th
                else:
                    dcap = tl.full([BLOCK_V], 1.0, tl.float32)
                w = tl.load(WEIGHT + c, mask=mask & smooth_weighted, other=1.0)
                g = a_coef * tl.exp(x - lse) - s_coef * w - tl.where(c == target, t_coef, 0.0)
                tl.store(g_row + c, (g * dcap).to(GRAD.dtype.element_ty), mask=mask)


@triton.jit
def scale_by_grad_output(OUT, GRAD, GRAD_OUTPUT, n_elements, n_cols, per_row, in_place,
                         BLOCK: tl.constexpr):
    """OUT = GRAD * grad_output over a flat contiguous tensor, in fp32, rounded once.
    grad_output is read from device memory (no host sync): one value, or one per row of
    n_cols elements when per_row. In place with one grad_output equal to 1 (a plain
    `loss.backward()`) there is nothing to do, and every program returns at once: the host
    cannot know that value without a sync, the device can. Programs stride over the tiles,
    so the grid is a few per multiprocessor whatever the size."""
    first = tl.load(GRAD_OUTPUT)
    if (in_place == 0) | (per_row != 0) | (first != 1.0):
        first_tile = tl.program_id(0).to(tl.int64) * BLOCK
        stride = tl.num_programs(0).to(tl.int64) * BLOCK
        for start in range(first_tile, n_elements, stride):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n_elements
            g = tl.load(GRAD + offs, mask=mask, other=0.0).to(tl.float32)
            if per_row != 0:
                scale = tl.load(GRAD_OUTPUT + offs // n_cols, mask=mask, other=0.0)
            else:
                scale = tl.zeros([BLOCK], dtype=tl.float32) + first
            tl.store(OUT + offs, (g * scale).to(OUT.dtype.element_ty), mask=mask)
