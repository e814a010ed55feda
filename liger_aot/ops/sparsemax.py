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
from ._rowop import RowOp, normalize_dim, over_dim

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)


def sparsemax_forward(x2):
    """x2: (rows, n) with a contiguous last dim. Returns y (rows, n), contiguous."""
    rows, n = x2.shape
    y = torch.empty((rows, n), dtype=x2.dtype, device=x2.device)
    if rows and n:
        config = _fwd.select_config(x2.get_device(), n)
        _fwd.launch(spec.grid(rows, config), y, x2, rows, n, row_stride(y), row_stride(x2),
                    spec.BISECT[config.constexprs["LOOP"]], dtype=x2.dtype, config=config)
    return y


def sparsemax_backward(dy, y2):
    rows, n = y2.shape
    dx = torch.empty((rows, n), dtype=y2.dtype, device=y2.device)
    if rows and n:
        dy2 = rows_view("grad_output", dy.to(y2.dtype), n)
        config = _bwd.select_config(y2.get_device(), n)
        _bwd.launch(spec.grid(rows, config), dx, dy2, y2, rows, n, row_stride(dx),
                    row_stride(dy2), row_stride(y2), dtype=y2.dtype, config=config)
    return dx


_op = RowOp("sparsemax", sparsemax_forward, sparsemax_backward)
SparsemaxFunction = _op.Function
sparsemax_fwd_op = _op.fwd_op
sparsemax_bwd_op = _op.bwd_op


def sparsemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax of x over `dim` (Euclidean projection onto the probability simplex), for
    float32, bfloat16 or float16 x; the result has x's dtype and sums to 1 over `dim`."""
    check_float("x", x)
    normalize_dim(x, dim)
    return over_dim(_op.last, x, dim)
