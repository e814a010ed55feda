"""Gluon helpers of the staged norm forwards (the rms_norm and layer_norm families' *_staged
kernels): each row streamed once through a ring of shared-memory chunk buffers by cp.async
(NVIDIA sm80 and later).

A staged program is persistent: it takes rows pid, pid + programs, ... . Its row is
CHUNKS = STAGED chunks of BLOCK_N columns, and its ring SLOTS = STAGES >= CHUNKS slots of one
chunk each. Chunk t of the program's sequence (row t // CHUNKS of its own, chunk t % CHUNKS)
lives in slot t % SLOTS, and every copy is its own cp.async group. The ring starts with
chunks 0 .. SLOTS-1 in flight; pass 1 of the program's row k waits for chunk k*CHUNKS + j
with wait_group(SLOTS - 1 - j), a compile-time count, because exactly SLOTS + k*CHUNKS groups
have been issued then; pass 2 reads the chunks from shared memory again and refills each
slot with chunk t + SLOTS as soon as the chunk is in registers. So x crosses L2 once, not
twice as in the looped Triton forwards, and the next row streams in while this one is
written (H200, the sm90 table's choices: RMSNorm forward at 64K columns 75 -> 80% of copy,
LayerNorm at 32K 71 -> 76%; docs/perf-notes.md, session 12).

Every thread reads back only the elements its own copies wrote (one blocked layout serves
the copies and the loads), so no value crosses threads through the ring. Copies need 16-byte
vectors: the staged configs run only for 2-byte data in the aligned class (spec.staged_twin).

Imported only by the build, the tuner and the JIT fallback (like kernels.py); part of both
families' source hash (spec.SHARED_SOURCE_FILES).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

# one chunk buffer is a flat row of BLOCK_N elements; the same layout for the ring and the
# staged weights
RING_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))


@gluon.constexpr_function
def chunk_layout(num_warps):
    """8 consecutive 2-byte elements a thread (one 16-byte copy), threads then warps along
    the chunk."""
    return gl.BlockedLayout([8], [32], [num_warps], [0])


@gluon.jit
def issue_chunk(ring, X, stride_x, n_rows, n_cols, t, offs, CHUNKS: gl.constexpr,
                SLOTS: gl.constexpr, BLOCK_N: gl.constexpr):
    """Starts the copy of this program's chunk t into slot t % SLOTS, as one cp.async group.
    Columns past n_cols and rows past n_rows are zero-filled, not read."""
    row = gl.program_id(0) + (t // CHUNKS) * gl.num_programs(0)
    cols = (t % CHUNKS) * BLOCK_N + offs
    ptrs = X + row.to(gl.int64) * stride_x + cols
    cp.async_copy_global_to_shared(ring.index(t % SLOTS), ptrs,
                                   mask=(cols < n_cols) & (row < n_rows))
    cp.commit_group()


@gluon.jit
def start_ring(ring, X, stride_x, n_rows, n_cols, offs, CHUNKS: gl.constexpr,
               SLOTS: gl.constexpr, BLOCK_N: gl.constexpr):
    """Issues chunks 0 .. SLOTS-1. Call it after stage_weights: the ring's wait counts
    assume no other copies are pending."""
    for t in gl.static_range(SLOTS):
        issue_chunk(ring, X, stride_x, n_rows, n_cols, t, offs, CHUNKS, SLOTS, BLOCK_N)


@gluon.jit
def stage_weights(buf, W, n_cols, offs, CHUNKS: gl.constexpr, BLOCK_N: gl.constexpr):
    """Copies the CHUNKS x BLOCK_N weight row into `buf` (zeros past n_cols) and waits."""
    for j in gl.static_range(CHUNKS):
        cols = j * BLOCK_N + offs
        cp.async_copy_global_to_shared(buf.index(j), W + cols, mask=cols < n_cols)
    cp.commit_group()
    cp.wait_group(0)


@gluon.jit
def ring_chunk(ring, k, j: gl.constexpr, layout: gl.constexpr, CHUNKS: gl.constexpr,
               SLOTS: gl.constexpr, WAIT: gl.constexpr):
    """Chunk j of the program's row k as fp32; WAIT (pass 1) first waits for its copy."""
    if WAIT:
        cp.wait_group(SLOTS - 1 - j)
    return ring.index((k * CHUNKS + j) % SLOTS).load(layout).to(gl.float32)


@gluon.jit
def take_chunk(ring, X, stride_x, n_rows, n_cols, k, j: gl.constexpr, offs,
               layout: gl.constexpr, CHUNKS: gl.constexpr, SLOTS: gl.constexpr,
               BLOCK_N: gl.constexpr):
    """Pass 2's step: chunk j of the program's row k as fp32, its slot then refilled with the
    chunk SLOTS further on (the value is in registers, so the slot is free)."""
    x = ring_chunk(ring, k, j, layout, CHUNKS, SLOTS, False)
    issue_chunk(ring, X, stride_x, n_rows, n_cols, k * CHUNKS + j + SLOTS, offs, CHUNKS, SLOTS,
                BLOCK_N)
    return x


