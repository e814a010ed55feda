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
                      check_same_shape, row_stride, rows_view)

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


def glu_forward(a, b, act=ACT_SILU):
    """a, b: (..., n), same shape. Returns (c with a's shape, a and b as the kernel read them,
    to be saved for glu_backward)."""
    n = a.shape[-1]
    c = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    rows = a.numel() // n if n else 0
    if rows == 0:
        return c, a, b
    a2, stride_a = _rows("a", a, n)
    b2, stride_b = _rows("b", b, n)
    config = _fwd.select_config(a2.get_device(), n)
    _fwd.launch(spec.grid(rows, n, config), c, a2, b2, rows, n, n, stride_a, stride_b, act,
                dtype=a.dtype, config=config)
    return c, a2, b2


def glu_backward(dc, a2, b2, shape, act=ACT_SILU):
    """dc: gradient of c (any strides); a2, b2 from glu_forward. Returns (da, db) of shape."""
    da = torch.empty(shape, dtype=a2.dtype, device=a2.device)
    db = torch.empty(shape, dtype=a2.dtype, device=a2.device)
    n = shape[-1]
    rows = da.numel() // n if n else 0
    if rows == 0:
        return da, db
    dc2, stride_dc = _rows("grad_output", dc, n)
    if dc2.dtype != a2.dtype:
        dc2 = dc2.to(a2.dtype)  # keeps the layout, so stride_dc holds
    stride_a = n if a2.is_contiguous() else row_stride(a2)
    stride_b = n if b2.is_contiguous() else row_stride(b2)
    config = _bwd.select_config(a2.get_device(), n)
    _bwd.launch(spec.grid(rows, n, config), da, db, dc2, a2, b2, rows, n,
                n, n, stride_dc, stride_a, stride_b, act, dtype=a2.dtype, config=config)
    return da, db


class GatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, act):
        c, a2, b2 = glu_forward(a, b, act)
        ctx.save_for_backward(a2, b2)
        ctx.shape, ctx.act = a.shape, act
        return c

    @staticmethod
    def backward(ctx, dc):
        a2, b2 = ctx.saved_tensors
        da, db = glu_backward(dc, a2, b2, ctx.shape, ctx.act)
        return da, db, None


class SwiGLUFunction(torch.autograd.Function):
    """silu(a) * b as an autograd Function of (a, b)."""

    @staticmethod
    def forward(ctx, a, b):
        return GatedFunction.forward(ctx, a, b, ACT_SILU)

    @staticmethod
    def backward(ctx, dc):
        return GatedFunction.backward(ctx, dc)[:2]


# torch.compile path: custom ops with register_fake and register_autograd (no graph break).
@torch.library.custom_op("liger_aot::glu_fwd", mutates_args=())
def glu_fwd_op(a: torch.Tensor, b: torch.Tensor, act: int) -> torch.Tensor:
    return glu_forward(a, b, act)[0]


@glu_fwd_op.register_fake
def _(a, b, act):
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@torch.library.custom_op("liger_aot::glu_bwd", mutates_args=())
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


def gated(a, b, act):
    """act(a) * b on the eager or the torch.compile path (inputs already checked)."""
    if torch.compiler.is_compiling():
        return glu_fwd_op(a, b, act)
    return GatedFunction.apply(a, b, act)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b elementwise; a and b have one shape, dtype and device."""
    check_gated(a, b)
    return gated(a, b, ACT_SILU)
