"""Sparsemax over one dimension (the last by default), forward and backward on AOT kernels.

sparsemax(x) = argmin_{p in simplex} ||p - x||^2 = max(x - tau, 0): the kernel finds tau
without sorting (kernel_src/sparsemax/kernels.py). Eager calls go through SparsemaxFunction;
under torch.compile the same helpers run as the custom ops liger_aot::sparsemax_fwd / _bwd.
"""
from __future__ import annotations

import torch

from liger_aot.kernel_src.sparsemax import spec
from liger_aot.runtime import Kernel

from ._common import check_float, row_stride, rows_view
from .softmax import normalize_dim, over_dim

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)


def sparsemax_forward(x2):
    """x2: (rows, n) with a contiguous last dim. Returns y (rows, n), contiguous."""
    rows, n = x2.shape
    y = torch.empty((rows, n), dtype=x2.dtype, device=x2.device)
    if rows and n:
        config = spec.select_config(n)
        _fwd.launch(spec.grid(rows, config), y, x2, rows, n, row_stride(y), row_stride(x2),
                    spec.BISECT[config.constexprs["LOOP"]], dtype=x2.dtype, config=config)
    return y


def sparsemax_backward(dy, y2):
    rows, n = y2.shape
    dx = torch.empty((rows, n), dtype=y2.dtype, device=y2.device)
    if rows and n:
        dy2 = rows_view("grad_output", dy.to(y2.dtype), n)
        config = spec.select_config(n)
        _bwd.launch(spec.grid(rows, config), dx, dy2, y2, rows, n, row_stride(dx),
                    row_stride(dy2), row_stride(y2), dtype=y2.dtype, config=config)
    return dx


def _last_dim_forward(x):
    """sparsemax over x's last dim (x at least 1-D); the result is contiguous, x's shape."""
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return sparsemax_forward(rows_view("x", x, x.shape[-1])).view(x.shape)


def _last_dim_backward(dy, y):
    if y.numel() == 0:
        return torch.empty(y.shape, dtype=y.dtype, device=y.device)
    return sparsemax_backward(dy, rows_view("y", y, y.shape[-1])).view(y.shape)


class SparsemaxFunction(torch.autograd.Function):
    """Sparsemax over the last dim of x (at least 1-D)."""

    @staticmethod
    def forward(ctx, x):
        y = _last_dim_forward(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _last_dim_backward(dy, y)


@torch.library.custom_op("liger_aot::sparsemax_fwd", mutates_args=())
def sparsemax_fwd_op(x: torch.Tensor) -> torch.Tensor:
    return _last_dim_forward(x)


@sparsemax_fwd_op.register_fake
def _(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("liger_aot::sparsemax_bwd", mutates_args=())
def sparsemax_bwd_op(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _last_dim_backward(dy, y)


@sparsemax_bwd_op.register_fake
def _(dy, y):
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return sparsemax_bwd_op(dy, y)


sparsemax_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def _sparsemax_last(x):
    if torch.compiler.is_compiling():
        return sparsemax_fwd_op(x)
    return SparsemaxFunction.apply(x)


def sparsemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax of x over `dim` (Euclidean projection onto the probability simplex), for
    float32, bfloat16 or float16 x; the result has x's dtype and sums to 1 over `dim`."""
    check_float("x", x)
    normalize_dim(x, dim)
    return over_dim(_sparsemax_last, x, dim)