@gluon.jit
def weight_chunk(buf, W, n_cols, offs, j: gl.constexpr, layout: gl.constexpr,
                 SHARED: gl.constexpr, BLOCK_N: gl.constexpr):
    """Chunk j of a weight row: from its staged copy (SHARED), else from global memory."""
    if SHARED:
        return buf.index(j).load(layout)
    cols = j * BLOCK_N + offs
    return gl.load(W + cols, mask=cols < n_cols, other=0.0)


@gluon.jit
def finish_ring():
    """Waits for the ring's last copies (zero-filled rows past the program's end) before the
    program exits."""
    cp.wait_group(0)


# -- rows split over a group of programs ---------------------------------------------------
#
# The staged cross-entropy and the grouped norm backward split each row over a group of
# persistent programs, a column slice each, which share a partial value a row (a
# log-sum-exp, a dot). Each value travels as a 64-bit word, WORD_TAG in the high half and
# the fp32's bits in the low half, written by one relaxed atomic exchange into a buffer the
# op zeroed: a word is valid on its own once its high half is set, so no fence orders it
# (a release would wait for the program's outstanding stores and copies: 8% of the staged
# cross-entropy's time, H200, docs/perf-notes.md session 14). The readers poll. That is safe
# only while every program of a group is resident: the kernels' grids are at most what the
# GPU holds at once, and a group's programs have consecutive ids.
WORD_TAG = gl.constexpr(1 << 32)


@gluon.jit
def publish_word(WORDS, index, value):
    """WORDS[index] = the tagged word of fp32 `value` (WORDS int64, zeroed by the op)."""
    gl.atomic_xchg(WORDS + index, value.to(gl.uint32, bitcast=True).to(gl.int64) | WORD_TAG,
                   sem="relaxed", scope="gpu")


@gluon.jit
def collect_words(WORDS, first, stride, count, MAX_COUNT: gl.constexpr):
    """(values, live): the fp32 values of WORDS[first + i * stride] for i < count, as a
    [MAX_COUNT] tensor (live marks i < count; the other lanes hold 0.0), once all of them are
    published. Every warp polls on its own; none reads another's registers."""
    i = gl.arange(0, MAX_COUNT, gl.BlockedLayout([MAX_COUNT // 32], [32], [gl.num_warps()],
                                                 [0]))
    live = i < count
    ptrs = WORDS + first + i * stride
    words = gl.load(ptrs, mask=live, other=WORD_TAG, volatile=True)
    while gl.min((words >> 32).to(gl.int32), axis=0) == 0:
        words = gl.load(ptrs, mask=live, other=WORD_TAG, volatile=True)
    return gl.where(live, words.to(gl.uint32).to(gl.float32, bitcast=True), 0.0), live


# Two fp32 values a word (the grouped LayerNorm backward's two shares of a row): each half
# holds a value's bits XOR PAIR_MASK, a NaN pattern no value has once its NaNs are made the
# canonical 0x7FC00000 (publish_pair), so a published word is never 0, and a reader needs no
# tag: half the words, atomics and polls of two tagged words.
PAIR_MASK = gl.constexpr(0x7F800001)


@gluon.jit
def _pair_half(value):
    value = gl.where(value == value, value, float("nan"))
    return (value.to(gl.uint32, bitcast=True) ^ PAIR_MASK).to(gl.int64)


@gluon.jit
def publish_pair(WORDS, index, low, high):
    """WORDS[index] = the word of fp32 values `low` and `high` (WORDS int64, zeroed by the
    op)."""
    gl.atomic_xchg(WORDS + index, _pair_half(low) | (_pair_half(high) << 32), sem="relaxed",
                   scope="gpu")


@gluon.jit
def read_pairs(WORDS, first, count, MAX_COUNT: gl.constexpr):
    """collect_pairs' first read of WORDS[first + i], i < count, as (words, ptrs, live):
    issued early, its L2 round trip overlaps the caller's work until finish_pairs (the
    grouped LayerNorm backward)."""
    i = gl.arange(0, MAX_COUNT, gl.BlockedLayout([MAX_COUNT // 32], [32], [gl.num_warps()],
                                                 [0]))
    live = i < count
    ptrs = WORDS + first + i
    return gl.load(ptrs, mask=live, other=-1, volatile=True), ptrs, live


@gluon.jit
def finish_pairs(words, ptrs, live):
    """collect_pairs from its first read (read_pairs): polls until every word is published."""
    while gl.min((words != 0).to(gl.int32), axis=0) == 0:
        words = gl.load(ptrs, mask=live, other=-1, volatile=True)
    low = (words.to(gl.uint32) ^ PAIR_MASK).to(gl.float32, bitcast=True)
    high = ((words >> 32).to(gl.uint32) ^ PAIR_MASK).to(gl.float32, bitcast=True)
    return gl.where(live, low, 0.0), gl.where(live, high, 0.0)


@gluon.jit
def collect_pairs(WORDS, first, count, MAX_COUNT: gl.constexpr):
    """(lows, highs): the two fp32 values of WORDS[first + i] for i < count as [MAX_COUNT]
    tensors (0.0 in the lanes past count), once all of them are published (publish_pair).
    Every warp polls on its own, as in collect_words."""
    words, ptrs, live = read_pairs(WORDS, first, count, MAX_COUNT)
    return finish_pairs(words, ptrs, live)


@gluon.jit
def stage_slice(buf, ptrs):
    """Copies one slice (`ptrs`: its addresses in buf's load layout) into the 1-D shared
    buffer `buf` and waits: before a ring starts, whose wait counts assume no other copy."""
    cp.async_copy_global_to_shared(buf, ptrs)
    cp.commit_group()
    cp.wait_group(0)


@gluon.jit
def slice_weight(buf, w, layout: gl.constexpr, SHARED: gl.constexpr):
    """A grouped program's slice of the weights as fp32: from its staged copy `buf`
    (SHARED), else `w`, held in registers."""
    if SHARED:
        return widen(buf.load(layout))
    else:
        return w


@gluon.jit
def widen(v):
    """v as fp32. For bf16, two elements a 32-bit register become fp32 by one shift and one
    mask (ptxas's own conversion spends a PRMT and a shift on the upper one: 1.5 instructions
    an element, a quarter of the grouped LayerNorm backward's loop)."""
    if v.dtype == gl.bfloat16:
        return gl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }",
                                         "=r,=r,r", [v], dtype=gl.float32, is_pure=True,
                                         pack=2)
    else:
        return v.to(gl.float32)


