"""Llama-4 rotary position embedding (complex multiplication on interleaved pairs) for q and k
in one launch. Eager calls go through Llama4RoPEFunction; under torch.compile the same helpers
run as the custom ops liger_aot::llama4_rope_fwd / liger_aot::llama4_rope_bwd.
"""
from __future__ import annotations

import torch

from liger_aot.kernel_src.llama4_rope import spec
from liger_aot.runtime import Kernel

from ._common import check_float, check_same_device, check_same_dtype, last_dim_contiguous
from ._custom_ops import lazy_custom_op

_kernel = Kernel(spec.LLAMA4_ROPE)


def _bhs_strides(t):
    """(batch, head, seq) element strides of a (batch, seq, heads, head_dim) tensor."""
    return t.stride(0), t.stride(2), t.stride(1)


def _like(x):
    out = torch.empty_like(x)
    if out.dim() and out.shape[-1] > 1 and out.stride(-1) != 1:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return out


def _launch(qo, ko, q, k, freqs, backward):
    """freqs: fp32 (1 | batch, seq, head_dim) real view of the complex frequencies."""
    batch, seq, n_q, dim = q.shape
    n_k = k.shape[2]
    if batch * seq == 0 or dim == 0 or n_q + n_k == 0:
        return
    config = _kernel.select_config(q.get_device(), dim // 2)
    stride_fb = 0 if freqs.shape[0] == 1 else freqs.stride(0)
    _kernel.launch((batch * seq,), qo, ko, q, k, freqs, seq, n_q, n_k, dim,
                   *_bhs_strides(qo), *_bhs_strides(q), *_bhs_strides(ko), *_bhs_strides(k),
                   stride_fb, freqs.stride(1), int(backward), dtype=q.dtype, config=config)


def llama4_rope_forward(q, k, freqs):
    q = last_dim_contiguous(q)
    k = last_dim_contiguous(k)
    qo, ko = _like(q), _like(k)
    _launch(qo, ko, q, k, freqs, backward=False)
    return qo, ko


def llama4_rope_backward(dqo, dko, freqs, q_meta, k_meta):
    """Gradients of q and k. A None output gradient counts as zeros."""
    grads = []
    for g, (shape, dtype, device) in ((dqo, q_meta), (dko, k_meta)):
        if g is None:
            g = torch.zeros(shape, dtype=dtype, device=device)
        grads.append(last_dim_contiguous(g.to(dtype)))
    dqo, dko = grads
    dq, dk = _like(dqo), _like(dko)
    _launch(dq, dk, dqo, dko, freqs, backward=True)
    return dq, dk


class Llama4RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, freqs):
        qo, ko = llama4_rope_forward(q, k, freqs)
        ctx.save_for_backward(freqs)
        ctx.q_meta = (q.shape, q.dtype, q.device)
        ctx.k_meta = (k.shape, k.dtype, k.device)
        return qo, ko

    @staticmethod
    def backward(ctx, dqo, dko):
        (freqs,) = ctx.saved_tensors
        dq, dk = llama4_rope_backward(dqo, dko, freqs, ctx.q_meta, ctx.k_meta)
        return dq, dk, None


def _fake_out(x):
    return _like(last_dim_contiguous(x))


