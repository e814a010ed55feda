"""RMSNorm forward and backward, with an optional fused residual add.

y = (s * rstd) * (offset + w),  rstd = 1 / sqrt(mean(s^2) + eps)
s = x                          (plain RMSNorm, has_residual = 0)
s = x + r, also stored to S    (fused residual add, has_residual = 1)

A program handles BLOCK_M rows of BLOCK_N columns. When a row fits in BLOCK_N it stays in
registers (one read of x); longer rows loop over BLOCK_N chunks (two reads of x, the second
mostly from L2). Casting modes follow Liger-Kernel: 0 llama (normalize in fp32, cast to the
input dtype, then multiply by the weight), 1 gemma (everything in fp32), 2 none (input dtype).

The residual add and the residual gradient are runtime flags (a uniform branch, no extra
variants). Whole-row configs wider than RESIDUAL_MAX_BLOCK_N (forward) or DRES_MAX_BLOCK_N
(backward) have the residual path compiled out to stay within registers; spec.py's rules
never send fused calls to them.

Backward: dx = rstd * (dy*w' - s*rstd^2*mean(dy*w'*s)) (+ dres, the gradient of the residual
output, when has_dres). DX may be DY's own buffer (in-place backward) except in the interleaved
layout (CHUNK_ROWS > 0): elsewhere every element of dy is read before the same thread writes
dx at that element, there column programs read dy after row programs wrote dx.
"""
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from . import spec
from .. import staged_rows

# widest whole-row tile that keeps the fused residual path (a global must be a constexpr)
RESIDUAL_MAX_BLOCK_N = tl.constexpr(spec.RESIDUAL_MAX_BLOCK_N)
DRES_MAX_BLOCK_N = tl.constexpr(spec.DRES_MAX_BLOCK_N)
# the column programs' tile in the interleaved backward (the op sizes the grid with it)
SUM_BLOCK_M = tl.constexpr(spec.SUM_BLOCK_M)
SUM_BLOCK_N = tl.constexpr(spec.SUM_BLOCK_N)
MAX_GROUPED_SPLIT = gl.constexpr(spec.MAX_GROUPED_SPLIT)  # programs a row, grouped backward


@triton.jit
def _round(v, P):
    """v (fp32) rounded to P's element type and back: reproduces a cast point exactly."""
    return v.to(P.dtype.element_ty).to(tl.float32)


@triton.jit
def _normalize(xf, w, rstd, offset, Y, CASTING: tl.constexpr):
    # Arithmetic stays in fp32; rounding to Y's dtype only reproduces each mode's cast points
    # (a bf16 product of two bf16 values is the fp32 product rounded once, so this matches).
    if CASTING == 0:
        y = _round(xf * rstd, Y) * _round(w.to(tl.float32) + offset, Y)
    elif CASTING == 1:
        y = xf * rstd * (w.to(tl.float32) + offset)
    else:
        y = _round(xf * _round(rstd, Y), Y) * _round(w.to(tl.float32) + offset, Y)
    return y


@triton.jit
def _load_sum(x_ptrs, r_ptrs, s_ptrs, mask, has_residual, STORE: tl.constexpr,
              RESIDUAL: tl.constexpr, EVICT: tl.constexpr, STORE_EVICT: tl.constexpr):
    """x as fp32; with has_residual, s = x + r rounded to the data dtype (and stored to S
    when STORE). The branch merges values in the data dtype (half the registers of fp32 for
    bf16/fp16). RESIDUAL=False compiles the residual path out. Tensors of every pointer share
    one layout. EVICT: the loads' L2 eviction policy ("" for the default), STORE_EVICT the
    store's."""
    x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy=EVICT)
    if RESIDUAL:
        if has_residual != 0:
            r = tl.load(r_ptrs, mask=mask, other=0.0, eviction_policy=EVICT)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
            if STORE:
                tl.store(s_ptrs, x, mask=mask, eviction_policy=STORE_EVICT)
    return x.to(tl.float32)


