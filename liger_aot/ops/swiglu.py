"""SwiGLU: c = silu(a) * b elementwise, forward and backward on AOT kernels.

The kernels serve every gated activation c = act(a) * b (ops/geglu.py uses act=GELU-tanh).
Eager calls go through GatedFunction; under torch.compile the same helpers run as the custom
ops liger_aot::glu_fwd / liger_aot::glu_bwd.
"""
from __future__ import annotations

import torch

from liger_aot.kernel_src.swiglu import spec
from liger_aot.runtime import Kernel

from ._common import (SUPPORTED_DTYPES, check_float, check_same_device, check_same_dtype,
                      check_same_shape, graph_retained, row_stride, rows_view)
from ._custom_ops import lazy_custom_op

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)

ACT_SILU = spec.ACT_SILU
ACT_GELU_TANH = spec.ACT_GELU_TANH


def _rows(name, t, n):
    """(t as rows of n, row stride). A contiguous t is passed as it is: no view to build, which
    matters at small shapes where host time is the cost (see docs/perf-notes.md)."""
    if t.is_contiguous():
        return t, n
    t2 = rows_view(name, t, n)
    return t2, row_stride(t2)


# Host cost per call is what limits these ops at small shapes (docs/perf-notes.md, issue 5):
# outputs are allocated with empty_like (a third of torch.empty(shape, dtype=, device=)'s
# argument parsing), and what the forward learned about its inputs is kept for the backward.
_empty_like = torch.empty_like
_CONTIGUOUS = torch.contiguous_format


_MAX_PLANS = 1024
_plans = {}  # (rows, n, device, dtype) -> (forward grid, config, backward grid, config)


def _plan(rows, n, device, dtype):
    """The launch shapes of both kernels for one call shape: resolved once, then one dict
    lookup per call (forward) and none in the backward, which gets them from the forward."""
    key = (rows, n, device, dtype)
    plan = _plans.get(key)
    if plan is None:
        fwd_config = _fwd.select_config(device, n, dtype=dtype)
        bwd_config = _bwd.select_config(device, n, dtype=dtype)
        plan = (spec.grid(rows, n, fwd_config), fwd_config, spec.grid(rows, n, bwd_config),
                bwd_config)
        if len(_plans) < _MAX_PLANS:  # bounded: shapes could be unbounded
            _plans[key] = plan
    return plan


def _forward(a, b, act):
    """glu_forward's work, plus (rows, n, device index, dtype, act, backward grid, backward
    config) for the backward."""
    n = a.shape[-1]
    contiguous = a.is_contiguous()
    # = torch.empty(a.shape, like a); a contiguous a's layout is that already, and the
    # format argument costs host time
    c = _empty_like(a) if contiguous else _empty_like(a, memory_format=_CONTIGUOUS)
    rows = a.numel() // n if n else 0
    dtype = a.dtype
    if rows == 0:
        return c, a, b, (0, n, -1, dtype, act, None, None)
    if contiguous:  # _rows, inlined
        a2, stride_a = a, n
    else:
        a2, stride_a = _rows("a", a, n)
    if b.is_contiguous():
        b2, stride_b = b, n
    else:
        b2, stride_b = _rows("b", b, n)
    device = a2.get_device()
    grid, config, bwd_grid, bwd_config = _plan(rows, n, device, dtype)
    _fwd.launch(grid, c, a2, b2, rows, n, n, stride_a, stride_b, act, dtype=dtype,
                config=config)
    return c, a2, b2, (rows, n, device, dtype, act, bwd_grid, bwd_config)


