"""Rotary position embedding (Hugging Face rotate-half) for q and k in one launch.

Also the shared machinery of Qwen2-VL's multimodal RoPE (ops/mrope.py): the same kernel with
cos/sin planes and section bounds. Eager calls go through RoPEFunction; under torch.compile
the same helpers run as the custom ops liger_aot::rope_fwd / liger_aot::rope_bwd.
"""
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
    """(batch, seq, plane) strides of cos/sin shaped (seq, dim), (1 | batch, seq, dim) or, for
    M-RoPE, (3, 1 | batch, seq, dim). A broadcast batch gets stride 0."""
    if c.dim() == 4:
        return (0 if c.shape[1] == 1 else c.stride(1)), c.stride(2), c.stride(0)
    if c.dim() == 2 or c.shape[0] == 1:
        return 0, c.stride(-2), 0
    return c.stride(0), c.stride(1), 0


def _like(x):
    """An output with x's strides when x is dense (so a transposed HF q stays coalesced)."""
    out = torch.empty_like(x)
    if out.dim() and out.shape[-1] > 1 and out.stride(-1) != 1:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return out


def _launch(qo, ko, q, k, cos, sin, unsqueeze_dim, sections, backward):
    """Writes rope(q) to qo and rope(k) to ko (the adjoint when backward). k/ko may be None.
    sections: (sec0, sec1) half-dim column bounds of the M-RoPE planes, or None."""
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
    sec0, sec1 = sections if sections is not None else (half, half)
    cb, cs, cp = _cos_strides(cos)
    sb, ss, sp = _cos_strides(sin)
    config = _rope.select_config(q.get_device(), half)
    _rope.launch((batch * seq,), qo, ko, q, k, cos, sin, seq, n_q, n_k, half,
                 *_bhs_strides(qo, unsqueeze_dim), *_bhs_strides(q, unsqueeze_dim),
                 *_bhs_strides(ko, unsqueeze_dim), *_bhs_strides(k, unsqueeze_dim),
                 cb, cs, sb, ss, cp, sp, sec0, sec1, int(backward),
                 dtype=q.dtype, config=config)


def rope_forward(q, k, cos, sin, unsqueeze_dim, sections=None):
    q = last_dim_contiguous(q)
    k = last_dim_contiguous(k)
    qo, ko = _like(q), _like(k)
    _launch(qo, ko, q, k, cos, sin, unsqueeze_dim, sections, backward=False)
    return qo, ko


def rope_backward(dqo, dko, cos, sin, unsqueeze_dim, dtype, sections=None):
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
    _launch(dq, dk, dqo, dko, cos, sin, unsqueeze_dim, sections, backward=True)
    return (dk, dq) if swapped else (dq, dk)


class RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, unsqueeze_dim, sections=None):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        qo, ko = rope_forward(q, k, cos, sin, unsqueeze_dim, sections)
        ctx.save_for_backward(cos, sin)
        ctx.unsqueeze_dim, ctx.dtype, ctx.sections = unsqueeze_dim, q.dtype, sections
        return qo, ko

    @staticmethod
    def backward(ctx, dqo, dko):
        cos, sin = ctx.saved_tensors
        dq, dk = rope_backward(dqo, dko, cos, sin, ctx.unsqueeze_dim, ctx.dtype, ctx.sections)
        return dq, dk, None, None, None, None


# torch.compile path: the same forward/backward as custom ops (one graph node each, no graph
# break). sec0 = sec1 = -1 means plain RoPE (no M-RoPE sections).
def _sections(sec0, sec1):
    return None if sec0 < 0 else (sec0, sec1)


def _fake_out(x):
    return _like(last_dim_contiguous(x))


@torch.library.custom_op("liger_aot::rope_fwd", mutates_args=())
def rope_fwd_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze_dim: int, sec0: int, sec1: int) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_forward(q, k, cos, sin, unsqueeze_dim, _sections(sec0, sec1))


@rope_fwd_op.register_fake
def _(q, k, cos, sin, unsqueeze_dim, sec0, sec1):
    return _fake_out(q), _fake_out(k)


@torch.library.custom_op("liger_aot::rope_bwd", mutates_args=())
def rope_bwd_op(dqo: torch.Tensor, dko: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze_dim: int, sec0: int, sec1: int) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_backward(dqo, dko, cos, sin, unsqueeze_dim, dqo.dtype, _sections(sec0, sec1))


@rope_bwd_op.register_fake
def _(dqo, dko, cos, sin, unsqueeze_dim, sec0, sec1):
    return _fake_out(dqo), _fake_out(dko)


def _setup_context(ctx, inputs, output):
    q, k, cos, sin, unsqueeze_dim, sec0, sec1 = inputs
    ctx.save_for_backward(cos, sin)
    ctx.unsqueeze_dim, ctx.sec0, ctx.sec1 = unsqueeze_dim, sec0, sec1
    ctx.q_meta = (q.shape, q.dtype, q.device)
    ctx.k_meta = (k.shape, k.dtype, k.device)


def _backward(ctx, dqo, dko):
    cos, sin = ctx.saved_tensors
    if dqo is None:
        shape, dtype, device = ctx.q_meta
        dqo = torch.zeros(shape, dtype=dtype, device=device)
    if dko is None:
        shape, dtype, device = ctx.k_meta
        dko = torch.zeros(shape, dtype=dtype, device=device)
    dq, dk = rope_bwd_op(dqo.to(ctx.q_meta[1]), dko.to(ctx.k_meta[1]), cos, sin,
                         ctx.unsqueeze_dim, ctx.sec0, ctx.sec1)
    return dq, dk, None, None, None, None, None


rope_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def apply_rope(q, k, cos, sin, unsqueeze_dim, sections):
    """Validated inputs -> (q_embed, k_embed) on the eager or the torch.compile path."""
    cos = last_dim_contiguous(cos)
    sin = last_dim_contiguous(sin)
    if torch.compiler.is_compiling():
        sec0, sec1 = sections if sections is not None else (-1, -1)
        return rope_fwd_op(q, k, cos, sin, unsqueeze_dim, sec0, sec1)
    return RoPEFunction.apply(q, k, cos, sin, unsqueeze_dim, sections)


def check_qk(q, k, cos, sin, unsqueeze_dim):
    """Common checks of q, k, cos, sin; returns (batch, seq, head_dim)."""
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
    return batch, seq, dim


def liger_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, position_ids=None, unsqueeze_dim: int = 1):
    """Hugging Face apply_rotary_pos_emb: returns (q * cos + rotate_half(q) * sin, the same
    for k) as new tensors.

    q: (batch, n_q_heads, seq, head_dim), k: (batch, n_k_heads, seq, head_dim) for
    unsqueeze_dim=1, or (batch, seq, heads, head_dim) for unsqueeze_dim=2. cos, sin:
    (1 | batch, seq, head_dim) or (seq, head_dim), in q's dtype. position_ids is accepted for
    signature compatibility and unused, as in Hugging Face. Gradients flow to q and k only
    (cos and sin are treated as constants)."""
    batch, seq, dim = check_qk(q, k, cos, sin, unsqueeze_dim)
    if not (cos.dim() == 2 or (cos.dim() == 3 and cos.shape[0] in (1, batch))) \
            or tuple(cos.shape[-2:]) != (seq, dim):
        raise ValueError(f"cos must have shape ({batch} or 1, {seq}, {dim}) or ({seq}, {dim}) "
                         f"for q {tuple(q.shape)}, got {tuple(cos.shape)}")
    return apply_rope(q, k, cos, sin, unsqueeze_dim, None)