@triton.jit
def _sum_sq_by_blocks(x_row, r_row, s_row, row_mask, cols, n_cols, BLOCK_N: tl.constexpr,
                      STAGES: tl.constexpr, RESIDUAL: tl.constexpr, STORE_EVICT: tl.constexpr):
    """Pass 1 of the looped forward by BLOCK_N column blocks, summed per lane and reduced
    once: the rows' sums of squares (s = x + r stored with the residual)."""
    acc = tl.zeros([row_mask.shape[0], BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
        c = (start + cols)[None, :]
        mask = row_mask[:, None] & (c < n_cols)
        xf = _load_sum(x_row + c, r_row + c, s_row + c, mask, 1, True, RESIDUAL, "evict_last",
                       STORE_EVICT)
        acc += xf * xf
    return tl.sum(acc, axis=1)


@triton.jit
def _looped_rows(x_row, r_row, s_row, y_row, W, row_mask, cols, n_cols, eps, offset, Y,
                 CASTING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 STAGES: tl.constexpr, RESIDUAL: tl.constexpr, PASS1_BLOCK: tl.constexpr):
    """The forward of BLOCK_M rows longer than BLOCK_N, in two passes over column blocks;
    returns rstd. RESIDUAL is a compile-time copy of the runtime flag, so neither loop body
    branches: ptxas then unrolls the loops and keeps several loads in flight (Inductor's
    looped 32K forward, the same two passes, read 90% of copy on an H200 against 81% for
    this kernel with the branch inside, which issued one load a step).
    Pass 2 re-reads the row: pass 1 asks L2 to keep it (evict_last) and pass 2 to drop it
    once read (evict_first), so rows still waiting for pass 2 stay cached (a minimal looped
    kernel went 59-62% -> 71-73% of copy at 32K-64K, benchmarks/experiment_norm_hints.py).
    PASS1_BLOCK > BLOCK_N (the tuned bucket): pass 1 loads rows of up to PASS1_BLOCK columns
    whole, at once, and longer ones by BLOCK_N blocks."""
    # With the residual, s and y are stored evict_first (not read again here), which leaves
    # L2 to the rows pass 2 re-reads: H200, 1024 x 65536, 79 -> 82% of copy, DRAM reads
    # 1.37 -> 1.25x of x and r. On the plain forward the same hint lost 1.5 points at 32K and
    # won 2 at 64K (one config serves both), so it stays off there.
    STORE_EVICT: tl.constexpr = "evict_first" if RESIDUAL else ""
    if PASS1_BLOCK > BLOCK_N:
        if n_cols <= PASS1_BLOCK:
            # The row's loads go out back to back, and their registers are free again for
            # pass 2. H200, minimal kernels at 2048 x 32768 on 4096 x 32 warps: 74.8 -> 87.4%
            # of copy (torch.compile, which unrolls its pass 1 whole: 89.7%); the same load
            # in a loop of one trip (runtime count) 82.3%, and this kernel's first form, such
            # a loop, 77.4% (benchmarks/experiment_norm_fwd_pass1.py): so no loop here.
            wide = tl.arange(0, PASS1_BLOCK)[None, :]
            mask = row_mask[:, None] & (wide < n_cols)
            xf = _load_sum(x_row + wide, r_row + wide, s_row + wide, mask, 1, True, RESIDUAL,
                           "evict_last", STORE_EVICT)
            sum_sq = tl.sum(xf * xf, axis=1)
        else:
            sum_sq = _sum_sq_by_blocks(x_row, r_row, s_row, row_mask, cols, n_cols, BLOCK_N,
                                       STAGES, RESIDUAL, STORE_EVICT)
    else:
        sum_sq = _sum_sq_by_blocks(x_row, r_row, s_row, row_mask, cols, n_cols, BLOCK_N,
                                   STAGES, RESIDUAL, STORE_EVICT)
    rstd = 1.0 / tl.sqrt(sum_sq / n_cols + eps)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
        c1 = start + cols
        c = c1[None, :]
        mask = row_mask[:, None] & (c < n_cols)
        # recomputes s = x + r (same rounding) rather than reading S back
        xf = _load_sum(x_row + c, r_row + c, s_row + c, mask, 1, False, RESIDUAL,
                       "evict_first", "")
        w = tl.load(W + c1, mask=c1 < n_cols, other=0.0)
        y = _normalize(xf, w[None, :], rstd[:, None], offset, Y, CASTING)
        tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=mask, eviction_policy=STORE_EVICT)
    return rstd


@triton.jit
def _fwd_block(block, cols, Y, X, W, RSTD, n_rows, n_cols, stride_y, stride_x, eps, offset,
               S, R, stride_s, stride_r, has_residual, store_stats, CASTING: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr,
               STAGES: tl.constexpr, PASS1_BLOCK: tl.constexpr, EXACT_N: tl.constexpr):
    """The forward of row block `block` (BLOCK_M rows); cols = tl.arange(0, BLOCK_N)."""
    # block * BLOCK_M < n_rows fits int32; rows in int64 for the address arithmetic
    rows = tl.arange(0, BLOCK_M).to(tl.int64) + block * BLOCK_M
    row_mask = rows < n_rows
    if EXACT_N:  # rows of exactly PASS1_BLOCK columns (kernel_src/spec.py, exact_length)
        tl.static_assert(LOOP and PASS1_BLOCK > BLOCK_N)
        n_cols = PASS1_BLOCK
        if BLOCK_M == 1:  # a program's one row is always there
            row_mask = tl.full([BLOCK_M], 1, tl.int1)
    x_row = X + rows[:, None] * stride_x
    y_row = Y + rows[:, None] * stride_y
    s_row = S + rows[:, None] * stride_s
    r_row = R + rows[:, None] * stride_r
    if not LOOP:
        c = cols[None, :]
        mask = row_mask[:, None] & (c < n_cols)
        # the widest whole-row configs have no registers to spare: no residual path
        # there (spec.select_config sends fused calls of longer rows to looped configs)
        xf = _load_sum(x_row + c, r_row + c, s_row + c, mask, has_residual, True,
                       BLOCK_N <= RESIDUAL_MAX_BLOCK_N, "", "")
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / n_cols + eps)
        w = tl.load(W + cols, mask=cols < n_cols, other=0.0)
        y = _normalize(xf, w[None, :], rstd[:, None], offset, Y, CASTING)
        tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=mask)
    else:
        # One pair of loops per value of the residual flag: a runtime branch inside a loop
        # body kept ptxas from unrolling it (one load in flight a step; see the helper).
        # The residual's pass 1 stays by BLOCK_N chunks: a whole row of x and r took the
        # kernel (both paths) from 32 to 43-56 registers a thread (sm90 ptxas, 16K-64K).
        if has_residual != 0:
            rstd = _looped_rows(x_row, r_row, s_row, y_row, W, row_mask, cols, n_cols,
                                eps, offset, Y, CASTING, BLOCK_M, BLOCK_N, STAGES, True, 0)
        else:
            rstd = _looped_rows(x_row, r_row, s_row, y_row, W, row_mask, cols, n_cols,
                                eps, offset, Y, CASTING, BLOCK_M, BLOCK_N, STAGES, False,
                                PASS1_BLOCK)
    if store_stats != 0:
        tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def rms_norm_fwd(Y, X, W, RSTD, n_rows, n_cols, stride_y, stride_x, eps, offset,
                 S, R, stride_s, stride_r, has_residual, store_stats,
                 CASTING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 LOOP: tl.constexpr, STAGES: tl.constexpr, PROGRAMS_PER_SM: tl.constexpr,
                 PASS1_BLOCK: tl.constexpr = 0, EXACT_N: tl.constexpr = 0):
    """Programs stride over blocks of BLOCK_M rows. PROGRAMS_PER_SM is read by the op only:
    0 launches one program per block, k > 0 about k per SM (persistent), whose block loop
    keeps STAGES blocks' loads in flight. Looped rows pipeline their column loops instead;
    PASS1_BLOCK is their pass 1's chunk (0: BLOCK_N; see _looped_rows). EXACT_N 1: rows of
    exactly PASS1_BLOCK columns, that length compiled in (n_cols unread; see
    kernel_src/spec.py, exact_length). store_stats 0: rstd is not written (no backward will
    read it; LayerNorm's two such stores a row cost its forward 1-2% at 1K-2K columns on an
    H100, session 41)."""
    # cols and n_blocks outside the block loop, as before it moved into _fwd_block: the
    # whole-row tiles of several rows keep their sm90 machine code that way
    cols = tl.arange(0, BLOCK_N)
    if LOOP and PROGRAMS_PER_SM == 0:
        # Looped rows, one program per row: no block loop around them. Inside a loop the
        # row sum's shared-memory scratch takes one more barrier a row (sm90 SASS: 3 -> 2),
        # and an H200 read 2048 x 32768 at 85% of copy without it, 83% with. Whole rows keep
        # the loop: without it the 1K and 8K forwards lost 2-3 points.
        _fwd_block(tl.program_id(0), cols, Y, X, W, RSTD, n_rows, n_cols, stride_y, stride_x,
                   eps, offset, S, R, stride_s, stride_r, has_residual, store_stats, CASTING,
                   BLOCK_M, BLOCK_N, LOOP, STAGES, PASS1_BLOCK, EXACT_N)
    else:
        n_blocks = tl.cdiv(n_rows, BLOCK_M)
        for block in tl.range(tl.program_id(0), n_blocks, tl.num_programs(0),
                              num_stages=1 if LOOP else STAGES):
            _fwd_block(block, cols, Y, X, W, RSTD, n_rows, n_cols, stride_y, stride_x, eps,
                       offset, S, R, stride_s, stride_r, has_residual, store_stats, CASTING,
                       BLOCK_M, BLOCK_N, LOOP, STAGES, PASS1_BLOCK, EXACT_N)


