"""Rotary position embedding (Hugging Face rotate-half) for q and k in one launch.

Also the shared machinery of Qwen2-VL's multimodal RoPE (ops/mrope.py): the same kernel with
cos/sin planes and section bounds. Eager calls go through RoPEFunction; under torch.compile
the same helpers run as the custom ops liger_aot::rope_fwd / liger_aot::rope_bwd.
"""
from __future__ import annotations

import torch

from liger_aot.kernel_src.rope import spec
from liger_aot.runtime import Kernel

from ._common import SUPPORTED_DTYPES, check_float, check_same_device, check_same_dtype
from ._custom_ops import lazy_custom_op

_rope = Kernel(spec.ROPE)
_rope_whole = Kernel(spec.ROPE_WHOLE)  # a whole position a program, when its tiles fit


# -- layouts -------------------------------------------------------------------------------
# Hugging Face hands q and k over as x.view(b, s, heads, d).transpose(1, 2): dense but not
# contiguous. Outputs take the input's layout, and gradients the layout of q/k themselves
# (whatever layout the incoming gradient has): AccumulateGrad then steals a leaf's gradient
# instead of cloning it into the leaf's strides, and in a model the transpose-back and view of
# the projection's gradient stay views instead of a reshape copy. Nothing here copies a q/k
# sized tensor except when a last dim is not contiguous (the kernel needs unit stride there).

def _unit_last(t):
    """t with a unit-stride last dim: t itself when it has one; else a copy, in which
    broadcast (stride 0) leading dims stay broadcast (an expanded gradient such as loss.sum()'s
    costs one row, not a full tensor)."""
    if t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1:
        return t
    sizes, strides = t.shape, t.stride()
    if all(strides[i] or sizes[i] == 1 for i in range(t.dim() - 1)):
        return t.contiguous()
    rows = tuple(slice(0, 1) if strides[i] == 0 else slice(None) for i in range(t.dim() - 1))
    return t[rows].contiguous().expand(sizes)


def _dense_strides(shape, strides):
    """Strides of a dense tensor of `shape` whose dims lie in memory in the order `strides`
    gives them (innermost = smallest stride; ties: the later dim inner)."""
    out, step = [0] * len(shape), 1
    for i in sorted(range(len(shape)), key=lambda i: (strides[i], -i)):
        out[i] = step
        step *= max(shape[i], 1)
    return tuple(out)


def _out(x):
    """A new tensor shaped like x (last dim unit-stride) in x's layout: x's own strides when x
    is dense (empty_like keeps them), else dense in x's dim order (x a head slice of a fused
    qkv projection, say), or contiguous when x has broadcast dims."""
    out = torch.empty_like(x)
    strides = x.stride()
    if out.stride() != strides and x.numel() > 1:  # x is not dense
        if 0 not in strides:
            dense = _dense_strides(x.shape, strides)
            if dense != out.stride() and dense[-1] == 1:
                out = torch.empty_strided(x.shape, dense, dtype=x.dtype, device=x.device)
        if out.shape[-1] > 1 and out.stride(-1) != 1:
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return out


def _contiguous_strides(shape):
    return _dense_strides(shape, tuple(range(len(shape), 0, -1)))


def _grad_strides(x, xo):
    """The strides to give x's gradient: xo's (x's own when x is dense with a unit last dim).
    A leaf that is not dense gets a contiguous gradient: what AccumulateGrad keeps as is."""
    strides = xo.stride()
    if strides != x.stride() and x.is_leaf and x.requires_grad:
        return _contiguous_strides(x.shape)
    return strides


# -- the launch ----------------------------------------------------------------------------

def _cos_strides(c):
    """(batch, seq, plane) strides of cos/sin shaped (seq, dim), (1 | batch, seq, dim) or, for
    M-RoPE, (3, 1 | batch, seq, dim). A broadcast batch gets stride 0."""
    if c.dim() == 4:
        return (0 if c.shape[1] == 1 else c.stride(1)), c.stride(2), c.stride(0)
    if c.dim() == 2 or c.shape[0] == 1:
        return 0, c.stride(-2), 0
    return c.stride(0), c.stride(1), 0


