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
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from . import spec
from .. import staged_rows

MAX_STAGED_SPLIT = gl.constexpr(spec.MAX_STAGED_SPLIT)


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


# -- one-program kernels around the row kernels --------------------------------------------
#
# Reduction "mean" needs its divisors before the row kernel (the gradient is scaled in the
# same pass) and the loss's sum after it. As torch ops these were eight small kernels (the
# target mask, two sums, a stack, a reciprocal, a concatenation, a multiply, a zero fill):
# ~24 us of a 1.11 ms step at 8192 x 128256 from a CUDA graph on an H200, where the staged
# kernel itself took 1.086 ms (docs/perf-notes.md, session 19). The op runs these for up to
# spec.SMALL_MAX_ROWS rows, where one program reads them in a few microseconds.

@triton.jit
def reduction_scales(SCALES, TARGET, WEIGHT, n_rows, n_classes, ignore_index,
                     WEIGHTED: tl.constexpr, BLOCK: tl.constexpr):
    """SCALES = [1 / sum of the class weights of non-ignored targets (their count without
    weights), 1 / number of non-ignored targets, sum of all class weights (0 without)], as
    ops.cross_entropy.reduction_scales computes them with torch. 1 / 0 = inf: a "mean" over
    nothing comes out nan, as in PyTorch. Counts are exact in fp32 up to 2^24 rows."""
    offs = tl.arange(0, BLOCK)
    count = tl.zeros([BLOCK], dtype=tl.float32)
    denom = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_rows, BLOCK):
        rows = start + offs
        t = tl.load(TARGET + rows, mask=rows < n_rows, other=ignore_index)
        valid = t != ignore_index
        count += valid.to(tl.float32)
        if WEIGHTED:
            safe = tl.minimum(tl.maximum(t, 0), n_classes - 1)  # ignored or bad: any class
            denom += tl.load(WEIGHT + safe, mask=valid, other=0.0)
    n_valid = tl.sum(count, axis=0)
    if WEIGHTED:
        w_acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_classes, BLOCK):
            cols = start + offs
            w_acc += tl.load(WEIGHT + cols, mask=cols < n_classes, other=0.0)
        total = tl.sum(denom, axis=0)
        w_sum = tl.sum(w_acc, axis=0)
    else:
        total = n_valid
        w_sum = 0.0
    # rounded as torch's reciprocal is (the default fp32 division is approximate)
    tl.store(SCALES, tl.math.div_rn(1.0, total))
    tl.store(SCALES + 1, tl.math.div_rn(1.0, n_valid))
    tl.store(SCALES + 2, w_sum)


@triton.jit
def reduce_loss_rows(LOSS, Z, ACC, LOSS_ROWS, Z_ROWS, ACC_ROWS, SCALES, n_rows, flags,
                     BLOCK: tl.constexpr):
    """The row kernel's per-row pieces reduced, as ops.cross_entropy.reduce_rows does with
    torch for reductions "sum" and "mean" (flags: 1 mean, 2 z-loss rows, 4 accuracy rows):
    LOSS = sum of the loss rows (times SCALES[0] for "mean") + the z-loss, Z = sum of the
    z-loss rows (times SCALES[1] for "mean"), ACC = sum of the accuracy rows times SCALES[1].
    Z and ACC are written only when their rows are given."""
    mean = (flags & 1) != 0
    has_z = (flags & 2) != 0
    has_acc = (flags & 4) != 0
    offs = tl.arange(0, BLOCK)
    loss = tl.zeros([BLOCK], dtype=tl.float32)
    z = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_rows, BLOCK):
        rows = start + offs
        live = rows < n_rows
        loss += tl.load(LOSS_ROWS + rows, mask=live, other=0.0)
        z += tl.load(Z_ROWS + rows, mask=live & has_z, other=0.0)
        acc += tl.load(ACC_ROWS + rows, mask=live & has_acc, other=0.0)
    loss_sum = tl.sum(loss, axis=0)
    z_sum = tl.sum(z, axis=0)
    if mean:
        loss_sum = loss_sum * tl.load(SCALES)
        z_sum = z_sum * tl.load(SCALES + 1)
    if has_z:
        tl.store(Z, z_sum)
        loss_sum = loss_sum + z_sum
    tl.store(LOSS, loss_sum)
    if has_acc:
        tl.store(ACC, tl.sum(acc, axis=0) * tl.load(SCALES + 1))


