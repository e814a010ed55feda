"""Rotary position embedding (Hugging Face rotate-half) for q and k in one launch."""
from __future__ import annotations

import torch

from liger_aot.kernel_src.rope import spec
from liger_aot.runtime import Kernel

from ._common import check_float, check_same_device, check_same_dtype, last_dim_contiguous

_rope = Kernel(spec.ROPE)


def _bhs_strides(t, unsqueeze_dim):
    """(batch, head, seq) element strides of a 4-D tensor laid out per unsqueeze_dim."""
    if unsqueeze_dim == 1:  # (batch, heads, seq, head_dim)
        return t.stride(0), t.stride(1), t.stride(2)
    return t.stride(0), t.stride(2), t.stride(1)  # (batch, seq, heads, head_dim)


def _cos_strides(c):
    """(batch, seq) strides of cos/sin shaped (seq, dim) or (1 | batch, seq, dim)."""
    if c.dim() == 2 or c.shape[0] == 1:
        return 0, c.stride(-2)
    return c.stride(0), c.stride(1)


def _like(x):
    """An output with x's strides when x is dense (so a transposed HF q stays coalesced)."""
    out = torch.empty_like(x)
    if out.dim() and out.shape[-1] > 1 and out.stride(-1) != 1:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return out


def _launch(qo, ko, q, k, cos, sin, unsqueeze_dim, backward):
    """Writes rope(q) to qo and rope(k) to ko (the adjoint when backward). k/ko may be None."""
    if unsqueeze_dim == 1:
        batch, n_q, seq, dim = q.shape
    else:
        batch, seq, n_q, dim = q.shape
    n_k = 0
    if k is not None:
        n_k = k.shape[1] if unsqueeze_dim == 1 else k.shape[2]
    else:
        k, ko = q, qo  # placeholders, never read: zero k heads
    if batch * seq == 0 or dim == 0 or n_q + n_k == 0:
        return
    half = dim // 2
    config = spec.select_config(half)
    _rope.launch((batch * seq,), qo, ko, q, k, cos, sin, seq, n_q, n_k, half,
          *_bhs_strides(qo, unsqueeze_dim), *_bhs_strides(q, unsqueeze_dim),
          *_bhs_strides(ko, unsqueeze_dim), *_bhs_strides(k, unsqueeze_dim),
          *_cos_strides(cos), *_cos_strides(sin), int(backward),
          dtype=q.dtype, config=config)


def rope_forward(q, k, cos, sin, unsqueeze_dim):
    q = last_dim_contiguous(q)
    k = last_dim_contiguous(k)
    qo, ko = _like(q), _like(k)
    _launch(qo, ko, q, k, cos, sin, unsqueeze_dim, backward=False)
    return qo, ko


def rope_backward(dqo, dko, cos, sin, unsqueeze_dim, dtype):
    """Gradients of q and k; a None output gradient gives a None input gradient."""
    grads = []
    for g in (dqo, dko):
        if g is not None:
            g = last_dim_contiguous(g.to(dtype))
        grads.append(g)
    dqo, dko = grads
    if dqo is None:
        dqo, dko, swapped = dko, None, True
    else:
        swapped = False
    if dqo is None:
        return None, None
    dq = _like(dqo)
    dk = _like(dko) if dko is not None else None
    _launch(dq, dk, dqo, dko, cos, sin, unsqueeze_dim, backward=True)
    return (dk, dq) if swapped else (dq, dk)


class RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, unsqueeze_dim):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        qo, ko = rope_forward(q, k, cos, sin, unsqueeze_dim)
        ctx.save_for_backward(cos, sin)
        ctx.unsqueeze_dim, ctx.dtype = unsqueeze_dim, q.dtype
        return qo, ko

    @staticmethod
    def backward(ctx, dqo, dko):
        cos, sin = ctx.saved_tensors
        dq, dk = rope_backward(dqo, dko, cos, sin, ctx.unsqueeze_dim, ctx.dtype)
        return dq, dk, None, None, None


def liger_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, position_ids=None, unsqueeze_dim: int = 1):
    """Hugging Face apply_rotary_pos_emb: returns (q * cos + rotate_half(q) * sin, the same
    for k) as new tensors.

    q: (batch, n_q_heads, seq, head_dim), k: (batch, n_k_heads, seq, head_dim) for
    unsqueeze_dim=1, or (batch, seq, heads, head_dim) for unsqueeze_dim=2. cos, sin:
    (1 | batch, seq, head_dim) or (seq, head_dim), in q's dtype. position_ids is accepted for
    signature compatibility and unused, as in Hugging Face. Gradients flow to q and k only
    (cos and sin are treated as constants)."""
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_float(name, t)
    check_same_device(q=q, k=k, cos=cos, sin=sin)
    check_same_dtype(q=q, k=k, cos=cos, sin=sin)
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"unsqueeze_dim must be 1 (q is batch, heads, seq, head_dim) or 2 "
                         f"(q is batch, seq, heads, head_dim), got {unsqueeze_dim!r}")
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D, got shape {tuple(q.shape)}")
    if k.dim() != 4:
        raise ValueError(f"k must be 4-D, got shape {tuple(k.shape)}")
    seq_axis = 2 if unsqueeze_dim == 1 else 1
    batch, seq, dim = q.shape[0], q.shape[seq_axis], q.shape[3]
    if (k.shape[0], k.shape[seq_axis], k.shape[3]) != (batch, seq, dim):
        raise ValueError(f"k must match q in batch, seq and head_dim, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)} (unsqueeze_dim={unsqueeze_dim})")
    if dim % 2:
        raise ValueError(f"head_dim must be even, got {dim}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have one shape, got cos {tuple(cos.shape)} and "
                         f"sin {tuple(sin.shape)}")
    if not (cos.dim() == 2 or (cos.dim() == 3 and cos.shape[0] in (1, batch))) \
            or tuple(cos.shape[-2:]) != (seq, dim):
        raise ValueError(f"cos must have shape ({batch} or 1, {seq}, {dim}) or ({seq}, {dim}) "
                         f"for q {tuple(q.shape)}, got {tuple(cos.shape)}")
    cos = last_dim_contiguous(cos)
    sin = last_dim_contiguous(sin)
    return RoPEFunction.apply(q, k, cos, sin, unsqueeze_dim)
