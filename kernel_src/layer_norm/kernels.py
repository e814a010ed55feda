"""LayerNorm forward and backward.

y = (x - mean) * rstd * w (+ b),  mean = mean(x),  rstd = 1 / sqrt(mean((x - mean)^2) + eps)

A program handles BLOCK_M rows of BLOCK_N columns. When a row fits in BLOCK_N it stays in
registers (one read of x; exact two-step variance); longer rows loop over BLOCK_N chunks
(two reads of x) and take the variance from sums shifted by the row's first element, which
keeps the cancellation of E[x^2] - E[x]^2 small when |mean| >> std. The bias is a runtime flag.

Backward, xhat = (x - mean) * rstd, g = dy * w:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dw = sum over rows of dy * xhat,  db = sum over rows of dy
Each program owns rows_per_program consecutive rows and writes fp32 partials of dw and db to
row `pid` of DW_PARTIAL and DB_PARTIAL; the host sums the partials. Or, with atomic_dw (whole
rows, interleaved), programs add their partials into the zeroed fp32 rows DW_PARTIAL[0] and
DB_PARTIAL[0] and the last one writes the totals to DW and DB (see _add_partials_and_finish).
Rows of 16K-64K columns on sm90 take layer_norm_bwd_grouped (Gluon, at the end).
"""
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from . import spec
from .. import staged_rows

# the column programs' tile in the interleaved backward (the op sizes the grid with it)
SUM_BLOCK_M = tl.constexpr(spec.SUM_BLOCK_M)
SUM_BLOCK_N = tl.constexpr(spec.SUM_BLOCK_N)
MAX_GROUPED_SPLIT = gl.constexpr(spec.MAX_GROUPED_SPLIT)  # programs a row, grouped backward