def _launch_backward(da, db, dc, a2, b2, rows, n, device, dtype, act, grid=None, config=None):
    """The backward kernel; grid and config as _plan gives them (looked up when None)."""
    if dc.is_contiguous():  # _rows, inlined
        dc2, stride_dc = dc, n
    else:
        dc2, stride_dc = _rows("grad_output", dc, n)
    if dc2.dtype is not dtype:
        dc2 = dc2.to(dtype)  # keeps the layout, so stride_dc holds
    # rows and strides of the tensors as unpacked: a saved-tensor hook may have changed the
    # layout the forward saw (e.g. offloading that copies, or hands back any strided view)
    if a2.is_contiguous():
        stride_a = n
    else:
        a2, stride_a = _rows("a", a2, n)
    if b2.is_contiguous():
        stride_b = n
    else:
        b2, stride_b = _rows("b", b2, n)
    if config is None:
        _, _, grid, config = _plan(rows, n, device, dtype)
    _bwd.launch(grid, da, db, dc2, a2, b2, rows, n, n, n, stride_dc, stride_a, stride_b, act,
                dtype=dtype, config=config)


def glu_forward(a, b, act=ACT_SILU):
    """a, b: (..., n), same shape. Returns (c with a's shape, a and b as the kernel read them,
    to be saved for glu_backward)."""
    c, a2, b2, _ = _forward(a, b, act)
    return c, a2, b2


def glu_backward(dc, a2, b2, shape, act=ACT_SILU):
    """dc: gradient of c (any strides); a2, b2 from glu_forward. Returns (da, db) of shape."""
    da = torch.empty(shape, dtype=a2.dtype, device=a2.device)
    db = torch.empty(shape, dtype=a2.dtype, device=a2.device)
    n = shape[-1]
    rows = da.numel() // n if n else 0
    if rows == 0:
        return da, db
    _launch_backward(da, db, dc, a2, b2, rows, n, a2.get_device(), a2.dtype, act)
    return da, db


class GatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, act, in_place=False):
        c, a2, b2, plan = _forward(a, b, act)
        ctx.save_for_backward(a2, b2)
        ctx.plan, ctx.in_place = plan, in_place
        return c

    @staticmethod
    def backward(ctx, dc):
        a2, b2 = ctx.saved_tensors
        rows, n, device, dtype, act, grid, config = ctx.plan
        if ctx.in_place and _may_overwrite(a2, b2, dtype):
            da, db = a2, b2  # each element of a, b is read before its gradient is written
        else:
            # dc has c's shape, device and dtype (autograd checks the gradients it passes),
            # so the gradients are allocated like it: a's shape, contiguous
            if dc.dtype is dtype and dc.is_contiguous():
                da, db = _empty_like(dc), _empty_like(dc)  # (the arguments cost host time)
            else:
                da = _empty_like(dc, dtype=dtype, memory_format=_CONTIGUOUS)
                db = _empty_like(dc, dtype=dtype, memory_format=_CONTIGUOUS)
        if rows:
            _launch_backward(da, db, dc, a2, b2, rows, n, device, dtype, act, grid, config)
        return da, db, None, None


def _may_overwrite(a2, b2, dtype) -> bool:
    """Whether the backward may write da over a and db over b (in_place calls): both dense,
    of the data dtype, not leaves (a caller's tensors, whose .grad would alias them), not
    overlapping, and the graph not kept for another backward."""
    if not (a2.is_contiguous() and b2.is_contiguous() and a2.dtype is dtype
            and b2.dtype is dtype and not a2.is_leaf and not b2.is_leaf):
        return False
    size = a2.numel() * a2.element_size()
    pa, pb = a2.data_ptr(), b2.data_ptr()
    if pa < pb + size and pb < pa + size:
        return False
    return not graph_retained()


class SwiGLUFunction(torch.autograd.Function):
    """silu(a) * b as an autograd Function of (a, b)."""

    @staticmethod
    def forward(ctx, a, b):
        return GatedFunction.forward(ctx, a, b, ACT_SILU)

    @staticmethod
    def backward(ctx, dc):
        return GatedFunction.backward(ctx, dc)[:2]


# torch.compile path: custom ops with register_fake and register_autograd (no graph break).
@lazy_custom_op("liger_aot::glu_fwd")
def glu_fwd_op(a: torch.Tensor, b: torch.Tensor, act: int) -> torch.Tensor:
    return glu_forward(a, b, act)[0]


