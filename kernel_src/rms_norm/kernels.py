"""RMSNorm forward and backward.

y = (x * rstd) * (offset + w),  rstd = 1 / sqrt(mean(x^2) + eps)

A program handles BLOCK_M rows of BLOCK_N columns. When a row fits in BLOCK_N it stays in
registers (one read of x); longer rows loop over BLOCK_N chunks (two reads of x, the second
mostly from L2). Casting modes follow Liger-Kernel: 0 llama (normalize in fp32, cast to the
input dtype, then multiply by the weight), 1 gemma (everything in fp32), 2 none (input dtype).
"""
import triton
import triton.language as tl


@triton.jit
def _normalize(x, w, rstd, offset, CASTING: tl.constexpr):
    # Arithmetic stays in fp32; casts to x.dtype only reproduce each mode's rounding points
    # (a bf16 product of two bf16 values is the fp32 product rounded once, so this matches).
    xf = x.to(tl.float32)
    if CASTING == 0:
        xhat = (xf * rstd).to(x.dtype).to(tl.float32)
        y = xhat * (w.to(tl.float32) + offset).to(x.dtype).to(tl.float32)
    elif CASTING == 1:
        y = xf * rstd * (w.to(tl.float32) + offset)
    else:
        xhat = (xf * rstd.to(x.dtype).to(tl.float32)).to(x.dtype).to(tl.float32)
        y = xhat * (w.to(tl.float32) + offset).to(x.dtype).to(tl.float32)
    return y


@triton.jit
def rms_norm_fwd(Y, X, W, RSTD, n_rows, n_cols, stride_y, stride_x, eps, offset,
                 CASTING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 LOOP: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    x_row = X + rows[:, None] * stride_x
    y_row = Y + rows[:, None] * stride_y
    if not LOOP:
        mask = row_mask[:, None] & (cols[None, :] < n_cols)
        x = tl.load(x_row + cols[None, :], mask=mask, other=0.0)
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / n_cols + eps)
        w = tl.load(W + cols, mask=cols < n_cols, other=0.0)
        y = _normalize(x, w[None, :], rstd[:, None], offset, CASTING)
        tl.store(y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c[None, :] < n_cols)
            xf = tl.load(x_row + c[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += xf * xf
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c[None, :] < n_cols)
            x = tl.load(x_row + c[None, :], mask=mask, other=0.0)
            w = tl.load(W + c, mask=c < n_cols, other=0.0)
            y = _normalize(x, w[None, :], rstd[:, None], offset, CASTING)
            tl.store(y_row + c[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def rms_norm_bwd(DX, DW_PARTIAL, DY, X, W, RSTD, n_rows, n_cols, stride_dx, stride_dy,
                 stride_x, offset, rows_per_program,
                 CASTING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 LOOP: tl.constexpr):
    """dx = rstd * (dy*w' - xhat * mean(dy*w'*xhat)), w' = offset + w.
    Each program owns rows_per_program consecutive rows and writes its fp32 partial of
    dw = sum(dy * xhat) to DW_PARTIAL[pid, :]; the host side sums the partials."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    first = pid.to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    dw_row = DW_PARTIAL + pid.to(tl.int64) * n_cols
    if not LOOP:
        col_mask = cols < n_cols
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for step in range(0, rows_per_program, BLOCK_M):
            rows = first + step + tl.arange(0, BLOCK_M)
            mask = (rows < last)[:, None] & col_mask[None, :]
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
            dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
            rstd = tl.load(RSTD + rows, mask=rows < last, other=0.0)[:, None]
            xf = x.to(tl.float32)
            dyf = dy.to(tl.float32)
            if CASTING == 0:
                xhat = (xf * rstd).to(x.dtype).to(tl.float32)
            else:
                xhat = xf * rstd
            dyw = dyf * w[None, :]
            dot = tl.sum(dyw * xf, axis=1)[:, None] / n_cols
            dx = rstd * (dyw - xf * rstd * rstd * dot)
            tl.store(DX + rows[:, None] * stride_dx + cols[None, :],
                     dx.to(DX.dtype.element_ty), mask=mask)
            dw += dyf * xhat
        tl.store(dw_row + cols, tl.sum(dw, axis=0), mask=col_mask)
    else:
        for c0 in range(0, n_cols, BLOCK_N):
            c = c0 + cols
            tl.store(dw_row + c, tl.zeros([BLOCK_N], dtype=tl.float32), mask=c < n_cols)
        for step in range(0, rows_per_program):
            row = first + step
            live = row < last  # masks the tail of the last program's rows
            rstd = tl.load(RSTD + row, mask=live, other=0.0)
            x_row = X + row * stride_x
            dy_row = DY + row * stride_dy
            acc = tl.zeros([BLOCK_N], dtype=tl.float32)
            for c0 in range(0, n_cols, BLOCK_N):
                c = c0 + cols
                m = (c < n_cols) & live
                w = tl.load(W + c, mask=m, other=0.0).to(tl.float32) + offset
                xf = tl.load(x_row + c, mask=m, other=0.0).to(tl.float32)
                dyf = tl.load(dy_row + c, mask=m, other=0.0).to(tl.float32)
                acc += dyf * w * xf
            dot = tl.sum(acc, axis=0) / n_cols
            for c0 in range(0, n_cols, BLOCK_N):
                c = c0 + cols
                m = (c < n_cols) & live
                w = tl.load(W + c, mask=m, other=0.0).to(tl.float32) + offset
                x = tl.load(x_row + c, mask=m, other=0.0)
                xf = x.to(tl.float32)
                dyf = tl.load(dy_row + c, mask=m, other=0.0).to(tl.float32)
                dx = rstd * (dyf * w - xf * rstd * rstd * dot)
                tl.store(DX + row * stride_dx + c, dx.to(DX.dtype.element_ty), mask=m)
                if CASTING == 0:
                    xhat = (xf * rstd).to(x.dtype).to(tl.float32)
                else:
                    xhat = xf * rstd
                dw = tl.load(dw_row + c, mask=m, other=0.0)
                tl.store(dw_row + c, dw + dyf * xhat, mask=m)