@triton.jit
def _add_pairs(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit
def _shifted_sums_by_blocks(x_row, row_mask, cols, n_cols, shift, BLOCK_N: tl.constexpr,
                            STAGES: tl.constexpr):
    """Pass 1 of the looped forward by BLOCK_N column blocks: the rows' sums of x - shift and
    of its square ([BLOCK_M, 1] each), summed per lane and reduced once (one shared-memory
    round trip for both). x is kept in L2 for pass 2 (evict_last), which drops it."""
    acc1 = tl.zeros([row_mask.shape[0], BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([row_mask.shape[0], BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
        c = (start + cols)[None, :]
        mask = row_mask[:, None] & (c < n_cols)
        x = tl.load(x_row + c, mask=mask, other=0.0, eviction_policy="evict_last"
                    ).to(tl.float32)
        xs = tl.where(mask, x - shift, 0.0)
        acc1 += xs
        acc2 += xs * xs
    return tl.reduce((acc1, acc2), 1, _add_pairs, keep_dims=True)


@triton.jit
def _looped_normalize(x_row, y_row, Y, W, B, row_mask, cols, n_cols, mean, rstd,
                      BLOCK_N: tl.constexpr, STAGES: tl.constexpr, BIAS: tl.constexpr):
    """Pass 2 of the looped forward: y = (x - mean) * rstd * w (+ b when BIAS), x re-read
    from L2 and dropped once read (evict_first). BIAS is a compile-time copy of the runtime
    flag: a branch in the loop body kept ptxas from unrolling it (see the RMSNorm family's
    _looped_rows)."""
    for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
        c1 = start + cols
        c = c1[None, :]
        mask = row_mask[:, None] & (c < n_cols)
        x = tl.load(x_row + c, mask=mask, other=0.0, eviction_policy="evict_first"
                    ).to(tl.float32)
        w = tl.load(W + c1, mask=c1 < n_cols, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w[None, :]
        if BIAS:
            y += tl.load(B + c1, mask=c1 < n_cols, other=0.0).to(tl.float32)[None, :]
        tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _mean_rstd(shift, sum1, sum2, n_cols, eps):
    """A row's mean and 1 / std from its sums of x - shift and of their squares."""
    m1 = sum1 / n_cols
    var = tl.maximum(sum2 / n_cols - m1 * m1, 0.0)
    return shift + m1, 1.0 / tl.sqrt(var + eps)


@triton.jit
def _fwd_block(block, Y, X, W, B, MEAN, RSTD, n_rows, n_cols, stride_y, stride_x, eps,
               has_bias, store_stats, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               LOOP: tl.constexpr, STAGES: tl.constexpr, PASS1_BLOCK: tl.constexpr,
               EXACT_N: tl.constexpr, HOLD_ROW: tl.constexpr):
    """The forward of row block `block` (BLOCK_M rows)."""
    cols = tl.arange(0, BLOCK_N)
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
    # mean and rstd stay [BLOCK_M, 1] columns, in the layout the row sums come in
    if not LOOP:
        c = cols[None, :]
        mask = row_mask[:, None] & (c < n_cols)
        x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1, keep_dims=True) / n_cols
        xc = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1, keep_dims=True) / n_cols + eps)
        w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = xc * rstd * w[None, :]
        if has_bias != 0:
            y += tl.load(B + cols, mask=cols < n_cols, other=0.0).to(tl.float32)[None, :]
        tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=mask)
    elif HOLD_ROW:
        # rows of exactly PASS1_BLOCK columns, pass 2 from pass 1's registers instead of L2
        # (HOLD_KEY, kernel_src/spec.py); BLOCK_N is not used. A branch of its own: the
        # looped branch's whole-row pass 1 sits under a runtime length check whose row does
        # not outlive it, and making that check static would change the tuned kernels
        tl.static_assert(EXACT_N == 1)
        shift = tl.load(x_row, mask=row_mask[:, None], other=0.0).to(tl.float32)
        wide1 = tl.arange(0, PASS1_BLOCK)
        wide = wide1[None, :]
        mask = row_mask[:, None] & (wide < n_cols)
        x = tl.load(x_row + wide, mask=mask, other=0.0).to(tl.float32)
        xs = tl.where(mask, x - shift, 0.0)
        sum1, sum2 = tl.reduce((xs, xs * xs), 1, _add_pairs, keep_dims=True)
        mean, rstd = _mean_rstd(shift, sum1, sum2, n_cols, eps)
        y = (x - mean) * rstd * tl.load(W + wide1).to(tl.float32)[None, :]
        if has_bias != 0:
            y += tl.load(B + wide1).to(tl.float32)[None, :]
        tl.store(y_row + wide, y.to(Y.dtype.element_ty), mask=mask)
    else:
        shift = tl.load(x_row, mask=row_mask[:, None], other=0.0).to(tl.float32)
        # pass 1 keeps the row in L2 for pass 2 (evict_last), which drops it once read
        # (evict_first): see the RMSNorm family's looped forward
        if PASS1_BLOCK > BLOCK_N:
            if n_cols <= PASS1_BLOCK:
                # the tuned bucket's rows whole, at once and in no loop (see the RMSNorm
                # family's looped forward; H200, minimal kernels at 4096 x 16384 on 4096 x
                # 16 warps: 74.8 -> 87.1% of copy, torch.compile 85.9%, in a loop of one
                # trip 74.6%)
                wide = tl.arange(0, PASS1_BLOCK)[None, :]
                mask = row_mask[:, None] & (wide < n_cols)
                x = tl.load(x_row + wide, mask=mask, other=0.0, eviction_policy="evict_last"
                            ).to(tl.float32)
                xs = tl.where(mask, x - shift, 0.0)
                sum1, sum2 = tl.reduce((xs, xs * xs), 1, _add_pairs, keep_dims=True)
            else:
                sum1, sum2 = _shifted_sums_by_blocks(x_row, row_mask, cols, n_cols, shift,
                                                     BLOCK_N, STAGES)
        else:
            sum1, sum2 = _shifted_sums_by_blocks(x_row, row_mask, cols, n_cols, shift, BLOCK_N,
                                                 STAGES)
        mean, rstd = _mean_rstd(shift, sum1, sum2, n_cols, eps)
        if has_bias != 0:
            _looped_normalize(x_row, y_row, Y, W, B, row_mask, cols, n_cols, mean, rstd,
                              BLOCK_N, STAGES, True)
        else:
            _looped_normalize(x_row, y_row, Y, W, B, row_mask, cols, n_cols, mean, rstd,
                              BLOCK_N, STAGES, False)
    if store_stats != 0:
        if BLOCK_M == 1:
            # scalar stores: a [1] store converts its value through shared memory first
            tl.store(MEAN + block, tl.sum(tl.sum(mean, axis=1), axis=0))
            tl.store(RSTD + block, tl.sum(tl.sum(rstd, axis=1), axis=0))
        else:
            tl.store(MEAN + rows[:, None], mean, mask=row_mask[:, None])
            tl.store(RSTD + rows[:, None], rstd, mask=row_mask[:, None])


@triton.jit
def layer_norm_fwd(Y, X, W, B, MEAN, RSTD, n_rows, n_cols, stride_y, stride_x, eps, has_bias,
                   store_stats, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr,
                   STAGES: tl.constexpr, PROGRAMS_PER_SM: tl.constexpr,
                   PASS1_BLOCK: tl.constexpr = 0, EXACT_N: tl.constexpr = 0,
                   HOLD_ROW: tl.constexpr = 0):
    """Programs stride over blocks of BLOCK_M rows (PROGRAMS_PER_SM, read by the op: 0 one
    program per block, k > 0 about k per SM); STAGES blocks' loads in flight (whole rows) or
    column blocks' (looped rows). PASS1_BLOCK: looped rows' pass-1 chunk (0: BLOCK_N).
    EXACT_N 1: rows of exactly PASS1_BLOCK columns, compiled in (see the RMSNorm family's).
    HOLD_ROW 1 (with EXACT_N): pass 2 from the row pass 1 loaded, not read again.
    store_stats 0: mean and rstd are not written (no backward will read them; under
    torch.no_grad that saved 1-2% of the time at 1K-2K columns, session 41)."""
    if LOOP and PROGRAMS_PER_SM == 0:
        # Looped rows, one program per row: no block loop around them (see the RMSNorm
        # family's forward; H200: 16K-64K 1-2 points of copy faster with the single
        # reduction of pass 1)
        _fwd_block(tl.program_id(0), Y, X, W, B, MEAN, RSTD, n_rows, n_cols, stride_y,
                   stride_x, eps, has_bias, store_stats, BLOCK_M, BLOCK_N, LOOP, STAGES,
                   PASS1_BLOCK, EXACT_N, HOLD_ROW)
    else:
        for block in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0),
                              num_stages=1 if LOOP else STAGES):
            _fwd_block(block, Y, X, W, B, MEAN, RSTD, n_rows, n_cols, stride_y, stride_x, eps,
                       has_bias, store_stats, BLOCK_M, BLOCK_N, LOOP, STAGES, PASS1_BLOCK,
                       EXACT_N, HOLD_ROW)