@triton.jit
def _add_partial_and_finish(ACC, DW, SYNC, part, cols, col_mask, arrivals):
    """Adds this program's column sums `part` into the fp32 row ACC (zeroed by the caller)
    and counts the program in SYNC[0] (zeroed too); the last of the `arrivals` programs
    that call this writes ACC rounded to DW's dtype. This replaces a [programs, n] partial
    buffer, a reduction over it and a cast (two more launches) by n atomic adds a program.
    The order of the sums varies from run to run, so the op takes this path only when
    torch's deterministic mode is off.
    The LayerNorm family has a twin for two gradients (families do not share kernel source:
    the build keys artifacts by each family's own file)."""
    tl.atomic_add(ACC + cols, part, mask=col_mask, sem="relaxed")
    tl.debug_barrier()  # every thread's adds come before the one release below
    ticket = tl.atomic_add(SYNC, 1, sem="acq_rel")
    if ticket == arrivals - 1:
        # .cg: read the totals at L2, where the atomics were performed
        total = tl.load(ACC + cols, mask=col_mask, other=0.0, cache_modifier=".cg")
        tl.store(DW + cols, total.to(DW.dtype.element_ty), mask=col_mask)


@triton.jit
def _looped_rows_bwd(DX, dw_row, DY, X, W, RSTD, DRES, rows, live, cols, n_cols, stride_dx,
                     stride_dy, stride_x, stride_dres, offset, has_dres,
                     CASTING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     STAGES: tl.constexpr, ADD_DW: tl.constexpr, FIRST_READ: tl.constexpr):
    """dx of the rows `rows` (live: those to compute), longer than BLOCK_N: pass 1 takes each
    row's dot over its column blocks, pass 2 writes dx. With ADD_DW, pass 2 also adds each
    block's column sums of dy * xhat to the fp32 row dw_row in global memory (one
    read-modify-write per column block for BLOCK_M rows). FIRST_READ: pass 1's L2 eviction
    policy."""
    rstd = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
    x_rows = X + rows[:, None] * stride_x
    dy_rows = DY + rows[:, None] * stride_dy
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for c0 in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
        c = (c0 + cols)[None, :]
        mask = live[:, None] & (c < n_cols)
        w = tl.load(W + c, mask=c < n_cols, other=0.0).to(tl.float32) + offset
        xf = tl.load(x_rows + c, mask=mask, other=0.0,
                     eviction_policy=FIRST_READ).to(tl.float32)
        dyf = tl.load(dy_rows + c, mask=mask, other=0.0,
                      eviction_policy=FIRST_READ).to(tl.float32)
        acc += dyf * w * xf
    dot = tl.sum(acc, axis=1)[:, None] / n_cols
    # pass 2 walks the column blocks backwards: the last ones pass 1 read are the
    # likeliest still cached (H200: 3-5% faster at 32K-64K; the forwards lost 2-10%)
    n_blocks = tl.cdiv(n_cols, BLOCK_N)
    for back in tl.range(0, n_blocks, num_stages=STAGES):
        c0 = (n_blocks - 1 - back) * BLOCK_N
        # [1, BLOCK_N] columns (not a vector) keep w and the partial row in the
        # tile's layout: no layout conversions through shared memory
        c = (c0 + cols)[None, :]
        col_mask = c < n_cols
        mask = live[:, None] & col_mask
        w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32) + offset
        x = tl.load(x_rows + c, mask=mask, other=0.0)
        xf = x.to(tl.float32)
        dyf = tl.load(dy_rows + c, mask=mask, other=0.0).to(tl.float32)
        dx = rstd * (dyf * w - xf * rstd * rstd * dot)
        # dres and dx pass through L2 once: evict_first leaves it to x and dy, which the
        # interleaved layout's column programs read again (H200, fused add 4096 x 16384: DRAM
        # reads 1.20 -> 1.06x the floor, 67 -> 70% of copy)
        if has_dres != 0:
            dx += tl.load(DRES + rows[:, None] * stride_dres + c, mask=mask, other=0.0,
                          eviction_policy="evict_first").to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + c, dx.to(DX.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first")
        if ADD_DW:
            if CASTING == 0:
                xhat = (xf * rstd).to(x.dtype).to(tl.float32)
            else:
                xhat = xf * rstd
            # dead rows loaded dy = 0: they add nothing to the column sums
            dw = tl.load(dw_row + c, mask=col_mask, other=0.0)
            tl.store(dw_row + c, dw + tl.sum(dyf * xhat, axis=0, keep_dims=True),
                     mask=col_mask)


@triton.jit
def _column_sums_bwd(DY, X, RSTD, first, last, cols, col_mask, stride_dy, stride_x,
                     CASTING: tl.constexpr, STAGES: tl.constexpr):
    """sum(dy * xhat) over rows [first, last) of the columns `cols` (fp32, [SUM_BLOCK_N]),
    SUM_BLOCK_M rows a step. The loads ask L2 to drop the lines (the interleaved layout's
    last reader)."""
    dw = tl.zeros([SUM_BLOCK_M, SUM_BLOCK_N], dtype=tl.float32)
    for step in tl.range(first, last, SUM_BLOCK_M, num_stages=STAGES):
        rows = step + tl.arange(0, SUM_BLOCK_M)
        live = rows < last
        mask = live[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first")
        dyf = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0,
                      eviction_policy="evict_first").to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
        if CASTING == 0:
            xhat = (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
        else:
            xhat = x.to(tl.float32) * rstd
        dw += dyf * xhat  # dead rows and columns loaded dy = 0
    return tl.sum(dw, axis=0)


@triton.jit
def rms_norm_bwd(DX, DW_PARTIAL, DY, X, W, RSTD, n_rows, n_cols, stride_dx, stride_dy,
                 stride_x, offset, rows_per_program, DRES, stride_dres, has_dres,
                 DW, SYNC, atomic_dw,
                 CASTING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 LOOP: tl.constexpr, STAGES: tl.constexpr, PROGRAMS_PER_SM: tl.constexpr,
                 CHUNK_ROWS: tl.constexpr):
    """dx = rstd * (dy*w' - xhat * mean(dy*w'*xhat)) [+ dres], w' = offset + w.
    Each program owns rows_per_program consecutive rows and sums dw = sum(dy * xhat) over
    them in fp32. It writes that partial to DW_PARTIAL[pid, :] for the host to sum
    (deterministic); or, with atomic_dw (whole rows, interleaved), adds it into the zeroed
    fp32 row DW_PARTIAL[0, :], and the last program to finish writes the total to DW in DX's
    dtype (see _add_partial_and_finish). The op launches about PROGRAMS_PER_SM programs per
    SM; STAGES row blocks' (whole rows) or column blocks' (looped rows) loads are in flight
    per program.
    Interleaved (looped rows, CHUNK_ROWS > 0): the grid walks chunks of CHUNK_ROWS rows; a
    chunk's row programs (BLOCK_M rows each) write its dx, then its column programs
    (SUM_BLOCK_N columns each) sum its dw, each into DW_PARTIAL[chunk, :] (deterministic) or
    with atomic_dw into the zeroed row as above, SYNC then holding a counter per column
    block. Programs start about in grid order, so the column programs read the chunk's x and
    dy while L2 still holds them, and no program read-modify-writes a partial row per column
    block (H200, 2048 x 32768: 0.213 -> 0.154 ms against the persistent looped layout;
    benchmarks/experiment_norm_bwd_split.py). rows_per_program is unused there."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    # Whole rows of 16K elements and more read x and dy twice, the second time from cache,
    # rather than hold them across the row's sum: that spilled (sm90, 16 warps: 184 bytes a
    # thread -> none; an H200 ran 4096 x 16384 in 0.172 -> 0.136 ms). The two loads differ
    # in their eviction hint, so the compiler cannot merge them back into one.
    REREAD: tl.constexpr = BLOCK_M * BLOCK_N >= 16384
    FIRST_READ: tl.constexpr = "evict_last" if REREAD else ""
    first = pid.to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    dw_row = DW_PARTIAL + pid.to(tl.int64) * n_cols
    if not LOOP:
        col_mask = cols < n_cols
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        # Software pipelining through shared memory: 3 stages took 16384 x 4096 from 65% to
        # 80% of copy on an H200 (docs/perf-notes.md).
        for step in tl.range(0, rows_per_program, BLOCK_M, num_stages=STAGES):
            rows = first + step + tl.arange(0, BLOCK_M)
            mask = (rows < last)[:, None] & col_mask[None, :]
            c = cols[None, :]
            x_ptrs = X + rows[:, None] * stride_x + c
            dy_ptrs = DY + rows[:, None] * stride_dy + c
            x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy=FIRST_READ)
            dyf = tl.load(dy_ptrs, mask=mask, other=0.0,
                          eviction_policy=FIRST_READ).to(tl.float32)
            rstd = tl.load(RSTD + rows, mask=rows < last, other=0.0)[:, None]
            xf = x.to(tl.float32)
            dot = tl.sum(dyf * w[None, :] * xf, axis=1)[:, None] / n_cols
            if REREAD:
                # x and dy again (see REREAD)
                x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
                dyf = tl.load(dy_ptrs, mask=mask, other=0.0,
                              eviction_policy="evict_first").to(tl.float32)
                xf = x.to(tl.float32)
            if CASTING == 0:
                xhat = (xf * rstd).to(x.dtype).to(tl.float32)
            else:
                xhat = xf * rstd
            dyw = dyf * w[None, :]
            dx = rstd * (dyw - xf * rstd * rstd * dot)
            # as in the forward: wider whole-row configs have no dres path (see the spec)
            if BLOCK_N <= DRES_MAX_BLOCK_N:
                if has_dres != 0:
                    dx += tl.load(DRES + rows[:, None] * stride_dres + c, mask=mask,
                                  other=0.0).to(tl.float32)
            tl.store(DX + rows[:, None] * stride_dx + c, dx.to(DX.dtype.element_ty), mask=mask)
            dw += dyf * xhat
        if atomic_dw != 0:
            _add_partial_and_finish(DW_PARTIAL, DW, SYNC, tl.sum(dw, axis=0), cols, col_mask,
                                    tl.num_programs(0))
        else:
            tl.store(dw_row + cols, tl.sum(dw, axis=0), mask=col_mask)
    elif CHUNK_ROWS == 0:
        # Long rows, BLOCK_M at a time, each program with its own fp32 partial row.
        for c0 in range(0, n_cols, BLOCK_N):
            c = c0 + cols
            tl.store(dw_row + c, tl.zeros([BLOCK_N], dtype=tl.float32), mask=c < n_cols)
        for step in range(0, rows_per_program, BLOCK_M):
            rows = first + step + tl.arange(0, BLOCK_M)
            # masks rows past the program's run (and past n_rows)
            _looped_rows_bwd(DX, dw_row, DY, X, W, RSTD, DRES, rows, rows < last, cols,
                             n_cols, stride_dx, stride_dy, stride_x, stride_dres, offset,
                             has_dres, CASTING, BLOCK_M, BLOCK_N, STAGES, True, "")
    else:
        # Interleaved (see the docstring): the grid is chunks of CHUNK_ROWS rows, each
        # CHUNK_ROWS // BLOCK_M row programs followed by cdiv(n_cols, SUM_BLOCK_N) column
        # programs.
        row_programs: tl.constexpr = CHUNK_ROWS // BLOCK_M
        column_programs = tl.cdiv(n_cols, SUM_BLOCK_N)
        # int64: the partial rows' offsets (chunk * n_cols) can pass 2^31
        chunk = (pid // (row_programs + column_programs)).to(tl.int64)
        task = pid % (row_programs + column_programs)
        chunk_first = chunk * CHUNK_ROWS
        if task < row_programs:
            rows = chunk_first + task * BLOCK_M + tl.arange(0, BLOCK_M)
            _looped_rows_bwd(DX, dw_row, DY, X, W, RSTD, DRES, rows, rows < n_rows, cols,
                             n_cols, stride_dx, stride_dy, stride_x, stride_dres, offset,
                             has_dres, CASTING, BLOCK_M, BLOCK_N, STAGES, False, "evict_last")
        else:
            sum_cols = (task - row_programs) * SUM_BLOCK_N + tl.arange(0, SUM_BLOCK_N)
            sum_mask = sum_cols < n_cols
            part = _column_sums_bwd(DY, X, RSTD, chunk_first,
                                    tl.minimum(chunk_first + CHUNK_ROWS, n_rows), sum_cols,
                                    sum_mask, stride_dy, stride_x, CASTING, STAGES)
            if atomic_dw != 0:
                # SYNC holds a counter per column block: its last chunk writes its dw
                _add_partial_and_finish(DW_PARTIAL, DW, SYNC + task - row_programs, part,
                                        sum_cols, sum_mask, tl.cdiv(n_rows, CHUNK_ROWS))
            else:
                tl.store(DW_PARTIAL + chunk * n_cols + sum_cols, part, mask=sum_mask)


# -- staged forward (Gluon, NVIDIA sm80+): configs with a STAGED key (spec.staged_twin) ------

@gluon.jit
def _round_staged(v, P):
    """_round in Gluon."""
    return v.to(P.dtype.element_ty).to(gl.float32)


@gluon.jit
def _weight_factor_staged(w, offset, Y, CASTING: gl.constexpr):
    """w + offset as _normalize multiplies by it: rounded to Y's dtype but in mode 1."""
    factor = w.to(gl.float32) + offset
    if CASTING != 1:
        factor = _round_staged(factor, Y)
    return factor


@gluon.jit
def _scale_staged(xf, rstd, factor, Y, CASTING: gl.constexpr):
    """y from x, rstd and _weight_factor_staged's factor, with _normalize's cast points."""
    if CASTING == 0:
        y = _round_staged(xf * rstd, Y) * factor
    elif CASTING == 1:
        y = xf * rstd * factor
    else:
        y = _round_staged(xf * _round_staged(rstd, Y), Y) * factor
    return y


@gluon.jit
def _normalize_staged(xf, w, rstd, offset, Y, CASTING: gl.constexpr):
    """_normalize in Gluon (same cast points)."""
    return _scale_staged(xf, rstd, _weight_factor_staged(w, offset, Y, CASTING), Y, CASTING)


@gluon.jit
def rms_norm_fwd_staged(Y, X, W, RSTD, n_rows, n_cols, stride_y, stride_x, eps, offset,
                        S, R, stride_s, stride_r, has_residual, store_stats,
                        CASTING: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        LOOP: gl.constexpr, STAGES: gl.constexpr,
                        PROGRAMS_PER_SM: gl.constexpr, STAGED: gl.constexpr,
                        W_SHARED: gl.constexpr):
    """rms_norm_fwd for rows of at most STAGED x BLOCK_N columns, each read once through a
    ring of STAGES chunk buffers in shared memory (kernel_src/staged_rows.py); persistent
    programs (the op's grid: PROGRAMS_PER_SM an SM). W_SHARED: the weight row is staged in
    shared memory once per program, else each chunk of it is loaded a chunk ahead. No fused
    residual: S, R, stride_s, stride_r and has_residual are unused, and tune.py offers
    staged configs only to the plain forward's buckets."""
    layout: gl.constexpr = staged_rows.chunk_layout(gl.num_warps())
    ring = gl.allocate_shared_memory(X.dtype.element_ty, [STAGES, BLOCK_N],
                                     staged_rows.RING_LAYOUT)
    w_buf = gl.allocate_shared_memory(W.dtype.element_ty, [STAGED if W_SHARED else 1, BLOCK_N],
                                      staged_rows.RING_LAYOUT)
    offs = gl.arange(0, BLOCK_N, layout)
    if W_SHARED:
        staged_rows.stage_weights(w_buf, W, n_cols, offs, STAGED, BLOCK_N)
    staged_rows.start_ring(ring, X, stride_x, n_rows, n_cols, offs, STAGED, STAGES, BLOCK_N)
    pid = gl.program_id(0)
    for k in range(gl.cdiv(n_rows - pid, gl.num_programs(0))):
        row = pid + k * gl.num_programs(0)
        acc = gl.zeros([BLOCK_N], gl.float32, layout)
        for j in gl.static_range(STAGED):
            x = staged_rows.ring_chunk(ring, k, j, layout, STAGED, STAGES, True)
            acc += x * x
        rstd = 1.0 / gl.sqrt(gl.sum(acc, axis=0) / n_cols + eps)
        if store_stats != 0:
            gl.store(RSTD + row, rstd)
        y_row = Y + row.to(gl.int64) * stride_y
        w_next = staged_rows.weight_chunk(w_buf, W, n_cols, offs, 0, layout, W_SHARED, BLOCK_N)
        for j in gl.static_range(STAGED):
            x = staged_rows.take_chunk(ring, X, stride_x, n_rows, n_cols, k, j, offs, layout,
                                       STAGED, STAGES, BLOCK_N)
            w = w_next
            if j + 1 < STAGED:
                w_next = staged_rows.weight_chunk(w_buf, W, n_cols, offs, j + 1, layout,
                                                  W_SHARED, BLOCK_N)
            y = _normalize_staged(x, w, rstd, offset, Y, CASTING)
            cols = j * BLOCK_N + offs
            gl.store(y_row + cols, y.to(Y.dtype.element_ty), mask=cols < n_cols)
    staged_rows.finish_ring()


# -- grouped backward (Gluon, sm90): rows split over a group of programs ------------------
#
# The backwards of long rows read x and dy twice (looped) or pair row programs with column
# programs (interleaved): 53-74% of copy from 16K columns on an H200. Here a group of split =
# n_cols / BLOCK_N persistent programs takes rows g, g + n_groups, ...; program `part` owns
# the columns [part * BLOCK_N, (part + 1) * BLOCK_N) of every row of its group, so its slice
# of w and of the dw sum stay in registers for the whole kernel, and its slice of x and dy
# streams through a ring of SLOTS row slices in shared memory (cp.async), read from HBM once.
# A row's dot sum(dy * w' * x) is the sum of the group's shares, exchanged as tagged words
# (staged_rows.publish_word); the exchange runs a row behind: pass 1 of row k + 1 (its share
# published) comes before pass 2 of row k collects row k's, so the group's stragglers have a
# row's time to arrive. At the end each program adds its dw slice into a zeroed fp32 row, and
# the last of the n_groups programs of each slice writes it in W's dtype. H200, 2^26 bf16
# elements: 85% of copy at 16K-64K columns against 70 / 59 / 55% (docs/perf-notes.md,
# session 14). With HAS_DRES (the fused add's backward) pass 2 also adds the residual
# gradient, read from global memory: 90-92% of its 8-byte floor (session 15). The op takes it
# (rms_norm.py: grouped_applies) for RMSNorm and fused add backwards of 2-byte data on sm90
# in the aligned class, n_cols a multiple of BLOCK_N, outside torch's deterministic mode; its
# grid fits the GPU at once (tests/test_grouped_norms.py).

@gluon.jit
def _dot_share(ring_x, ring_dy, slot, w, layout: gl.constexpr):
    """This program's share of a row's sum(dy * w' * x), from the ring."""
    x = staged_rows.widen(ring_x.index(slot).load(layout))
    dy = staged_rows.widen(ring_dy.index(slot).load(layout))
    return gl.sum(dy * w * x, axis=0)


@gluon.jit
def rms_norm_bwd_grouped(DX, DW_SUM, DW, SYNC, WORDS, DY, X, W, RSTD, n_rows, n_cols,
                         stride_dx, stride_dy, stride_x, offset, DRES, stride_dres,
                         CASTING: gl.constexpr, BLOCK_N: gl.constexpr, SLOTS: gl.constexpr,
                         PROGRAMS_PER_SM: gl.constexpr, HAS_DRES: gl.constexpr):
    """rms_norm_bwd's function on the grouped layout (see above): dx = rstd * (dy*w' -
    x*rstd^2*mean(dy*w'*x)) (+ dres, read in pass 2, when HAS_DRES), dw = sum over rows of
    dy * xhat. DW_SUM (n_cols fp32), SYNC (split int32) and WORDS (n_rows * split int64)
    zeroed by the op; DX may be DY. The grid is whole groups, all resident (PROGRAMS_PER_SM:
    the op's grid)."""
    gl.static_assert(SLOTS >= 3)  # rows k and k + 1 held, one more streaming in
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [gl.num_warps()], [0])
    ring_x, ring_dy = staged_rows.pair_ring(X, DY, SLOTS, BLOCK_N)
    split, n_groups, group, part, cols = staged_rows.group_slice(n_cols, BLOCK_N, layout)
    staged_rows.start_pair_ring(ring_x, ring_dy, X, DY, stride_x, stride_dy, n_rows, group,
                                n_groups, cols, SLOTS)
    w = gl.load(W + cols).to(gl.float32) + offset
    dw = gl.zeros([BLOCK_N], gl.float32, layout)
    n_mine = gl.cdiv(n_rows - group, n_groups)
    cp.wait_group(SLOTS - 1)  # row 0 of the group (groups <= n_rows: there is one)
    dot = _dot_share(ring_x, ring_dy, 0, w, layout)
    if split > 1:
        staged_rows.publish_word(WORDS, group * split + part, dot)
    for k in range(n_mine):
        row = group + k * n_groups
        rstd = gl.load(RSTD + row)
        # pass 1 of row k + 1: SLOTS + k copies issued, rows k and k + 1 complete
        cp.wait_group(SLOTS - 2)
        dot_next = _dot_share(ring_x, ring_dy, (k + 1) % SLOTS, w, layout)
        if (split > 1) & (k + 1 < n_mine):
            staged_rows.publish_word(WORDS, (row + n_groups) * split + part, dot_next)
        if HAS_DRES:
            dres = gl.load(DRES + row.to(gl.int64) * stride_dres + cols)
        if split > 1:
            shares, _ = staged_rows.collect_words(WORDS, row * split, 1, split,
                                                  MAX_GROUPED_SPLIT)
            dot = gl.sum(shares, axis=0)
        # pass 2 of row k, its slot then refilled with row k + SLOTS
        x = staged_rows.widen(ring_x.index(k % SLOTS).load(layout))
        dy = staged_rows.widen(ring_dy.index(k % SLOTS).load(layout))
        staged_rows.issue_pair(ring_x, ring_dy, X, DY, stride_x, stride_dy, n_rows, k + SLOTS,
                               group, n_groups, cols, SLOTS)
        dx = rstd * (dy * w - x * (rstd * rstd * dot / n_cols))
        if HAS_DRES:
            dx += staged_rows.widen(dres)
        gl.store(DX + row.to(gl.int64) * stride_dx + cols, dx.to(DX.dtype.element_ty))
        if CASTING == 0:
            dw += dy * _round_staged(x * rstd, X)
        else:
            dw += dy * (x * rstd)
        dot = dot_next
    cp.wait_group(0)  # the ring's last copies (rows past the end)
    gl.atomic_add(DW_SUM + cols, dw, sem="relaxed", scope="gpu")
    if staged_rows.last_of_slice(SYNC, part, n_groups):
        staged_rows.write_total(DW_SUM, DW, cols)


# -- grouped forward (Gluon, sm90): the grouped backward's layout for y ---------------------
#
# The forwards of long rows read x twice (looped: pass 2 from L2) or stream one row through a
# program's ring (staged, 1-3 programs an SM of 8-32 warps): 80-87% of copy at 16K-64K
# columns on an H200. Here, as in rms_norm_bwd_grouped, program `part` of a group of split =
# n_cols / BLOCK_N owns a column slice of its group's rows: its slice of w stays in registers,
# its slice of x (and of the residual) streams through a ring, and the row's sum of squares
# is the sum of the group's shares (tagged words), collected a row behind.

@gluon.jit
def _grouped_input(ring_x, ring_r, slot, X, layout: gl.constexpr, HAS_RESIDUAL: gl.constexpr):
    """The normalized input s of a ring slot as fp32: x, or x + r rounded to X's dtype (the
    value S stores, as _load_sum)."""
    s = staged_rows.widen(ring_x.index(slot).load(layout))
    if HAS_RESIDUAL:
        s = _round_staged(s + staged_rows.widen(ring_r.index(slot).load(layout)), X)
    return s


@gluon.jit
def _grouped_issue(ring_x, ring_r, X, R, stride_x, stride_r, n_rows, t, group, n_groups, cols,
                   SLOTS: gl.constexpr, HAS_RESIDUAL: gl.constexpr):
    """Row t of the program's sequence into slot t % SLOTS: x's slice (and r's), one
    cp.async group; rows past n_rows zero-filled, not read."""
    if HAS_RESIDUAL:
        staged_rows.issue_pair(ring_x, ring_r, X, R, stride_x, stride_r, n_rows, t, group,
                               n_groups, cols, SLOTS)
    else:
        staged_rows.issue_row(ring_x, X, stride_x, n_rows, t, group, n_groups, cols, SLOTS)


@gluon.jit
def rms_norm_fwd_grouped(Y, RSTD, WORDS, X, W, n_rows, n_cols, stride_y, stride_x, eps, offset,
                         S, R, stride_s, stride_r, CASTING: gl.constexpr,
                         BLOCK_N: gl.constexpr, SLOTS: gl.constexpr,
                         PROGRAMS_PER_SM: gl.constexpr, HAS_RESIDUAL: gl.constexpr):
    """rms_norm_fwd on the grouped layout (above), HAS_RESIDUAL: the fused add (s = x + r,
    stored to S in pass 1). WORDS: n_rows * split int64, zeroed by the op. The grid is whole
    groups, all resident (PROGRAMS_PER_SM: the op's grid)."""
    gl.static_assert(SLOTS >= 3)  # rows k and k + 1 held, one more streaming in
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [gl.num_warps()], [0])
    ring_x = gl.allocate_shared_memory(X.dtype.element_ty, [SLOTS, BLOCK_N],
                                       staged_rows.RING_LAYOUT)
    ring_r = gl.allocate_shared_memory(X.dtype.element_ty,
                                       [SLOTS if HAS_RESIDUAL else 1,
                                        BLOCK_N if HAS_RESIDUAL else 8],
                                       staged_rows.RING_LAYOUT)
    split, n_groups, group, part, cols = staged_rows.group_slice(n_cols, BLOCK_N, layout)
    for t in gl.static_range(SLOTS):
        _grouped_issue(ring_x, ring_r, X, R, stride_x, stride_r, n_rows, t, group, n_groups,
                       cols, SLOTS, HAS_RESIDUAL)
    w = _weight_factor_staged(gl.load(W + cols), offset, Y, CASTING)  # once, not a row
    n_mine = gl.cdiv(n_rows - group, n_groups)
    cp.wait_group(SLOTS - 1)  # row 0 of the group (groups <= n_rows: there is one)
    s = _grouped_input(ring_x, ring_r, 0, X, layout, HAS_RESIDUAL)
    if HAS_RESIDUAL:
        gl.store(S + group.to(gl.int64) * stride_s + cols, s.to(S.dtype.element_ty))
    squares = gl.sum(s * s, axis=0)
    if split > 1:
        staged_rows.publish_word(WORDS, group * split + part, squares)
    for k in range(n_mine):
        row = group + k * n_groups
        nxt = row + n_groups
        # pass 1 of row k + 1: SLOTS + k copies issued, rows k and k + 1 complete
        cp.wait_group(SLOTS - 2)
        s_next = _grouped_input(ring_x, ring_r, (k + 1) % SLOTS, X, layout, HAS_RESIDUAL)
        squares_next = gl.sum(s_next * s_next, axis=0)
        if k + 1 < n_mine:
            if split > 1:
                staged_rows.publish_word(WORDS, nxt * split + part, squares_next)
            if HAS_RESIDUAL:
                gl.store(S + nxt.to(gl.int64) * stride_s + cols, s_next.to(S.dtype.element_ty))
        if split > 1:
            shares, _ = staged_rows.collect_words(WORDS, row * split, 1, split,
                                                  MAX_GROUPED_SPLIT)
            squares = gl.sum(shares, axis=0)
        # pass 2 of row k, its slot then refilled with row k + SLOTS
        s = _grouped_input(ring_x, ring_r, k % SLOTS, X, layout, HAS_RESIDUAL)
        _grouped_issue(ring_x, ring_r, X, R, stride_x, stride_r, n_rows, k + SLOTS, group,
                       n_groups, cols, SLOTS, HAS_RESIDUAL)
        rstd = 1.0 / gl.sqrt(squares / n_cols + eps)
        if part == 0:
            gl.store(RSTD + row, rstd)
        y = _scale_staged(s, rstd, w, Y, CASTING)
        gl.store(Y + row.to(gl.int64) * stride_y + cols, y.to(Y.dtype.element_ty))
        squares = squares_next
    cp.wait_group(0)  # the ring's last copies (rows past the end)
