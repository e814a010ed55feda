"""PolyNorm (Liger-Kernel / PolyCom) forward and backward.

y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b,  norm(u) = u / sqrt(mean(u^2) + eps)

w has 3 elements and b one. RSTD holds per row (r3, r2, r1) = rstd of (x^3, x^2, x).

Backward, per row with S_p = sum(dy * x^p):
    dx = 3x^2 * w0*r3*(dy - x^3 r3^2 S_3/n) + 2x * w1*r2*(dy - x^2 r2^2 S_2/n)
         + w2*r1*(dy - x r1^2 S_1/n)
    dw_k = sum over rows of r_p * S_p (p = 3, 2, 1 for k = 0, 1, 2),  db = sum of dy
Each program owns rows_per_program consecutive rows and writes its fp32 partials
(dw0, dw1, dw2, db) to DWB_PARTIAL[pid, 0:4]; the host sums them. DX may be DY's buffer
(in-place backward): each element of dy is read before the same thread writes dx there.

Rows that fit in BLOCK_N stay in registers; longer rows loop over BLOCK_N chunks (LOOP).
"""
import triton
import triton.language as tl


@triton.jit
def _load_w(W, B):
    w0 = tl.load(W).to(tl.float32)
    w1 = tl.load(W + 1).to(tl.float32)
    w2 = tl.load(W + 2).to(tl.float32)
    b = tl.load(B).to(tl.float32)
    return w0, w1, w2, b


@triton.jit
def poly_norm_fwd(Y, X, W, B, RSTD, n_rows, n_cols, stride_y, stride_x, eps,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    x_row = X + rows[:, None] * stride_x
    y_row = Y + rows[:, None] * stride_y
    w0, w1, w2, b = _load_w(W, B)
    if not LOOP:
        c = cols[None, :]
        mask = row_mask[:, None] & (c < n_cols)
        x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
        x2 = x * x
        x3 = x2 * x
        r3 = 1.0 / tl.sqrt(tl.sum(x3 * x3, axis=1) / n_cols + eps)
        r2 = 1.0 / tl.sqrt(tl.sum(x2 * x2, axis=1) / n_cols + eps)
        r1 = 1.0 / tl.sqrt(tl.sum(x2, axis=1) / n_cols + eps)
        y = (w0 * r3)[:, None] * x3 + (w1 * r2)[:, None] * x2 + (w2 * r1)[:, None] * x + b
        tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=mask)
    else:
        a1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        a2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        a3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = (start + cols)[None, :]
            mask = row_mask[:, None] & (c < n_cols)
            x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
            x2 = x * x
            a1 += x2
            a2 += x2 * x2
            a3 += x2 * x2 * x2
        r3 = 1.0 / tl.sqrt(tl.sum(a3, axis=1) / n_cols + eps)
        r2 = 1.0 / tl.sqrt(tl.sum(a2, axis=1) / n_cols + eps)
        r1 = 1.0 / tl.sqrt(tl.sum(a1, axis=1) / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            c = (start + cols)[None, :]
            mask = row_mask[:, None] & (c < n_cols)
            x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
            x2 = x * x
            y = (w0 * r3)[:, None] * (x2 * x) + (w1 * r2)[:, None] * x2 \
                + (w2 * r1)[:, None] * x + b
            tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows * 3, r3, mask=row_mask)
    tl.store(RSTD + rows * 3 + 1, r2, mask=row_mask)
    tl.store(RSTD + rows * 3 + 2, r1, mask=row_mask)


@triton.jit
def _dx(x, dy, w0, w1, w2, r3, r2, r1, s3, s2, s1, n_cols):
    """dx of one tile; r*, s* are [BLOCK_M, 1]."""
    x2 = x * x
    x3 = x2 * x
    d3 = (w0 * r3) * (dy - x3 * (r3 * r3 * s3 / n_cols))
    d2 = (w1 * r2) * (dy - x2 * (r2 * r2 * s2 / n_cols))
    d1 = (w2 * r1) * (dy - x * (r1 * r1 * s1 / n_cols))
    return 3.0 * x2 * d3 + 2.0 * x * d2 + d1


@triton.jit
def poly_norm_bwd(DX, DWB_PARTIAL, DY, X, W, RSTD, n_rows, n_cols, stride_dx, stride_dy,
                  stride_x, rows_per_program,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    first = pid.to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    w0 = tl.load(W).to(tl.float32)
    w1 = tl.load(W + 1).to(tl.float32)
    w2 = tl.load(W + 2).to(tl.float32)
    dw0 = tl.zeros([BLOCK_M], dtype=tl.float32)
    dw1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    dw2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    db = tl.zeros([BLOCK_M], dtype=tl.float32)
    for step in range(0, rows_per_program, BLOCK_M):
        rows = first + step + tl.arange(0, BLOCK_M)
        live = rows < last
        r3 = tl.load(RSTD + rows * 3, mask=live, other=0.0)
        r2 = tl.load(RSTD + rows * 3 + 1, mask=live, other=0.0)
        r1 = tl.load(RSTD + rows * 3 + 2, mask=live, other=0.0)
        x_row = X + rows[:, None] * stride_x
        dy_row = DY + rows[:, None] * stride_dy
        dx_row = DX + rows[:, None] * stride_dx
        if not LOOP:
            c = cols[None, :]
            mask = live[:, None] & (c < n_cols)
            x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + c, mask=mask, other=0.0).to(tl.float32)
            x2 = x * x
            s3 = tl.sum(dy * x2 * x, axis=1)
            s2 = tl.sum(dy * x2, axis=1)
            s1 = tl.sum(dy * x, axis=1)
            sd = tl.sum(dy, axis=1)
            dx = _dx(x, dy, w0, w1, w2, r3[:, None], r2[:, None], r1[:, None],
                     s3[:, None], s2[:, None], s1[:, None], n_cols)
            tl.store(dx_row + c, dx.to(DX.dtype.element_ty), mask=mask)
        else:
            a3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            a2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            a1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            ad = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                c = (start + cols)[None, :]
                mask = live[:, None] & (c < n_cols)
                x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_row + c, mask=mask, other=0.0).to(tl.float32)
                dyx = dy * x
                a1 += dyx
                a2 += dyx * x
                a3 += dyx * x * x
                ad += dy
            s3 = tl.sum(a3, axis=1)
            s2 = tl.sum(a2, axis=1)
            s1 = tl.sum(a1, axis=1)
            sd = tl.sum(ad, axis=1)
            for start in range(0, n_cols, BLOCK_N):
                c = (start + cols)[None, :]
                mask = live[:, None] & (c < n_cols)
                x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_row + c, mask=mask, other=0.0).to(tl.float32)
                dx = _dx(x, dy, w0, w1, w2, r3[:, None], r2[:, None], r1[:, None],
                         s3[:, None], s2[:, None], s1[:, None], n_cols)
                tl.store(dx_row + c, dx.to(DX.dtype.element_ty), mask=mask)
        dw0 += r3 * s3
        dw1 += r2 * s2
        dw2 += r1 * s1
        db += sd
    out = DWB_PARTIAL + pid.to(tl.int64) * 4
    tl.store(out, tl.sum(dw0, axis=0))
    tl.store(out + 1, tl.sum(dw1, axis=0))
    tl.store(out + 2, tl.sum(dw2, axis=0))
    tl.store(out + 3, tl.sum(db, axis=0))