@triton.jit
def _add_partials_and_finish(ACC_W, ACC_B, DW, DB, SYNC, part_w, part_b, cols, col_mask,
                             arrivals):
    """Adds this program's column sums into the fp32 rows ACC_W, ACC_B (zeroed by the caller)
    and counts the program in SYNC[0] (zeroed too); the last of the `arrivals` programs that
    call this writes the totals rounded to DW's dtype. Saves the partial buffers, their
    reductions and the casts (four launches); the order of the sums varies, so only outside
    torch's deterministic mode. The RMSNorm family has the one-gradient twin."""
    tl.atomic_add(ACC_W + cols, part_w, mask=col_mask, sem="relaxed")
    tl.atomic_add(ACC_B + cols, part_b, mask=col_mask, sem="relaxed")
    tl.debug_barrier()  # every thread's adds come before the one release below
    ticket = tl.atomic_add(SYNC, 1, sem="acq_rel")
    if ticket == arrivals - 1:
        # .cg: read the totals at L2, where the atomics were performed
        total_w = tl.load(ACC_W + cols, mask=col_mask, other=0.0, cache_modifier=".cg")
        total_b = tl.load(ACC_B + cols, mask=col_mask, other=0.0, cache_modifier=".cg")
        tl.store(DW + cols, total_w.to(DW.dtype.element_ty), mask=col_mask)
        tl.store(DB + cols, total_b.to(DB.dtype.element_ty), mask=col_mask)