# -- staged (Gluon, sm90): each row read once, its slices held in shared memory -------------
#
# cross_entropy_fwd reads every row twice (pass 1 for the log-sum-exp, pass 2 for the
# gradient), and at 128K columns the second read misses L2: three passes of HBM traffic.
# Here a group of `split` = cdiv(V, SLICE) persistent programs takes rows g, g + n_groups, ...;
# program `part` of the group owns columns [part * SLICE, (part + 1) * SLICE) of each. Its
# slice streams through a ring of SLOTS shared-memory chunk buffers, a whole number of
# slices (cp.async, as the staged norm forwards); pass 1 keeps an online max and sum a thread
# (one exp an element plus one a thread-row of 8), then the program publishes its slice's
# log-sum-exp (and sum of x) to its words of STATS and polls the group's words until all
# `split` are there: the row's log-sum-exp. Pass 2 writes the slice's gradient from shared
# memory, refilling each slot with the same chunk of a later row as soon as its values are
# in registers. The program that owns the target's column stores the loss. Two passes of HBM
# traffic instead of three (H200, 8192 x 128256 bf16: 1.41 -> 1.22 ms, session 13; 1.19 with
# the tagged words of session 14, which replaced an arrival counter whose release fence
# waited for the program's outstanding memory operations; 1.18 -> 1.09 in session 19 with
# half the instructions a chunk: constant slots, one masked copy, bf16 widened by a shift
# and a mask, and masked selects only in the chunk that crosses n_cols: docs/perf-notes.md).
#
# Waiting is safe because the grid is at most as many programs as the GPU holds at once
# (spec.STAGED_CONFIG's PROGRAMS_PER_SM an SM, checked against the kernel's registers and
# shared memory by tests/test_staged_cross_entropy.py) and a group's programs have
# consecutive ids: CTAs start in id order, so whenever one waits, the rest of its group is
# resident or next to start. The op uses this kernel only
# for bf16/fp16 rows in the aligned class on sm90 without the FEATURES=1 switches, and only
# with STATS zeroed.

@gluon.jit
def _staged_issue(ring, slot, row_ptr, live_cols, offs):
    """One chunk of a row into ring slot `slot`, as one cp.async group: `row_ptr` points at
    the chunk's first column, and columns from `live_cols` on (0 for a row past n_rows) are
    zero-filled, not read. One masked copy, whatever the chunk: its mask is one compare a
    16-byte vector, and a second, unmasked copy of the code costs more (a second barrier
    before it and both paths' issue slots)."""
    cp.async_copy_global_to_shared(ring.index(slot), row_ptr + offs, mask=offs < live_cols)
    cp.commit_group()


@gluon.jit
def _exp2(x):
    """2^x as one MUFU.EX2 (ftz): the plain exp lowering adds a multiply and a denormal-range
    fix (a compare and two predicated multiplies), six instructions an exp in all."""
    return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                     dtype=gl.float32, is_pure=True, pack=1)


LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _online_update(x, m, d):
    """The online max and sum of exp of each thread-row of 8 (`x` fp32; m, d its running
    max and sum of exp(x - m)): no barrier until the slice ends."""
    m_new = gl.maximum(m, gl.max(x, axis=1))
    m2 = m_new * LOG2E
    d = d * _exp2(m * LOG2E - m2) + gl.sum(_exp2(x * LOG2E - gl.expand_dims(m2, 1)), axis=1)
    return m_new, d


