"""Rotary position embedding, Hugging Face "rotate half" layout, q and k in one launch.

With x = [x1, x2] split in halves of the head dim and cos = [c1, c2], sin = [s1, s2]:
    forward   y = x * cos + rotate_half(x) * sin,  rotate_half(x) = [-x2, x1]
              y1 = x1 * c1 - x2 * s1          y2 = x2 * c2 + x1 * s2
The map is linear, y = (C + S R) x with R = [[0, -I], [I, 0]], so its adjoint is
    backward  dx = C dy + R^T S dy,  R^T = [[0, I], [-I, 0]]
              dx1 = dy1 * c1 + dy2 * s2       dx2 = dy2 * c2 - dy1 * s1
which is the forward formula with (s1, s2) replaced by (-s2, -s1). One kernel serves both
directions: `backward` (a runtime flag, uniform across the grid) picks the sin halves.

Qwen2-VL multimodal RoPE (M-RoPE) runs on the same kernel: cos/sin then hold three planes
(temporal, height, width; plane stride stride_cp/stride_sp) and half-dim column d takes its
cos/sin from plane 0 when d < sec0, 1 when d < sec1, else 2, for both halves (Hugging Face's
split of cos by mrope_section * 2). Plain RoPE passes sec0 = sec1 = half_dim, which selects a
branch with contiguous cos/sin loads (the branch is uniform across the grid).

One program per (batch, seq) position: it loads the cos/sin chunk of that position once and
applies it to every q head and every k head, BLOCK_H heads x BLOCK_D half-dim columns at a
time. Each tensor has its own batch/head/seq element strides (last dim contiguous), so the
usual HF q = x.view(b, s, h, d).transpose(1, 2) is read in place; cos/sin take a batch stride
of 0 when they are shared across the batch.
"""
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(OUT, X, out_base, x_base, n_heads, stride_oh, stride_xh, half_dim, d,
                  c1, c2, sa, sb, BLOCK_H: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    d_mask = d < half_dim
    for h0 in range(0, n_heads, BLOCK_H):
        h = (h0 + heads).to(tl.int64)
        mask = (h < n_heads)[:, None] & d_mask[None, :]
        x_ptr = X + x_base + h[:, None] * stride_xh + d[None, :]
        x1 = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + half_dim, mask=mask, other=0.0).to(tl.float32)
        y1 = x1 * c1 - x2 * sa
        y2 = x2 * c2 + x1 * sb
        o_ptr = OUT + out_base + h[:, None] * stride_oh + d[None, :]
        tl.store(o_ptr, y1.to(OUT.dtype.element_ty), mask=mask)
        tl.store(o_ptr + half_dim, y2.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def rope(QO, KO, Q, K, COS, SIN, seq_len, n_q_heads, n_k_heads, half_dim,
         stride_qob, stride_qoh, stride_qos, stride_qb, stride_qh, stride_qs,
         stride_kob, stride_koh, stride_kos, stride_kb, stride_kh, stride_ks,
         stride_cb, stride_cs, stride_sb, stride_ss, stride_cp, stride_sp, sec0, sec1,
         backward, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    cos_row = COS + b * stride_cb + s * stride_cs
    sin_row = SIN + b * stride_sb + s * stride_ss
    qo_base = b * stride_qob + s * stride_qos
    q_base = b * stride_qb + s * stride_qs
    ko_base = b * stride_kob + s * stride_kos
    k_base = b * stride_kb + s * stride_ks
    bwd = backward != 0
    for d0 in range(0, half_dim, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        d_mask = d < half_dim
        if sec0 < half_dim:  # M-RoPE: each column reads its section's plane
            plane = (d >= sec0).to(tl.int64) + (d >= sec1).to(tl.int64)
            c_ptr = cos_row + plane * stride_cp + d
            s_ptr = sin_row + plane * stride_sp + d
            c1 = tl.load(c_ptr, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            c2 = tl.load(c_ptr + half_dim, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            s1 = tl.load(s_ptr, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            s2 = tl.load(s_ptr + half_dim, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        else:
            c1 = tl.load(cos_row + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            c2 = tl.load(cos_row + half_dim + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            s1 = tl.load(sin_row + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            s2 = tl.load(sin_row + half_dim + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        sa = tl.where(bwd, -s2, s1)
        sb = tl.where(bwd, -s1, s2)
        _rotate_heads(QO, Q, qo_base, q_base, n_q_heads, stride_qoh, stride_qh, half_dim, d,
                      c1, c2, sa, sb, BLOCK_H)
        _rotate_heads(KO, K, ko_base, k_base, n_k_heads, stride_koh, stride_kh, half_dim, d,
                      c1, c2, sa, sb, BLOCK_H)