@triton.jit
def _looped_rows_bwd(DX, dw_row, db_row, DY, X, W, MEAN, RSTD, rows, live, cols, n_cols,
                     stride_dx, stride_dy, stride_x, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, STAGES: tl.constexpr, ADD_DW: tl.constexpr,
                     FIRST_READ: tl.constexpr):
    """dx of the rows `rows` (live: those to compute), longer than BLOCK_N: pass 1 takes each
    row's two sums over its column blocks, pass 2 writes dx. With ADD_DW, pass 2 also adds
    each block's column sums of dy * xhat and dy to the fp32 rows dw_row and db_row in
    global memory (one read-modify-write each per column block for BLOCK_M rows).
    FIRST_READ: pass 1's L2 eviction policy."""
    mean = tl.load(MEAN + rows, mask=live, other=0.0)[:, None]
    rstd = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
    x_rows = X + rows[:, None] * stride_x
    dy_rows = DY + rows[:, None] * stride_dy
    acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for c0 in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
        c = (c0 + cols)[None, :]
        mask = live[:, None] & (c < n_cols)
        w = tl.load(W + c, mask=c < n_cols, other=0.0).to(tl.float32)
        x = tl.load(x_rows + c, mask=mask, other=0.0, eviction_policy=FIRST_READ).to(tl.float32)
        dy = tl.load(dy_rows + c, mask=mask, other=0.0,
                     eviction_policy=FIRST_READ).to(tl.float32)
        g = dy * w
        acc1 += g * ((x - mean) * rstd)
        acc2 += g
    c1 = tl.sum(acc1, axis=1)[:, None] / n_cols
    c2 = tl.sum(acc2, axis=1)[:, None] / n_cols
    # pass 2 walks the column blocks backwards: the last ones pass 1 read are the
    # likeliest still cached (H200: 3-5% faster at 32K-64K; the forwards lost 2-10%)
    n_blocks = tl.cdiv(n_cols, BLOCK_N)
    for back in tl.range(0, n_blocks, num_stages=STAGES):
        c0 = (n_blocks - 1 - back) * BLOCK_N
        # [1, BLOCK_N] columns (not a vector) keep w and the partial rows in the
        # tile's layout: no layout conversions through shared memory
        c = (c0 + cols)[None, :]
        col_mask = c < n_cols
        mask = live[:, None] & col_mask
        w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32)
        x = tl.load(x_rows + c, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_rows + c, mask=mask, other=0.0).to(tl.float32)
        xhat = (x - mean) * rstd
        dx = rstd * (dy * w - c2 - xhat * c1)
        # dx evict_first: L2 is for x and dy (see the RMSNorm family's _looped_rows_bwd)
        tl.store(DX + rows[:, None] * stride_dx + c, dx.to(DX.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first")
        if ADD_DW:
            # dead rows and columns loaded dy = 0: they add nothing to the column sums
            dw = tl.load(dw_row + c, mask=col_mask, other=0.0)
            tl.store(dw_row + c, dw + tl.sum(dy * xhat, axis=0, keep_dims=True),
                     mask=col_mask)
            db = tl.load(db_row + c, mask=col_mask, other=0.0)
            tl.store(db_row + c, db + tl.sum(dy, axis=0, keep_dims=True), mask=col_mask)


@triton.jit
def _column_sums_bwd(DY, X, MEAN, RSTD, first, last, cols, col_mask, stride_dy, stride_x,
                     STAGES: tl.constexpr):
    """(sum(dy * xhat), sum(dy)) over rows [first, last) of the columns `cols` (fp32,
    [SUM_BLOCK_N] each), SUM_BLOCK_M rows a step. The loads ask L2 to drop the lines (the
    interleaved layout's last reader)."""
    dw = tl.zeros([SUM_BLOCK_M, SUM_BLOCK_N], dtype=tl.float32)
    db = tl.zeros([SUM_BLOCK_M, SUM_BLOCK_N], dtype=tl.float32)
    for step in tl.range(first, last, SUM_BLOCK_M, num_stages=STAGES):
        rows = step + tl.arange(0, SUM_BLOCK_M)
        live = rows < last
        mask = live[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0,
                     eviction_policy="evict_first").to(tl.float32)
        mean = tl.load(MEAN + rows, mask=live, other=0.0)[:, None]
        rstd = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
        dw += dy * ((x - mean) * rstd)  # dead rows and columns loaded dy = 0
        db += dy
    return tl.sum(dw, axis=0), tl.sum(db, axis=0)


@triton.jit
def layer_norm_bwd(DX, DW_PARTIAL, DB_PARTIAL, DY, X, W, MEAN, RSTD, n_rows, n_cols,
                   stride_dx, stride_dy, stride_x, rows_per_program, DW, DB, SYNC, atomic_dw,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr,
                   STAGES: tl.constexpr, PROGRAMS_PER_SM: tl.constexpr,
                   CHUNK_ROWS: tl.constexpr):
    """About PROGRAMS_PER_SM programs per SM (the op sizes the grid), STAGES row blocks'
    (whole rows) or column blocks' (looped rows) loads in flight per program.
    Interleaved (looped rows, CHUNK_ROWS > 0): chunks of CHUNK_ROWS rows, whose row programs
    write dx and whose column programs then sum dw and db (into the chunk's partial rows,
    or with atomic_dw the zeroed rows, with a counter per column block in SYNC), as in
    RMSNorm's backward."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    first = pid.to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    dw_row = DW_PARTIAL + pid.to(tl.int64) * n_cols
    db_row = DB_PARTIAL + pid.to(tl.int64) * n_cols
    if not LOOP:
        col_mask = cols < n_cols
        # Whole rows of 16K elements and more: x, dy and w are read again after the row's
        # sums, from cache, rather than held across them (sm90, 16 warps: spills 208 -> 88
        # bytes a thread; an H200 ran 4096 x 16384 in 0.218 -> 0.188 ms). RMSNorm's twin
        # keeps w, which was faster there.
        REREAD: tl.constexpr = BLOCK_M * BLOCK_N >= 16384
        FIRST_READ: tl.constexpr = "evict_last" if REREAD else ""
        if not REREAD:
            w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        db = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for step in tl.range(0, rows_per_program, BLOCK_M, num_stages=STAGES):
            rows = first + step + tl.arange(0, BLOCK_M)
            live = rows < last
            mask = live[:, None] & col_mask[None, :]
            c = cols[None, :]
            if REREAD:
                w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
            x_ptrs = X + rows[:, None] * stride_x + c
            dy_ptrs = DY + rows[:, None] * stride_dy + c
            x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy=FIRST_READ
                        ).to(tl.float32)
            dy = tl.load(dy_ptrs, mask=mask, other=0.0, eviction_policy=FIRST_READ
                         ).to(tl.float32)
            mean = tl.load(MEAN + rows, mask=live, other=0.0)[:, None]
            rstd = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
            xhat = (x - mean) * rstd  # masked lanes have dy = 0: they add nothing below
            g = dy * w
            c1 = tl.sum(g * xhat, axis=1)[:, None] / n_cols
            c2 = tl.sum(g, axis=1)[:, None] / n_cols
            if REREAD:
                w = tl.load(W + cols, mask=col_mask, other=0.0,
                            eviction_policy="evict_last").to(tl.float32)[None, :]
                x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy="evict_first"
                            ).to(tl.float32)
                dy = tl.load(dy_ptrs, mask=mask, other=0.0, eviction_policy="evict_first"
                             ).to(tl.float32)
                xhat = (x - mean) * rstd
                g = dy * w
            dx = rstd * (g - c2 - xhat * c1)
            tl.store(DX + rows[:, None] * stride_dx + c, dx.to(DX.dtype.element_ty), mask=mask)
            dw += dy * xhat
            db += dy
        if atomic_dw != 0:
            _add_partials_and_finish(DW_PARTIAL, DB_PARTIAL, DW, DB, SYNC, tl.sum(dw, axis=0),
                                     tl.sum(db, axis=0), cols, col_mask, tl.num_programs(0))
        else:
            tl.store(dw_row + cols, tl.sum(dw, axis=0), mask=col_mask)
            tl.store(db_row + cols, tl.sum(db, axis=0), mask=col_mask)
    elif CHUNK_ROWS == 0:
        # Long rows, BLOCK_M at a time, each program with its own fp32 partial rows.
        for c0 in range(0, n_cols, BLOCK_N):
            c = c0 + cols
            tl.store(dw_row + c, tl.zeros([BLOCK_N], dtype=tl.float32), mask=c < n_cols)
            tl.store(db_row + c, tl.zeros([BLOCK_N], dtype=tl.float32), mask=c < n_cols)
        for step in range(0, rows_per_program, BLOCK_M):
            rows = first + step + tl.arange(0, BLOCK_M)
            # masks rows past the program's run (and past n_rows)
            _looped_rows_bwd(DX, dw_row, db_row, DY, X, W, MEAN, RSTD, rows, rows < last, cols,
                             n_cols, stride_dx, stride_dy, stride_x, BLOCK_M, BLOCK_N, STAGES,
                             True, "")
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
            _looped_rows_bwd(DX, dw_row, db_row, DY, X, W, MEAN, RSTD, rows, rows < n_rows,
                             cols, n_cols, stride_dx, stride_dy, stride_x, BLOCK_M, BLOCK_N,
                             STAGES, False, "evict_last")
        else:
            sum_cols = (task - row_programs) * SUM_BLOCK_N + tl.arange(0, SUM_BLOCK_N)
            sum_mask = sum_cols < n_cols
            part_w, part_b = _column_sums_bwd(DY, X, MEAN, RSTD, chunk_first,
                                              tl.minimum(chunk_first + CHUNK_ROWS, n_rows),
                                              sum_cols, sum_mask, stride_dy, stride_x, STAGES)
            if atomic_dw != 0:
                # SYNC holds a counter per column block: its last chunk writes dw and db
                _add_partials_and_finish(DW_PARTIAL, DB_PARTIAL, DW, DB, SYNC + task - row_programs,
                                         part_w, part_b, sum_cols, sum_mask,
                                         tl.cdiv(n_rows, CHUNK_ROWS))
            else:
                tl.store(DW_PARTIAL + chunk * n_cols + sum_cols, part_w, mask=sum_mask)
                tl.store(DB_PARTIAL + chunk * n_cols + sum_cols, part_b, mask=sum_mask)


# -- staged forward (Gluon, NVIDIA sm80+): configs with a STAGED key (spec.staged_twin) ------

@gluon.jit
def _staged_normalize(ring, w_buf, b_buf, W, B, y_row, Y, k, mean, rstd, n_rows, n_cols,
                      X, stride_x, offs, layout: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr, STAGED: gl.constexpr, W_SHARED: gl.constexpr,
                      BIAS: gl.constexpr):
    """Pass 2 of the staged forward: y of the program's row k from its chunks in the ring,
    each slot refilled once its chunk is in registers. BIAS: a compile-time copy of the
    runtime flag (no branch in the unrolled chunk loop)."""
    w_next = staged_rows.weight_chunk(w_buf, W, n_cols, offs, 0, layout, W_SHARED, BLOCK_N)
    if BIAS:
        b_next = staged_rows.weight_chunk(b_buf, B, n_cols, offs, 0, layout, W_SHARED,
                                          BLOCK_N)
    for j in gl.static_range(STAGED):
        x = staged_rows.take_chunk(ring, X, stride_x, n_rows, n_cols, k, j, offs, layout,
                                   STAGED, STAGES, BLOCK_N)
        w = w_next
        if j + 1 < STAGED:
            w_next = staged_rows.weight_chunk(w_buf, W, n_cols, offs, j + 1, layout, W_SHARED,
                                              BLOCK_N)
        y = (x - mean) * rstd * w.to(gl.float32)
        if BIAS:
            y += b_next.to(gl.float32)
            if j + 1 < STAGED:
                b_next = staged_rows.weight_chunk(b_buf, B, n_cols, offs, j + 1, layout,
                                                  W_SHARED, BLOCK_N)
        cols = j * BLOCK_N + offs
        gl.store(y_row + cols, y.to(Y.dtype.element_ty), mask=cols < n_cols)


@gluon.jit
def layer_norm_fwd_staged(Y, X, W, B, MEAN, RSTD, n_rows, n_cols, stride_y, stride_x, eps,
                          has_bias, store_stats, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          LOOP: gl.constexpr, STAGES: gl.constexpr,
                          PROGRAMS_PER_SM: gl.constexpr, STAGED: gl.constexpr,
                          W_SHARED: gl.constexpr):
    """layer_norm_fwd for rows of at most STAGED x BLOCK_N columns, each read once through a
    ring of STAGES chunk buffers in shared memory (kernel_src/staged_rows.py); persistent
    programs (the op's grid: PROGRAMS_PER_SM an SM). The row on chip gives the exact
    two-step variance of the whole-row forward. W_SHARED: w and b staged in shared memory
    once per program, else each chunk of them loaded a chunk ahead."""
    layout: gl.constexpr = staged_rows.chunk_layout(gl.num_warps())
    ring = gl.allocate_shared_memory(X.dtype.element_ty, [STAGES, BLOCK_N],
                                     staged_rows.RING_LAYOUT)
    w_buf = gl.allocate_shared_memory(W.dtype.element_ty, [STAGED if W_SHARED else 1, BLOCK_N],
                                      staged_rows.RING_LAYOUT)
    b_buf = gl.allocate_shared_memory(W.dtype.element_ty, [STAGED if W_SHARED else 1, BLOCK_N],
                                      staged_rows.RING_LAYOUT)
    offs = gl.arange(0, BLOCK_N, layout)
    if W_SHARED:
        staged_rows.stage_weights(w_buf, W, n_cols, offs, STAGED, BLOCK_N)
        staged_rows.stage_weights(b_buf, B, n_cols, offs, STAGED, BLOCK_N)
    staged_rows.start_ring(ring, X, stride_x, n_rows, n_cols, offs, STAGED, STAGES, BLOCK_N)
    pid = gl.program_id(0)
    for k in range(gl.cdiv(n_rows - pid, gl.num_programs(0))):
        row = pid + k * gl.num_programs(0)
        acc = gl.zeros([BLOCK_N], gl.float32, layout)
        for j in gl.static_range(STAGED):
            acc += staged_rows.ring_chunk(ring, k, j, layout, STAGED, STAGES, True)
        mean = gl.sum(acc, axis=0) / n_cols
        acc = gl.zeros([BLOCK_N], gl.float32, layout)
        for j in gl.static_range(STAGED):
            d = staged_rows.ring_chunk(ring, k, j, layout, STAGED, STAGES, False) - mean
            # the columns past n_cols (zero-filled) must not count: masked only in the chunk
            # that holds n_cols, chunks wholly past it skipped (uniform branches, no select
            # per element elsewhere)
            if (j + 1) * BLOCK_N <= n_cols:
                acc += d * d
            elif j * BLOCK_N < n_cols:
                d = gl.where(j * BLOCK_N + offs < n_cols, d, 0.0)
                acc += d * d
        rstd = 1.0 / gl.sqrt(gl.sum(acc, axis=0) / n_cols + eps)
        if store_stats != 0:
            gl.store(MEAN + row, mean)
            gl.store(RSTD + row, rstd)
        y_row = Y + row.to(gl.int64) * stride_y
        if has_bias != 0:
            _staged_normalize(ring, w_buf, b_buf, W, B, y_row, Y, k, mean, rstd, n_rows,
                              n_cols, X, stride_x, offs, layout, BLOCK_N, STAGES, STAGED,
                              W_SHARED, True)
        else:
            _staged_normalize(ring, w_buf, b_buf, W, B, y_row, Y, k, mean, rstd, n_rows,
                              n_cols, X, stride_x, offs, layout, BLOCK_N, STAGES, STAGED,
                              W_SHARED, False)
    staged_rows.finish_ring()


# -- grouped backward (Gluon, sm90): rows split over groups of programs, each row read once --
#
# rms_norm_bwd_grouped's layout (rms_norm/kernels.py explains it) with LayerNorm's two sums a
# row, sum(g * xhat) and sum(g): program `part` of a group of split = n_cols / BLOCK_N owns
# a column slice of its group's rows, holds its slices of dw and db (and of w, unless
# W_SHARED stages it in shared memory) for the whole kernel, streams x and dy through a
# cp.async ring, and publishes its two shares of a row as one word (staged_rows.
# publish_pair) a row behind. W_SHARED frees the 4-warp program's 16 registers of w, which
# spilled at 64-80 registers beside dw and db. H200, 2^26 bf16 elements: 80% of copy at
# 16K-64K columns against 59 / 57 / 54% (docs/perf-notes.md, sessions 14-15). The op takes
# it (layer_norm.py: grouped_applies) under the same conditions as RMSNorm's.

@gluon.jit
def _row_shares(ring_x, ring_dy, slot, w, mean, rstd, layout: gl.constexpr):
    """This program's shares of a row's sum(g * xhat) and sum(g), from the ring: one
    reduction of the pair (one exchange between warps, not two), rstd applied to the sum."""
    x = staged_rows.widen(ring_x.index(slot).load(layout))
    g = staged_rows.widen(ring_dy.index(slot).load(layout)) * w
    s_gd, s_g = gl.reduce((g * (x - mean), g), 0, _add_pairs)
    return s_gd * rstd, s_g


@gluon.jit
def layer_norm_bwd_grouped(DX, DW_SUM, DB_SUM, DW, DB, SYNC, WORDS, DY, X, W, MEAN, RSTD,
                           n_rows, n_cols, stride_dx, stride_dy, stride_x,
                           BLOCK_N: gl.constexpr, SLOTS: gl.constexpr,
                           PROGRAMS_PER_SM: gl.constexpr, W_SHARED: gl.constexpr):
    """layer_norm_bwd's function on the grouped layout: dx = rstd * (g - mean(g) - xhat *
    mean(g * xhat)), dw = sum over rows of dy * xhat, db = sum of dy. DW_SUM and DB_SUM
    (n_cols fp32 each), SYNC (split int32) and WORDS (n_rows * split int64) zeroed by the op.
    The grid is whole groups, all resident (PROGRAMS_PER_SM: the op's grid)."""
    gl.static_assert(SLOTS >= 3)  # rows k and k + 1 held, one more streaming in
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [gl.num_warps()], [0])
    ring_x, ring_dy = staged_rows.pair_ring(X, DY, SLOTS, BLOCK_N)
    w_buf = gl.allocate_shared_memory(W.dtype.element_ty, [BLOCK_N if W_SHARED else 8],
                                      staged_rows.RING_LAYOUT)
    split, n_groups, group, part, cols = staged_rows.group_slice(n_cols, BLOCK_N, layout)
    if W_SHARED:
        staged_rows.stage_slice(w_buf, W + cols)
        w_regs = 0.0  # unused
    else:
        w_regs = gl.load(W + cols).to(gl.float32)
    staged_rows.start_pair_ring(ring_x, ring_dy, X, DY, stride_x, stride_dy, n_rows, group,
                                n_groups, cols, SLOTS)
    dw = gl.zeros([BLOCK_N], gl.float32, layout)
    db = gl.zeros([BLOCK_N], gl.float32, layout)
    n_mine = gl.cdiv(n_rows - group, n_groups)
    mean = gl.load(MEAN + group)
    rstd = gl.load(RSTD + group)
    # row k + 1's statistics are loaded a row ahead of its pass 1, which needs them at once
    mean_next = gl.load(MEAN + group + n_groups, mask=group + n_groups < n_rows, other=0.0)
    rstd_next = gl.load(RSTD + group + n_groups, mask=group + n_groups < n_rows, other=0.0)
    cp.wait_group(SLOTS - 1)  # row 0 of the group (groups <= n_rows: there is one)
    s_gx, s_g = _row_shares(ring_x, ring_dy, 0,
                            staged_rows.slice_weight(w_buf, w_regs, layout, W_SHARED),
                            mean, rstd, layout)
    if split > 1:
        staged_rows.publish_pair(WORDS, group * split + part, s_gx, s_g)
    for k in range(n_mine):
        row = group + k * n_groups
        nxt = row + n_groups
        # row k's words (published a row ago) first read here, before pass 1 of row k + 1,
        # whose work hides the read's L2 round trip; a count of 0 reads none when split is 1
        # (H200, 16K / 32K / 64K: +2.6-3.0 / +3.0 / +1.1-1.2 points of copy, session 22)
        words_k, ptrs_k, live_k = staged_rows.read_pairs(
            WORDS, row * split, gl.where(split > 1, split, 0), MAX_GROUPED_SPLIT)
        mean_far = gl.load(MEAN + nxt + n_groups, mask=nxt + n_groups < n_rows, other=0.0)
        rstd_far = gl.load(RSTD + nxt + n_groups, mask=nxt + n_groups < n_rows, other=0.0)
        # pass 1 of row k + 1: SLOTS + k copies issued, rows k and k + 1 complete
        cp.wait_group(SLOTS - 2)
        n_gx, n_g = _row_shares(ring_x, ring_dy, (k + 1) % SLOTS,
                                staged_rows.slice_weight(w_buf, w_regs, layout, W_SHARED),
                                mean_next, rstd_next, layout)
        if (split > 1) & (k + 1 < n_mine):
            staged_rows.publish_pair(WORDS, nxt * split + part, n_gx, n_g)
        if split > 1:
            shares_gx, shares_g = staged_rows.finish_pairs(words_k, ptrs_k, live_k)
            s_gx = gl.sum(shares_gx, axis=0)
            s_g = gl.sum(shares_g, axis=0)
        # pass 2 of row k, its slot then refilled with row k + SLOTS
        x = staged_rows.widen(ring_x.index(k % SLOTS).load(layout))
        dy = staged_rows.widen(ring_dy.index(k % SLOTS).load(layout))
        staged_rows.issue_pair(ring_x, ring_dy, X, DY, stride_x, stride_dy, n_rows, k + SLOTS,
                               group, n_groups, cols, SLOTS)
        # xhat = x * rstd - mean * rstd in one FMA, shared by dx and dw; dx = rstd * g +
        # xhat * c1 + c0 with the row's scalars folded first (sm90 SASS: the loop 551 -> 532
        # instructions; H200, 16K-64K: +0.3-0.5 points of copy, session 21)
        c1 = -rstd * (s_gx / n_cols)
        c0 = -rstd * (s_g / n_cols)
        xhat = x * rstd + (-mean * rstd)
        g = dy * staged_rows.slice_weight(w_buf, w_regs, layout, W_SHARED)
        dx = rstd * g + (xhat * c1 + c0)
        gl.store(DX + row.to(gl.int64) * stride_dx + cols, dx.to(DX.dtype.element_ty))
        dw += dy * xhat
        db += dy
        s_gx, s_g, mean, rstd = n_gx, n_g, mean_next, rstd_next
        mean_next, rstd_next = mean_far, rstd_far
    cp.wait_group(0)  # the ring's last copies (rows past the end)
    gl.atomic_add(DW_SUM + cols, dw, sem="relaxed", scope="gpu")
    gl.atomic_add(DB_SUM + cols, db, sem="relaxed", scope="gpu")
    if staged_rows.last_of_slice(SYNC, part, n_groups):
        staged_rows.write_total(DW_SUM, DW, cols)
        staged_rows.write_total(DB_SUM, DB, cols)


# -- grouped forward (Gluon, sm90): the grouped backward's layout for y ---------------------
#
# rms_norm_fwd_grouped's layout (rms_norm/kernels.py) with LayerNorm's statistics. As in the
# looped forward, the variance comes from sums shifted by the row's first element (each
# program loads it, a row ahead), which keeps E[x^2] - E[x]^2's cancellation small when
# |mean| >> std: a program's two shifted sums travel as one word (staged_rows.publish_pair)
# and come from one reduction of the pair (one exchange between its warps a row, not two).

@gluon.jit
def _shifted_sums(ring_x, slot, shift, layout: gl.constexpr):
    """The program's slice of a ring slot's row: (sum of x - shift, sum of (x - shift)^2)."""
    d = staged_rows.widen(ring_x.index(slot).load(layout)) - shift
    return gl.reduce((d, d * d), 0, _add_pairs)


@gluon.jit
def _first_of_row(X, row, stride_x, n_rows):
    """x[row, 0] as fp32 (0 past n_rows): the row's shift."""
    return gl.load(X + row.to(gl.int64) * stride_x, mask=row < n_rows, other=0.0).to(gl.float32)


@gluon.jit
def layer_norm_fwd_grouped(Y, MEAN, RSTD, WORDS, X, W, B, n_rows, n_cols, stride_y, stride_x,
                           eps, has_bias, BLOCK_N: gl.constexpr, SLOTS: gl.constexpr,
                           PROGRAMS_PER_SM: gl.constexpr):
    """layer_norm_fwd on the grouped layout (above). WORDS: n_rows * split int64, zeroed by
    the op. The grid is whole groups, all resident (PROGRAMS_PER_SM: the op's grid)."""
    gl.static_assert(SLOTS >= 3)  # rows k and k + 1 held, one more streaming in
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [gl.num_warps()], [0])
    ring_x = gl.allocate_shared_memory(X.dtype.element_ty, [SLOTS, BLOCK_N],
                                       staged_rows.RING_LAYOUT)
    split, n_groups, group, part, cols = staged_rows.group_slice(n_cols, BLOCK_N, layout)
    for t in gl.static_range(SLOTS):
        staged_rows.issue_row(ring_x, X, stride_x, n_rows, t, group, n_groups, cols, SLOTS)
    # w and b held in W's dtype (half the registers of fp32: 16 more would spill at 8 an SM)
    w = gl.load(W + cols)
    b = gl.load(B + cols)
    n_mine = gl.cdiv(n_rows - group, n_groups)
    shift = _first_of_row(X, group, stride_x, n_rows)
    shift_next = _first_of_row(X, group + n_groups, stride_x, n_rows)
    cp.wait_group(SLOTS - 1)  # row 0 of the group (groups <= n_rows: there is one)
    s1, s2 = _shifted_sums(ring_x, 0, shift, layout)
    if split > 1:
        staged_rows.publish_pair(WORDS, group * split + part, s1, s2)
    for k in range(n_mine):
        row = group + k * n_groups
        nxt = row + n_groups
        shift_far = _first_of_row(X, nxt + n_groups, stride_x, n_rows)
        # pass 1 of row k + 1: SLOTS + k copies issued, rows k and k + 1 complete
        cp.wait_group(SLOTS - 2)
        s1_next, s2_next = _shifted_sums(ring_x, (k + 1) % SLOTS, shift_next, layout)
        if (split > 1) & (k + 1 < n_mine):
            staged_rows.publish_pair(WORDS, nxt * split + part, s1_next, s2_next)
        if split > 1:
            s1s, s2s = staged_rows.collect_pairs(WORDS, row * split, split, MAX_GROUPED_SPLIT)
            s1 = gl.sum(s1s, axis=0)
            s2 = gl.sum(s2s, axis=0)
        # pass 2 of row k, its slot then refilled with row k + SLOTS
        x = staged_rows.widen(ring_x.index(k % SLOTS).load(layout))
        # issue_row's copy, with the row derived from this one: through issue_row (row k +
        # SLOTS from the group's start) sm90 ptxas emitted 8 more instructions
        row_f = row + SLOTS * n_groups
        cp.async_copy_global_to_shared(ring_x.index(k % SLOTS),
                                       X + row_f.to(gl.int64) * stride_x + cols,
                                       mask=row_f < n_rows)
        cp.commit_group()
        centred = s1 / n_cols
        mean = shift + centred
        rstd = 1.0 / gl.sqrt(gl.maximum(s2 / n_cols - centred * centred, 0.0) + eps)
        if part == 0:
            gl.store(MEAN + row, mean)
            gl.store(RSTD + row, rstd)
        y = (x - mean) * rstd * staged_rows.widen(w)
        if has_bias != 0:
            y += staged_rows.widen(b)
        gl.store(Y + row.to(gl.int64) * stride_y + cols, y.to(Y.dtype.element_ty))
        s1, s2 = s1_next, s2_next
        shift, shift_next = shift_next, shift_far
    cp.wait_group(0)  # the ring's last copies (rows past the end)
