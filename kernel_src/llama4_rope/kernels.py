"""Llama-4 rotary position embedding: complex multiplication on interleaved pairs.

Hugging Face's Llama4 apply_rotary_emb views consecutive pairs (x[2i], x[2i+1]) of the head
dim as the complex number re + i im and multiplies it by freqs_cis = fr + i fi:
    forward   y_re = re * fr - im * fi        y_im = re * fi + im * fr
The map is multiplication by f, so its adjoint is multiplication by conj(f):
    backward  dx = dy * conj(f)   (the forward formula with fi negated)
One kernel serves both: `backward` (a runtime flag, uniform across the grid) flips fi.

freqs_cis arrives as its real view (complex64 -> fp32 pairs, (re, im) interleaved), so the
kernel reads 2 * BLOCK_D consecutive floats of frequencies and of each head row, and splits
them into even/odd lanes in registers: every load and store is contiguous.

One program per (batch, seq) position: it loads the frequency chunk of that position once and
applies it to every q head and every k head, BLOCK_H heads x 2 * BLOCK_D columns at a time.
Each tensor has its own batch/head/seq element strides (last dim contiguous); freqs take a
batch stride of 0 when shared across the batch. Arithmetic in fp32, cast at the store (as HF,
which computes in fp32 and casts the result to the input dtype).
"""
import triton
import triton.language as tl


@triton.jit
def _rotate_pairs(OUT, X, out_base, x_base, n_heads, stride_oh, stride_xh, head_dim, c,
                  fr, fi, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    c_mask = c < head_dim
    for h0 in range(0, n_heads, BLOCK_H):
        h = (h0 + heads).to(tl.int64)
        mask = (h < n_heads)[:, None] & c_mask[None, :]
        x = tl.load(X + x_base + h[:, None] * stride_xh + c[None, :], mask=mask, other=0.0)
        re, im = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_H, BLOCK_D, 2)))
        y_re = re * fr - im * fi
        y_im = re * fi + im * fr
        y = tl.reshape(tl.join(y_re, y_im), (BLOCK_H, 2 * BLOCK_D))
        tl.store(OUT + out_base + h[:, None] * stride_oh + c[None, :],
                 y.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def llama4_rope(QO, KO, Q, K, FREQS, seq_len, n_q_heads, n_k_heads, head_dim,
                stride_qob, stride_qoh, stride_qos, stride_qb, stride_qh, stride_qs,
                stride_kob, stride_koh, stride_kos, stride_kb, stride_kh, stride_ks,
                stride_fb, stride_fs, backward,
                BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    f_row = FREQS + b * stride_fb + s * stride_fs
    qo_base = b * stride_qob + s * stride_qos
    q_base = b * stride_qb + s * stride_qs
    ko_base = b * stride_kob + s * stride_kos
    k_base = b * stride_kb + s * stride_ks
    bwd = backward != 0
    for c0 in range(0, head_dim, 2 * BLOCK_D):
        c = c0 + tl.arange(0, 2 * BLOCK_D)
        f = tl.load(f_row + c, mask=c < head_dim, other=0.0).to(tl.float32)
        fr, fi = tl.split(tl.reshape(f, (BLOCK_D, 2)))
        fi = tl.where(bwd, -fi, fi)
        _rotate_pairs(QO, Q, qo_base, q_base, n_q_heads, stride_qoh, stride_qh, head_dim, c,
                      fr[None, :], fi[None, :], BLOCK_H, BLOCK_D)
        _rotate_pairs(KO, K, ko_base, k_base, n_k_heads, stride_koh, stride_kh, head_dim, c,
                      fr[None, :], fi[None, :], BLOCK_H, BLOCK_D)