@gluon.jit
def _staged_slice_stats(ring, base, part, n_cols, offs, smoothing, layout: gl.constexpr,
                        CHUNKS: gl.constexpr, SLOTS: gl.constexpr, BLOCK_N: gl.constexpr):
    """(max, sum of exp(x - max), sum of x) over the program's slice of its row in slots
    base .. base + CHUNKS - 1, each chunk waited for as it is needed (every chunk of the
    rows before has been read then, so exactly SLOTS - 1 - j copies were issued after chunk
    j). Zero-filled columns past n_cols add nothing to the sum of x; only the chunk that
    crosses n_cols masks them out of the max and the exp sum, in its own branch (as a
    predicated select every chunk would pay an issue slot an element for it)."""
    lanes: gl.constexpr = gl.SliceLayout(1, layout)
    m = gl.full([BLOCK_N // 8], -1.0e30, gl.float32, lanes)  # finite: so is m * LOG2E
    d = gl.zeros([BLOCK_N // 8], gl.float32, lanes)
    sx = gl.zeros([BLOCK_N // 8], gl.float32, lanes)
    for j in gl.static_range(CHUNKS):
        cp.wait_group(SLOTS - 1 - j)
        x = staged_rows.widen(ring.index(base + j).load(layout))
        room = n_cols - (part * CHUNKS + j) * BLOCK_N
        if room >= BLOCK_N:
            m, d = _online_update(x, m, d)
        elif room > 0:
            m, d = _online_update(gl.where(offs < room, x, float("-inf")), m, d)
        if smoothing:
            sx += gl.sum(x, axis=1)
    m_p = gl.max(m, axis=0)
    return m_p, gl.sum(d * gl.exp(m - m_p), axis=0), gl.sum(sx, axis=0)


@gluon.jit
def _staged_exchange(WORDS, row, split, part, lse_p, sx_p, smoothing,
                     MAX_SPLIT: gl.constexpr):
    """Publishes this program's statistics of `row` (its slice's log-sum-exp and sum of x) as
    tagged words (staged_rows.publish_word: 2 a (row, part) in WORDS), waits for the other
    split - 1 programs of its group, returns the row's (log-sum-exp, sum of x)."""
    slot = (row * split + part) * 2
    staged_rows.publish_word(WORDS, slot, lse_p)
    if smoothing:
        staged_rows.publish_word(WORDS, slot + 1, sx_p)
    lses, live = staged_rows.collect_words(WORDS, row * split * 2, 2, split, MAX_SPLIT)
    lses = gl.where(live, lses, float("-inf"))
    big = gl.max(lses, axis=0)
    lse = big + gl.log(gl.sum(gl.exp(lses - big), axis=0))
    sx = 0.0
    if smoothing:
        sxs, _ = staged_rows.collect_words(WORDS, row * split * 2 + 1, 2, split, MAX_SPLIT)
        sx = gl.sum(sxs, axis=0)
    return lse, sx


@gluon.jit
def cross_entropy_fwd_staged(LOSS, ZLOSS, GRAD, LOGITS, TARGET, SCALES, ROW_SCALE, STATS,
                             n_rows, n_cols, stride_grad, stride_logits, ignore_index,
                             label_smoothing, lse_square_scale, flags,
                             BLOCK_N: gl.constexpr, CHUNKS: gl.constexpr,
                             SLOTS: gl.constexpr, PROGRAMS_PER_SM: gl.constexpr):
    """cross_entropy_fwd with FEATURES=0 (the flags GRAD, MEAN, Z and ROW_SCALE; label
    smoothing; ignore_index), each row read once (see the comment above). STATS holds 2
    zeroed int64 words a (row, part) (_staged_exchange); the grid is a multiple of split =
    cdiv(n_cols, CHUNKS * BLOCK_N) programs (PROGRAMS_PER_SM: the op's grid). GRAD may be
    LOGITS (in place): a program writes only its own slice, after it has read it.

    The ring holds RING_ROWS = SLOTS / CHUNKS whole slices: row k of the program's sequence
    sits in slots (k % RING_ROWS) * CHUNKS + j, and pass 2's chunk j refills its slot with
    chunk j of row k + RING_ROWS. So every slot index is a constant or one per row, and the
    refill's address is one per row plus a constant (with 11 slots for 8 chunks each chunk
    spent ~20 instructions on a modulo and a 64-bit address)."""
    gl.static_assert(SLOTS % CHUNKS == 0)
    RING_ROWS: gl.constexpr = SLOTS // CHUNKS
    SLICE: gl.constexpr = CHUNKS * BLOCK_N
    # a thread-row of 8 elements: one 16-byte copy, reduced in registers
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [gl.num_warps(), 1], [1, 0])
    lanes: gl.constexpr = gl.SliceLayout(1, layout)
    ring = gl.allocate_shared_memory(LOGITS.dtype.element_ty, [SLOTS, BLOCK_N // 8, 8],
                                     gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    offs = gl.expand_dims(gl.arange(0, BLOCK_N // 8, lanes), 1) * 8 + \
        gl.expand_dims(gl.arange(0, 8, gl.SliceLayout(0, layout)), 0)
    has_grad = (flags & 1) != 0
    mean = (flags & 2) != 0
    store_z = (flags & 16) != 0
    row_scaled = (flags & 128) != 0
    eps = label_smoothing
    smoothing = eps != 0.0
    split = gl.cdiv(n_cols, SLICE)
    n_groups = gl.num_programs(0) // split
    group = gl.program_id(0) // split
    part = gl.program_id(0) % split
    first_col = part * SLICE
    slice_cols = n_cols - first_col  # the slice's columns in the row (SLICE or fewer)
    for r in gl.static_range(RING_ROWS):
        row = group + r * n_groups
        row_ptr = LOGITS + row.to(gl.int64) * stride_logits + first_col
        live = gl.where(row < n_rows, slice_cols, 0)
        for j in gl.static_range(CHUNKS):
            _staged_issue(ring, r * CHUNKS + j, row_ptr + j * BLOCK_N, live - j * BLOCK_N, offs)
    for k in range(gl.cdiv(n_rows - group, n_groups)):
        row = group + k * n_groups
        base = (k % RING_ROWS) * CHUNKS
        target = gl.load(TARGET + row)
        ignored = target == ignore_index
        in_range = (target >= 0) & (target < n_cols)
        owner = gl.where(in_range, target // SLICE, 0)  # part 0 stores an ignored row's loss
        # read before any program of the group writes the row (in place); pass 1 hides it
        x_t = gl.load(LOGITS + row.to(gl.int64) * stride_logits + target,
                      mask=in_range & (part == owner), other=0.0).to(gl.float32)
        m_p, d_p, sx_p = _staged_slice_stats(ring, base, part, n_cols, offs, smoothing, layout,
                                             CHUNKS, SLOTS, BLOCK_N)
        lse = m_p + gl.log(d_p)  # an ignored row keeps its own: finite, gradient 0
        sx = sx_p
        if (split > 1) & (target != ignore_index):
            lse, sx = _staged_exchange(STATS, row, split, part, lse, sx_p, smoothing,
                                       MAX_STAGED_SPLIT)
        if part == owner:
            ce = (1.0 - eps) * (lse - x_t) + eps / n_cols * (n_cols * lse - sx)
            gl.store(LOSS + row, gl.where(ignored, 0.0, ce))
            if store_z:
                gl.store(ZLOSS + row, gl.where(ignored, 0.0, lse_square_scale * lse * lse))
        # the row whose chunks refill this row's slots
        next_row = row + RING_ROWS * n_groups
        next_ptr = LOGITS + next_row.to(gl.int64) * stride_logits + first_col
        next_live = gl.where(next_row < n_rows, slice_cols, 0)
        if has_grad:
            k_row = gl.load(ROW_SCALE + row, mask=row_scaled, other=1.0)
            k_ce = k_row * gl.load(SCALES, mask=mean, other=1.0)
            k_z = k_row * gl.load(SCALES + 1, mask=mean, other=1.0)
            a_coef = gl.where(ignored, 0.0, k_ce + 2.0 * k_z * lse_square_scale * lse)
            t_coef = gl.where(ignored, 0.0, k_ce * (1.0 - eps))
            s_coef = gl.where(ignored, 0.0, k_ce * eps / n_cols)
            lse2 = lse * LOG2E
            g_row = GRAD + row.to(gl.int64) * stride_grad + first_col
            # the target's column in the slice as a 32-bit chunk and offset (-1: elsewhere)
            t_local = gl.where(in_range & (part == owner), target - first_col, -1).to(gl.int32)
            t_chunk = gl.where(t_local >= 0, t_local // BLOCK_N, -1)
            t_offs = t_local - t_chunk * BLOCK_N
            for j in gl.static_range(CHUNKS):
                x = staged_rows.widen(ring.index(base + j).load(layout))
                # the slot is free once x is in registers: the next row's chunk streams in
                _staged_issue(ring, base + j, next_ptr + j * BLOCK_N, next_live - j * BLOCK_N,
                              offs)
                g = a_coef * _exp2(x * LOG2E - lse2) - s_coef
                if t_chunk == j:
                    g = gl.where(offs == t_offs, g - t_coef, g)
                gl.store(g_row + j * BLOCK_N + offs, g.to(GRAD.dtype.element_ty),
                         mask=offs < slice_cols - j * BLOCK_N)
        else:
            for j in gl.static_range(CHUNKS):
                _staged_issue(ring, base + j, next_ptr + j * BLOCK_N, next_live - j * BLOCK_N,
                              offs)
    cp.wait_group(0)  # the ring's last copies (rows past the end) before the program exits