@lazy_custom_op("liger_aot::llama4_rope_fwd")
def llama4_rope_fwd_op(q: torch.Tensor, k: torch.Tensor,
                       freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return llama4_rope_forward(q, k, freqs)


@llama4_rope_fwd_op.register_fake
def _(q, k, freqs):
    return _fake_out(q), _fake_out(k)


@lazy_custom_op("liger_aot::llama4_rope_bwd")
def llama4_rope_bwd_op(dqo: torch.Tensor, dko: torch.Tensor,
                       freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return llama4_rope_backward(dqo, dko, freqs, (dqo.shape, dqo.dtype, dqo.device),
                                (dko.shape, dko.dtype, dko.device))


@llama4_rope_bwd_op.register_fake
def _(dqo, dko, freqs):
    return _fake_out(dqo), _fake_out(dko)


def _setup_context(ctx, inputs, output):
    q, k, freqs = inputs
    ctx.save_for_backward(freqs)
    ctx.q_meta = (q.shape, q.dtype, q.device)
    ctx.k_meta = (k.shape, k.dtype, k.device)


def _backward(ctx, dqo, dko):
    (freqs,) = ctx.saved_tensors
    grads = []
    for g, (shape, dtype, device) in ((dqo, ctx.q_meta), (dko, ctx.k_meta)):
        grads.append(torch.zeros(shape, dtype=dtype, device=device) if g is None
                     else g.to(dtype))
    dq, dk = llama4_rope_bwd_op(grads[0], grads[1], freqs)
    return dq, dk, None


llama4_rope_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def _check_freqs(freqs_cis, name):
    if not isinstance(freqs_cis, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(freqs_cis).__name__}")
    if freqs_cis.dtype not in (torch.complex64, torch.complex128):
        raise TypeError(f"{name} must be complex64 (or complex128), got {freqs_cis.dtype}")


def _freqs_real(freqs_cis, batch, seq, half, name, allow_flat):
    f = freqs_cis
    if allow_flat and f.numel() == seq * half and f.shape[-1] == half:
        f = f.reshape(seq, half)
    if f.dim() == 2:
        f = f.unsqueeze(0)
    if f.dim() != 3 or f.shape[0] not in (1, batch) or tuple(f.shape[1:]) != (seq, half):
        raise ValueError(f"{name} must have shape ({batch} or 1, {seq}, {half}) or ({seq}, "
                         f"{half}) for q of head_dim {2 * half}, got {tuple(freqs_cis.shape)}")
    if f.dtype != torch.complex64:
        f = f.to(torch.complex64)
    f = f.resolve_conj()
    if f.stride(-1) != 1:
        f = f.contiguous()
    return torch.view_as_real(f.detach()).flatten(-2)  # fp32 (1 | batch, seq, head_dim)


def _rope(xq, xk, freqs_cis, name, allow_flat):
    check_float("xq", xq)
    check_float("xk", xk)
    _check_freqs(freqs_cis, name)
    check_same_device(xq=xq, xk=xk, **{name: freqs_cis})
    check_same_dtype(xq=xq, xk=xk)
    for n, t in (("xq", xq), ("xk", xk)):
        if t.dim() != 4:
            raise ValueError(f"{n} must be 4-D (batch, seq, heads, head_dim), got shape "
                             f"{tuple(t.shape)}")
    batch, seq, _, dim = xq.shape
    if (xk.shape[0], xk.shape[1], xk.shape[3]) != (batch, seq, dim):
        raise ValueError(f"xk must match xq in batch, seq and head_dim, got xq "
                         f"{tuple(xq.shape)} and xk {tuple(xk.shape)}")
    if dim % 2:
        raise ValueError(f"head_dim must be even, got {dim}")
    freqs = _freqs_real(freqs_cis, batch, seq, dim // 2, name, allow_flat)
    if torch.compiler.is_compiling():
        return llama4_rope_fwd_op(xq, xk, freqs)
    return Llama4RoPEFunction.apply(xq, xk, freqs)


def liger_llama4_text_rotary_pos_emb(xq: torch.Tensor, xk: torch.Tensor,
                                     freqs_cis: torch.Tensor):
    """Hugging Face Llama4 apply_rotary_emb: (xq * freqs_cis, xk * freqs_cis) on consecutive
    pairs of the head dim viewed as complex numbers, cast back to xq's dtype.

    xq: (batch, seq, n_q_heads, head_dim), xk: (batch, seq, n_k_heads, head_dim), float32,
    bfloat16 or float16. freqs_cis: complex64, (batch | 1, seq, head_dim // 2) or
    (seq, head_dim // 2). Gradients flow to xq and xk only (freqs_cis is a constant)."""
    return _rope(xq, xk, freqs_cis, "freqs_cis", allow_flat=False)


def liger_llama4_vision_rotary_pos_emb(query: torch.Tensor, key: torch.Tensor,
                                       freqs_ci: torch.Tensor):
    """Hugging Face Llama4 vision_apply_rotary_emb: as the text version, with freqs_ci shared
    across the batch and given in any shape of seq * head_dim // 2 complex values whose last
    dim is head_dim // 2 (e.g. Llama4VisionRotaryEmbedding's (seq, 1, head_dim // 2))."""
    return _rope(query, key, freqs_ci, "freqs_ci", allow_flat=True)