def _plan(q, k, cos, sin, unsqueeze_dim, sections):
    """Everything of a launch but the tensors and the q/k strides, worked out once per call
    (the backward reuses the forward's): (kernel, grid, config, dtype, seq, half, tail,
    unsqueeze_dim), or None when there is nothing to compute. sections: (sec0, sec1) half-dim
    column bounds of the M-RoPE planes, or None. Plain RoPE runs rope_whole where its tiles
    fit, M-RoPE the looped kernel. The backward may move k's heads into q's slot (only k has
    a gradient): rope_whole's k tile never holds more heads than its q tile, so its config
    fits that launch too."""
    if unsqueeze_dim == 1:
        batch, n_q, seq, dim = q.shape
        n_k = k.shape[1]
    else:
        batch, seq, n_q, dim = q.shape
        n_k = k.shape[2]
    if batch * seq == 0 or dim == 0 or n_q + n_k == 0:
        return None
    half = dim // 2
    sec0, sec1 = sections if sections is not None else (half, half)
    cb, cs, cp = _cos_strides(cos)
    sb, ss, sp = _cos_strides(sin)
    if sections is None and spec.whole_config(half, n_q, n_k) is not None:
        kernel = _rope_whole
        config = kernel.select_config(q.get_device(), half, n_q, n_k)
    else:
        kernel = _rope
        config = kernel.select_config(q.get_device(), half)
    return (kernel, (batch * seq,), config, q.dtype, seq, half,
            (cb, cs, sb, ss, cp, sp, sec0, sec1), unsqueeze_dim)


def _run(plan, cos, sin, qo, ko, q, k, n_q, n_k, backward):
    """One launch: rope(q) -> qo and rope(k) -> ko, or their adjoints when backward. With
    n_k == 0, k/ko are placeholders (pass q/qo) and are never read."""
    kernel, grid, config, dtype, seq, half, tail, unsqueeze_dim = plan
    if n_q + n_k == 0:
        return
    a, b, c, d = qo.stride(), q.stride(), ko.stride(), k.stride()
    if unsqueeze_dim == 1:  # (batch, heads, seq, head_dim): strides in (b, h, s) order as is
        kernel.launch(grid, qo, ko, q, k, cos, sin, seq, n_q, n_k, half,
                      a[0], a[1], a[2], b[0], b[1], b[2], c[0], c[1], c[2], d[0], d[1], d[2],
                      *tail, backward, dtype=dtype, config=config)
    else:  # (batch, seq, heads, head_dim)
        kernel.launch(grid, qo, ko, q, k, cos, sin, seq, n_q, n_k, half,
                      a[0], a[2], a[1], b[0], b[2], b[1], c[0], c[2], c[1], d[0], d[2], d[1],
                      *tail, backward, dtype=dtype, config=config)


def _heads(t, unsqueeze_dim):
    return t.shape[1] if unsqueeze_dim == 1 else t.shape[2]


def _launch(qo, ko, q, k, cos, sin, unsqueeze_dim, sections, backward):
    """Writes rope(q) to qo and rope(k) to ko (the adjoint when backward). k/ko may be None.
    sections: (sec0, sec1) half-dim column bounds of the M-RoPE planes, or None."""
    n_k = 0 if k is None else _heads(k, unsqueeze_dim)
    if k is None:
        k, ko = q, qo  # placeholders, never read: zero k heads
    plan = _plan(q, k, cos, sin, unsqueeze_dim, sections)
    if plan is not None:
        _run(plan, cos, sin, qo, ko, q, k, _heads(q, unsqueeze_dim), n_k, int(backward))


def _forward(q, k, cos, sin, unsqueeze_dim, sections):
    """(rope(q), rope(k) in q's and k's layouts, the launch plan: None when nothing ran)."""
    q, k = _unit_last(q), _unit_last(k)
    qo, ko = _out(q), _out(k)
    plan = _plan(q, k, cos, sin, unsqueeze_dim, sections)
    if plan is not None:
        _run(plan, cos, sin, qo, ko, q, k, _heads(q, unsqueeze_dim), _heads(k, unsqueeze_dim),
             0)
    return qo, ko, plan


def rope_forward(q, k, cos, sin, unsqueeze_dim, sections=None):
    return _forward(q, k, cos, sin, unsqueeze_dim, sections)[:2]


def rope_backward(dqo, dko, cos, sin, unsqueeze_dim, dtype, sections=None):
    """Gradients of q and k, each in its output gradient's layout; a None output gradient
    gives a None input gradient. (The eager path, RoPEFunction, writes them in q's and k's
    layouts instead, see _input_grad.)"""
    grads = []
    for g in (dqo, dko):
        if g is not None:
            if g.dtype != dtype:
                g = g.to(dtype)
            g = _unit_last(g)
        grads.append(g)
    dqo, dko = grads
    if dqo is None:
        dqo, dko, swapped = dko, None, True
    else:
        swapped = False
    if dqo is None:
        return None, None
    dq = _out(dqo)
    dk = _out(dko) if dko is not None else None
    _launch(dq, dk, dqo, dko, cos, sin, unsqueeze_dim, sections, backward=True)
    return (dk, dq) if swapped else (dq, dk)