@glu_fwd_op.register_fake
def _(a, b, act):
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@lazy_custom_op("liger_aot::glu_bwd")
def glu_bwd_op(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               act: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = a.shape[-1]
    return glu_backward(dc, _rows("a", a, n)[0], _rows("b", b, n)[0], a.shape, act)


@glu_bwd_op.register_fake
def _(dc, a, b, act):
    return (torch.empty(a.shape, dtype=a.dtype, device=a.device),
            torch.empty(a.shape, dtype=a.dtype, device=a.device))


def _setup_context(ctx, inputs, output):
    a, b, act = inputs
    ctx.save_for_backward(a, b)
    ctx.act = act


def _backward(ctx, dc):
    a, b = ctx.saved_tensors
    da, db = glu_bwd_op(dc, a, b, ctx.act)
    return da, db, None


glu_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def check_gated(a, b):
    if (type(a) is torch.Tensor and type(b) is torch.Tensor and a.dtype is b.dtype
            and a.dtype in SUPPORTED_DTYPES and a.shape == b.shape and a.device == b.device
            and a.dim() > 0):
        return  # the common case in one test; the checks below name what is wrong
    check_float("a", a)
    check_float("b", b)
    check_same_device(a=a, b=b)
    check_same_dtype(a=a, b=b)
    check_same_shape(a=a, b=b)
    if a.dim() == 0:
        raise ValueError("a and b must have at least one dimension, got 0-d tensors")


def _direct_apply(cls):
    """(apply, functorch_active, unwrap_if_dead): cls.apply without
    torch.autograd.Function.apply's Python wrapper, i.e. the C++ apply it ends in, bound to
    cls (about 1.5 us less per call), and the two checks that wrapper makes first. None where
    this torch lacks the pieces: then cls.apply is called."""
    try:
        apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, cls)
        return apply, torch._C._are_functorch_transforms_active, torch._C._functorch.unwrap_if_dead
    except (AttributeError, KeyError, TypeError):
        return None


_gated_apply = _direct_apply(GatedFunction)
_is_compiling = torch.compiler.is_compiling


def gated(a, b, act, in_place=False):
    """act(a) * b on the eager or the torch.compile path (inputs already checked)."""
    if _is_compiling():
        return glu_fwd_op(a, b, act)
    if _gated_apply is not None:
        apply, functorch_active, unwrap_if_dead = _gated_apply
        if not functorch_active():
            # what Function.apply does here (GatedFunction has no setup_context)
            return apply(unwrap_if_dead(a), unwrap_if_dead(b), act, in_place)
    return GatedFunction.apply(a, b, act, in_place)


def checked_gated(a, b, act, in_place=False):
    """check_gated(a, b), then gated(a, b, act). The eager call with good inputs on a GPU
    takes one test (Tensor.is_same_size instead of comparing two torch.Size objects, device
    indices instead of device objects: torch.compile would break the graph on the former, so
    the compiled path keeps check_gated); anything else, CPU tensors included, goes through
    check_gated, whose errors name what is wrong."""
    if not _is_compiling() and _gated_apply is not None:
        apply, functorch_active, unwrap_if_dead = _gated_apply
        if (type(a) is torch.Tensor and type(b) is torch.Tensor and (dtype := a.dtype) is b.dtype
                and dtype in SUPPORTED_DTYPES and a.is_same_size(b)
                and (device := a.get_device()) >= 0 and device == b.get_device()
                and a.dim() > 0 and not functorch_active()):
            return apply(unwrap_if_dead(a), unwrap_if_dead(b), act, in_place)
    check_gated(a, b)
    return gated(a, b, act, in_place)


def swiglu(a: torch.Tensor, b: torch.Tensor, *, in_place: bool = False) -> torch.Tensor:
    """silu(a) * b elementwise; a and b have one shape, dtype and device. in_place: the
    backward writes the gradients over a and b (saves two buffers of a's size at the step's
    peak), for callers that own them, e.g. an MLP's fresh projections; never when the graph
    is kept for another backward. The torch.compile path ignores it."""
    return checked_gated(a, b, ACT_SILU, in_place)
