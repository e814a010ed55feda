"""SwiGLU: c = silu(a) * b elementwise, forward and backward on AOT kernels.

The kernels serve every gated activation c = act(a) * b (ops/geglu.py uses act=GELU-tanh).
Eager calls go through GatedFunction; under torch.compile the same helpers run as the custom
ops liger_aot::glu_fwd / liger_aot::glu_bwd.
"""
from __future__ import annotations

import torch

from liger_aot.kernel_src.swiglu import spec
from liger_aot.runtime import Kernel

from ._common import (check_float, check_same_device, check_same_dtype, check_same_shape,
                      row_stride, rows_view)

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)

ACT_SILU = spec.ACT_SILU
ACT_GELU_TANH = spec.ACT_GELU_TANH


def glu_forward(a, b, act=ACT_SILU):
    """a, b: (..., n), same shape. Returns (c with a's shape, a as rows, b as rows)."""
    n = a.shape[-1]
    if a.numel() == 0:
        return torch.empty(a.shape, dtype=a.dtype, device=a.device), a, b
    a2 = rows_view("a", a, n)
    b2 = rows_view("b", b, n)
    rows = a2.shape[0]
    c = torch.empty((rows, n), dtype=a.dtype, device=a.device)
    config = spec.select_config(n)
    _fwd.launch(spec.grid(rows, n, config), c, a2, b2, rows, n,
                row_stride(c), row_stride(a2), row_stride(b2), act,
                dtype=a.dtype, config=config)
    return c.view(a.shape), a2, b2


def glu_backward(dc, a2, b2, act=ACT_SILU):
    """dc: gradient of c (any strides). Returns (da, db) as (rows, n) tensors."""
    rows, n = a2.shape
    da = torch.empty((rows, n), dtype=a2.dtype, device=a2.device)
    db = torch.empty((rows, n), dtype=a2.dtype, device=a2.device)
    if rows == 0 or n == 0:
        return da, db
    dc2 = rows_view("grad_output", dc, n)
    if dc2.dtype != a2.dtype:
        dc2 = dc2.to(a2.dtype)
    config = spec.select_config(n)
    _bwd.launch(spec.grid(rows, n, config), da, db, dc2, a2, b2, rows, n,
                row_stride(da), row_stride(db), row_stride(dc2), row_stride(a2), row_stride(b2),
                act, dtype=a2.dtype, config=config)
    return da, db


# Names kept from the first version of this module.
def swiglu_forward(a, b):
    return glu_forward(a, b, ACT_SILU)


def swiglu_backward(dc, a2, b2):
    return glu_backward(dc, a2, b2, ACT_SILU)


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
        if dc.numel() == 0:
            return torch.zeros(ctx.shape, dtype=dc.dtype, device=dc.device), \
                torch.zeros(ctx.shape, dtype=dc.dtype, device=dc.device), None
        da, db = glu_backward(dc, a2, b2, ctx.act)
        return da.view(ctx.shape), db.view(ctx.shape), None


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
    if a.numel() == 0:
        return torch.zeros(a.shape, dtype=a.dtype, device=a.device), \
            torch.zeros(a.shape, dtype=a.dtype, device=a.device)
    da, db = glu_backward(dc, rows_view("a", a, n), rows_view("b", b, n), act)
    return da.view(a.shape), db.view(a.shape)


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