# -- the backward's buffers ----------------------------------------------------------------
# The adjoint reads each element once and writes it once in the same program, so it could run
# in place over the incoming gradient; deciding that the gradient autograd hands over is
# private takes reference counting through private torch APIs, so the backward only reuses a
# buffer it made itself (a dtype or layout conversion) and otherwise writes a new one.

def _input_grad(g, shape, strides, dtype):
    """(g as the kernel reads it, the buffer for the input gradient: g itself when g is a
    conversion made here and already has the gradient's strides, else a new one with them)."""
    own = False
    if g.dtype != dtype:
        g, own = g.to(dtype), True  # a fresh tensor of our own
    if g.stride(-1) != 1 and g.shape[-1] > 1:
        g = _unit_last(g)
        own = own or g._base is None  # a full copy of our own (not a broadcast view)
    if g.stride() == strides:
        return g, (g if own else torch.empty_like(g))
    return g, torch.empty_strided(shape, strides, dtype=dtype, device=g.device)


class RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, unsqueeze_dim, sections=None):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        qo, ko, plan = _forward(q, k, cos, sin, unsqueeze_dim, sections)
        ctx.save_for_backward(cos, sin)
        ctx.plan = plan
        ctx.n_q, ctx.n_k = _heads(q, unsqueeze_dim), _heads(k, unsqueeze_dim)
        ctx.q_meta = (q.shape, _grad_strides(q, qo), q.dtype)
        ctx.k_meta = (k.shape, _grad_strides(k, ko), k.dtype)
        return qo, ko

    @staticmethod
    def backward(ctx, dqo, dko):
        cos, sin = ctx.saved_tensors
        plan = ctx.plan
        dq = dk = None
        if dqo is not None:
            dqo, dq = _input_grad(dqo, *ctx.q_meta)
        if dko is not None:
            dko, dk = _input_grad(dko, *ctx.k_meta)
        if plan is None or (dq is None and dk is None):  # nothing to compute
            pass
        elif dq is None:  # only k has a gradient: it takes q's slot, no k heads
            _run(plan, cos, sin, dk, dk, dko, dko, ctx.n_k, 0, 1)
        elif dk is None:
            _run(plan, cos, sin, dq, dq, dqo, dqo, ctx.n_q, 0, 1)
        else:
            _run(plan, cos, sin, dq, dk, dqo, dko, ctx.n_q, ctx.n_k, 1)
        return dq, dk, None, None, None, None


# torch.compile path: the same forward/backward as custom ops (one graph node each, no graph
# break). sec0 = sec1 = -1 means plain RoPE (no M-RoPE sections).
def _sections(sec0, sec1):
    return None if sec0 < 0 else (sec0, sec1)


def _fake_out(x):
    return _out(_unit_last(x))


@lazy_custom_op("liger_aot::rope_fwd")
def rope_fwd_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze_dim: int, sec0: int, sec1: int) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_forward(q, k, cos, sin, unsqueeze_dim, _sections(sec0, sec1))


@rope_fwd_op.register_fake
def _(q, k, cos, sin, unsqueeze_dim, sec0, sec1):
    return _fake_out(q), _fake_out(k)


@lazy_custom_op("liger_aot::rope_bwd")
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
    cos = _unit_last(cos)
    sin = _unit_last(sin)
    if torch.compiler.is_compiling():
        sec0, sec1 = sections if sections is not None else (-1, -1)
        return rope_fwd_op(q, k, cos, sin, unsqueeze_dim, sec0, sec1)
    return RoPEFunction.apply(q, k, cos, sin, unsqueeze_dim, sections)


def check_qk(q, k, cos, sin, unsqueeze_dim):
    """Common checks of q, k, cos, sin; returns (batch, seq, head_dim)."""
    # the usual case in one expression (host time is much of this op's cost at HF's shapes);
    # anything else goes through the checks that name what is wrong
    T = torch.Tensor
    if not (isinstance(q, T) and isinstance(k, T) and isinstance(cos, T) and isinstance(sin, T)
            and q.dtype in SUPPORTED_DTYPES and k.dtype == q.dtype and cos.dtype == q.dtype
            and sin.dtype == q.dtype and k.device == q.device and cos.device == q.device
            and sin.device == q.device):
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
