"""SwiGLU: c = silu(a) * b elementwise, forward and backward on AOT kernels."""
from __future__ import annotations

import torch

from liger_aot.kernel_src.swiglu import spec
from liger_aot.runtime import Kernel

from ._common import (check_float, check_same_device, check_same_dtype, check_same_shape,
                      row_stride, rows_view)

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)


def swiglu_forward(a, b):
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
         row_stride(c), row_stride(a2), row_stride(b2), dtype=a.dtype, config=config)
    return c.view(a.shape), a2, b2


def swiglu_backward(dc, a2, b2):
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
         dtype=a2.dtype, config=config)
    return da, db


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        c, a2, b2 = swiglu_forward(a, b)
        ctx.save_for_backward(a2, b2)
        ctx.shape = a.shape
        return c

    @staticmethod
    def backward(ctx, dc):
        a2, b2 = ctx.saved_tensors
        if dc.numel() == 0:
            return torch.zeros(ctx.shape, dtype=dc.dtype, device=dc.device), \
                torch.zeros(ctx.shape, dtype=dc.dtype, device=dc.device)
        da, db = swiglu_backward(dc, a2, b2)
        return da.view(ctx.shape), db.view(ctx.shape)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b elementwise; a and b have one shape, dtype and device."""
    check_float("a", a)
    check_float("b", b)
    check_same_device(a=a, b=b)
    check_same_dtype(a=a, b=b)
    check_same_shape(a=a, b=b)
    if a.dim() == 0:
        raise ValueError("a and b must have at least one dimension, got 0-d tensors")
    return SwiGLUFunction.apply(a, b)