@gluon.jit
def pair_ring(A, B, SLOTS: gl.constexpr, BLOCK_N: gl.constexpr):
    """The two rings of a grouped program (x and dy): SLOTS row slices of BLOCK_N elements
    each, in A's and B's dtypes."""
    ring_a = gl.allocate_shared_memory(A.dtype.element_ty, [SLOTS, BLOCK_N], RING_LAYOUT)
    ring_b = gl.allocate_shared_memory(B.dtype.element_ty, [SLOTS, BLOCK_N], RING_LAYOUT)
    return ring_a, ring_b


@gluon.jit
def group_slice(n_cols, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """(split, n_groups, group, part, cols) of a grouped norm backward's program: its row
    group of split = n_cols / BLOCK_N consecutive programs, its part in it, and the columns
    `cols` of its slice (in `layout`)."""
    split = n_cols // BLOCK_N
    n_groups = gl.num_programs(0) // split
    group = gl.program_id(0) // split
    part = gl.program_id(0) % split
    cols = part * BLOCK_N + gl.arange(0, BLOCK_N, layout)
    return split, n_groups, group, part, cols


@gluon.jit
def start_pair_ring(ring_a, ring_b, A, B, stride_a, stride_b, n_rows, group, n_groups, cols,
                    SLOTS: gl.constexpr):
    """Issues rows 0 .. SLOTS-1 of a grouped program's sequence (issue_pair)."""
    for t in gl.static_range(SLOTS):
        issue_pair(ring_a, ring_b, A, B, stride_a, stride_b, n_rows, t, group, n_groups, cols,
                   SLOTS)


@gluon.jit
def issue_row(ring, A, stride_a, n_rows, t, group, n_groups, cols, SLOTS: gl.constexpr):
    """Row t of a grouped program's sequence (row group + t * n_groups): its slice `cols` of
    A into slot t % SLOTS of the ring, one cp.async group; a row past n_rows is zero-filled,
    not read (the grouped forwards' x)."""
    row = group + t * n_groups
    cp.async_copy_global_to_shared(ring.index(t % SLOTS), A + row.to(gl.int64) * stride_a + cols,
                                   mask=row < n_rows)
    cp.commit_group()


@gluon.jit
def issue_pair(ring_a, ring_b, A, B, stride_a, stride_b, n_rows, t, group, n_groups, cols,
               SLOTS: gl.constexpr):
    """Row t of a grouped program's sequence (row group + t * n_groups): its slices `cols` of
    A and B (x and dy) into slot t % SLOTS of their rings, one cp.async group; rows past
    n_rows are zero-filled, not read."""
    row = group + t * n_groups
    live = row < n_rows
    cp.async_copy_global_to_shared(ring_a.index(t % SLOTS),
                                   A + row.to(gl.int64) * stride_a + cols, mask=live)
    cp.async_copy_global_to_shared(ring_b.index(t % SLOTS),
                                   B + row.to(gl.int64) * stride_b + cols, mask=live)
    cp.commit_group()


@gluon.jit
def last_of_slice(SYNC, part, arrivals):
    """Counts this program in SYNC[part] (zeroed by the op) after its atomic adds into a
    slice's sums; whether it is the last of the `arrivals` programs of that slice, which
    then sees every program's adds (acq_rel) and writes the totals (write_total)."""
    gl.thread_barrier()  # every thread's adds before the one release
    return gl.atomic_add(SYNC + part, 1, sem="acq_rel", scope="gpu") == arrivals - 1


@gluon.jit
def write_total(ACC, OUT, cols):
    """OUT[cols] = the fp32 sums ACC[cols] in OUT's dtype (.cg: read at L2, where the atomic
    adds were made)."""
    total = gl.load(ACC + cols, cache_modifier=".cg")
    gl.store(OUT + cols, total.to(OUT.dtype.element_ty))
