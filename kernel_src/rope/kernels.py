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

One program per (batch, seq) position, which loads the cos/sin of that position once and
applies it to every q head and every k head. Two kernels:
  * rope_whole: the position's q heads and k heads as two tiles (BLOCK_HQ x BLOCK_D and
    BLOCK_HK x BLOCK_D), every load issued before the first store and no loop, which keeps a
    whole position (10 KB at Llama's 32 + 8 heads of 128) in flight per program. Used for
    plain RoPE whenever the heads and the half dim fit its tiles (spec.whole_config).
  * rope: M-RoPE, and plain RoPE with longer halves or more heads, BLOCK_H heads x BLOCK_D
    half-dim columns a step; each step's loads wait on the previous step's stores, so it
    keeps less in flight (measured: docs/perf-notes.md, session 24).
Each tensor has its own batch/head/seq element strides (last dim contiguous), so the usual HF
q = x.view(b, s, h, d).transpose(1, 2) is read in place; cos/sin take a batch stride of 0 when
they are shared across the batch.
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
def _sin_terms(c1, c2, s1, s2, bwd):
    """(c1, c2, sa, sb) as (1, BLOCK_D) fp32 rows: the sin terms of the forward, or of the
    adjoint when bwd."""
    c1 = c1.to(tl.float32)[None, :]
    c2 = c2.to(tl.float32)[None, :]
    s1 = s1.to(tl.float32)[None, :]
    s2 = s2.to(tl.float32)[None, :]
    return c1, c2, tl.where(bwd, -s2, s1), tl.where(bwd, -s1, s2)


@triton.jit
def _plain_cos_sin(cos_row, sin_row, d, d_mask, half_dim, bwd):
    c1 = tl.load(cos_row + d, mask=d_mask, other=0.0)
    c2 = tl.load(cos_row + half_dim + d, mask=d_mask, other=0.0)
    s1 = tl.load(sin_row + d, mask=d_mask, other=0.0)
    s2 = tl.load(sin_row + half_dim + d, mask=d_mask, other=0.0)
    return _sin_terms(c1, c2, s1, s2, bwd)


@triton.jit
def _cos_sin(cos_row, sin_row, d, d_mask, half_dim, stride_cp, stride_sp, sec0, sec1, bwd):
    """_sin_terms of half-dim columns d, plain RoPE or M-RoPE (sec0 < half_dim). Loads in
    each branch: pointers merged from both would lose the plain ones' contiguity."""
    if sec0 < half_dim:  # M-RoPE: each column reads its section's plane
        plane = (d >= sec0).to(tl.int64) + (d >= sec1).to(tl.int64)
        c_ptr = cos_row + plane * stride_cp + d
        s_ptr = sin_row + plane * stride_sp + d
        c1 = tl.load(c_ptr, mask=d_mask, other=0.0)
        c2 = tl.load(c_ptr + half_dim, mask=d_mask, other=0.0)
        s1 = tl.load(s_ptr, mask=d_mask, other=0.0)
        s2 = tl.load(s_ptr + half_dim, mask=d_mask, other=0.0)
        c1, c2, sa, sb = _sin_terms(c1, c2, s1, s2, bwd)
    else:
        c1, c2, sa, sb = _plain_cos_sin(cos_row, sin_row, d, d_mask, half_dim, bwd)
    return c1, c2, sa, sb


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
        c1, c2, sa, sb = _cos_sin(cos_row, sin_row, d, d < half_dim, half_dim, stride_cp,
                                  stride_sp, sec0, sec1, bwd)
        _rotate_heads(QO, Q, qo_base, q_base, n_q_heads, stride_qoh, stride_qh, half_dim, d,
                      c1, c2, sa, sb, BLOCK_H)
        _rotate_heads(KO, K, ko_base, k_base, n_k_heads, stride_koh, stride_kh, half_dim, d,
                      c1, c2, sa, sb, BLOCK_H)


@triton.jit
def rope_whole(QO, KO, Q, K, COS, SIN, seq_len, n_q_heads, n_k_heads, half_dim,
               stride_qob, stride_qoh, stride_qos, stride_qb, stride_qh, stride_qs,
               stride_kob, stride_koh, stride_kos, stride_kb, stride_kh, stride_ks,
               stride_cb, stride_cs, stride_sb, stride_ss, stride_cp, stride_sp, sec0, sec1,
               backward, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
               BLOCK_D: tl.constexpr):
    # n_q_heads <= BLOCK_HQ, n_k_heads <= BLOCK_HK, half_dim <= BLOCK_D (spec.whole_config);
    # plain RoPE: the M-RoPE parameters (stride_cp, stride_sp, sec0, sec1) are not read
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    d = tl.arange(0, BLOCK_D)
    d_mask = d < half_dim
    hq = tl.arange(0, BLOCK_HQ).to(tl.int64)
    hk = tl.arange(0, BLOCK_HK).to(tl.int64)
    q_mask = (hq < n_q_heads)[:, None] & d_mask[None, :]
    k_mask = (hk < n_k_heads)[:, None] & d_mask[None, :]
    q_ptr = Q + b * stride_qb + s * stride_qs + hq[:, None] * stride_qh + d[None, :]
    k_ptr = K + b * stride_kb + s * stride_ks + hk[:, None] * stride_kh + d[None, :]
    q1 = tl.load(q_ptr, mask=q_mask, other=0.0).to(tl.float32)
    q2 = tl.load(q_ptr + half_dim, mask=q_mask, other=0.0).to(tl.float32)
    k1 = tl.load(k_ptr, mask=k_mask, other=0.0).to(tl.float32)
    k2 = tl.load(k_ptr + half_dim, mask=k_mask, other=0.0).to(tl.float32)
    # no branch here (plain RoPE only): cos/sin loads in an M-RoPE branch would wait there
    # for their data, after q's and k's were issued at best
    c1, c2, sa, sb = _plain_cos_sin(COS + b * stride_cb + s * stride_cs,
                                    SIN + b * stride_sb + s * stride_ss, d, d_mask, half_dim,
                                    backward != 0)
    qo_ptr = QO + b * stride_qob + s * stride_qos + hq[:, None] * stride_qoh + d[None, :]
    ko_ptr = KO + b * stride_kob + s * stride_kos + hk[:, None] * stride_koh + d[None, :]
    tl.store(qo_ptr, (q1 * c1 - q2 * sa).to(QO.dtype.element_ty), mask=q_mask)
    tl.store(qo_ptr + half_dim, (q2 * c2 + q1 * sb).to(QO.dtype.element_ty), mask=q_mask)
    tl.store(ko_ptr, (k1 * c1 - k2 * sa).to(KO.dtype.element_ty), mask=k_mask)
    tl.store(ko_ptr + half_dim, (k2 * c2 + k1 * sb).to(KO.dtype.element_ty), mask=k_mask)
