"""GroupNorm forward and backward.

x is (batch, channels, hw) contiguous (hw = product of the spatial dims, 1 for 2-D input);
channels split into n_groups groups of ch_per_group consecutive channels. Row r = (b, g) is the
contiguous run of group_size = ch_per_group * hw elements starting at r * group_size;
element j of it belongs to channel g * ch_per_group + j // hw.

y = (x - mean_r) * rstd_r * w[c] (+ b[c]),  statistics over the row (biased variance)

One program per row. Forward: pass 1 sums (x - shift) and (x - shift)^2 with the row's first
element as shift (keeps E[x^2] - E[x]^2 from cancelling when |mean| >> std), pass 2 writes y.

Backward, xhat = (x - mean) * rstd, g = dy * w[c], N = group_size:
    dx = rstd * (g - (sum(g) + xhat * sum(g * xhat)) / N)
    dw[c] = sum over batch and hw of dy * xhat,  db[c] = sum of dy
Pass 1 walks the row as [BLOCK_C channels, BLOCK_HW positions] tiles to get per-channel sums
of dy * xhat and dy, stored as this row's fp32 partials DW_PARTIAL/DB_PARTIAL[b, c] (the host
sums over the batch); the row sums of g and g * xhat follow from them and w. Pass 2 writes dx.
"""
import triton
import triton.language as tl


@triton.jit
def group_norm_fwd(Y, X, W, B, MEAN, RSTD, n_groups, ch_per_group, hw, group_size, eps,
                   has_bias, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    g = row % n_groups
    base = row.to(tl.int64) * group_size
    x_row = X + base
    y_row = Y + base
    offs = tl.arange(0, BLOCK)
    shift = tl.load(x_row).to(tl.float32)
    acc1 = tl.zeros([BLOCK], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, group_size, BLOCK):
        j = start + offs
        m = j < group_size
        xs = tl.where(m, tl.load(x_row + j, mask=m, other=0.0).to(tl.float32) - shift, 0.0)
        acc1 += xs
        acc2 += xs * xs
    m1 = tl.sum(acc1, axis=0) / group_size
    var = tl.maximum(tl.sum(acc2, axis=0) / group_size - m1 * m1, 0.0)
    mean = shift + m1
    rstd = 1.0 / tl.sqrt(var + eps)
    ch0 = g * ch_per_group
    for start in range(0, group_size, BLOCK):
        j = start + offs
        m = j < group_size
        ch = ch0 + j // hw
        x = tl.load(x_row + j, mask=m, other=0.0).to(tl.float32)
        w = tl.load(W + ch, mask=m, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w
        if has_bias != 0:
            y += tl.load(B + ch, mask=m, other=0.0).to(tl.float32)
        tl.store(y_row + j, y.to(Y.dtype.element_ty), mask=m)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@triton.jit
def group_norm_bwd(DX, DW_PARTIAL, DB_PARTIAL, DY, X, W, MEAN, RSTD, n_groups, ch_per_group,
                   hw, group_size, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    row = tl.program_id(0)
    g = row % n_groups
    base = row.to(tl.int64) * group_size
    x_row = X + base
    dy_row = DY + base
    mean = tl.load(MEAN + row)
    rstd = tl.load(RSTD + row)
    ch0 = g * ch_per_group
    # partials of row (b, g) sit at [b, g * ch_per_group + c] = row * ch_per_group + c
    part = row.to(tl.int64) * ch_per_group
    chs = tl.arange(0, BLOCK_C)
    pos = tl.arange(0, BLOCK_HW)
    sum_g = tl.zeros([BLOCK_C], dtype=tl.float32)
    sum_gx = tl.zeros([BLOCK_C], dtype=tl.float32)
    for c0 in range(0, ch_per_group, BLOCK_C):
        ch = c0 + chs
        ch_mask = ch < ch_per_group
        acc_dx = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
        acc_d = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
        for s0 in range(0, hw, BLOCK_HW):
            s = s0 + pos
            m = ch_mask[:, None] & (s < hw)[None, :]
            off = ch.to(tl.int64)[:, None] * hw + s[None, :]
            x = tl.load(x_row + off, mask=m, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + off, mask=m, other=0.0).to(tl.float32)
            acc_dx += dy * ((x - mean) * rstd)  # masked lanes: dy = 0
            acc_d += dy
        s_dx = tl.sum(acc_dx, axis=1)
        s_d = tl.sum(acc_d, axis=1)
        tl.store(DW_PARTIAL + part + ch, s_dx, mask=ch_mask)
        tl.store(DB_PARTIAL + part + ch, s_d, mask=ch_mask)
        w = tl.load(W + ch0 + ch, mask=ch_mask, other=0.0).to(tl.float32)
        sum_gx += w * s_dx
        sum_g += w * s_d
    c_gx = tl.sum(sum_gx, axis=0) / group_size
    c_g = tl.sum(sum_g, axis=0) / group_size
    offs = tl.arange(0, BLOCK_C * BLOCK_HW)
    for start in range(0, group_size, BLOCK_C * BLOCK_HW):
        j = start + offs
        m = j < group_size
        x = tl.load(x_row + j, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + j, mask=m, other=0.0).to(tl.float32)
        w = tl.load(W + ch0 + j // hw, mask=m, other=0.0).to(tl.float32)
        xhat = (x - mean) * rstd
        dx = rstd * (dy * w - c_g - xhat * c_gx)
        tl.store(DX + base + j, dx.to(DX.dtype.element_ty), mask=m)
