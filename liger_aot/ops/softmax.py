"""Softmax over one dimension (the last by default), forward and backward on AOT kernels.

Rows up to 16384 columns are held in registers; longer rows (vocabularies up to 262144 and
beyond) loop over 4096-column blocks, split over several programs when there are too few rows
to fill the GPU (see kernel_src/softmax/kernels.py). Eager calls go through SoftmaxFunction;
under torch.compile the same helpers run as the custom ops liger_aot::softmax_fwd / _bwd.
"""
from __future__ import annotations

import torch

from liger_aot.kernel_src.softmax import spec
from liger_aot.runtime import Kernel

from ._common import check_float, multiprocessor_count, row_stride, rows_view
from ._rowop import RowOp, normalize_dim, over_dim

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)


def _plan(kernel, rows, n, device: int, dtype: torch.dtype):
    """(config, grid, chunk_cols, n_chunks, phases) for rows x n of dtype."""
    config = kernel.select_config(device, n, dtype=dtype)
    return (config, *spec.plan(config, rows, n, 4 * multiprocessor_count(device)))


def softmax_forward(x2):
    """x2: (rows, n) with a contiguous last dim. Returns y (rows, n), contiguous."""
    rows, n = x2.shape
    y = torch.empty((rows, n), dtype=x2.dtype, device=x2.device)
    if rows == 0 or n == 0:
        return y
    config, grid, chunk_cols, n_chunks, phases = _plan(_fwd, rows, n, x2.get_device(), x2.dtype)
    stats = y  # placeholder pointer: only read or written by the split phases
    if len(phases) > 1:
        stats = torch.empty((rows, n_chunks, 2), dtype=torch.float32, device=x2.device)
    for phase in phases:
        _fwd.launch(grid, y, x2, stats, rows, n, row_stride(y), row_stride(x2), chunk_cols,
                    n_chunks, phase, dtype=x2.dtype, config=config)
    return y


def softmax_backward(dy, y2):
    """dy: gradient of y (any strides, y's shape as rows). Returns dx (rows, n)."""
    rows, n = y2.shape
    dx = torch.empty((rows, n), dtype=y2.dtype, device=y2.device)
    if rows == 0 or n == 0:
        return dx
    dy2 = rows_view("grad_output", dy.to(y2.dtype), n)
    config, grid, chunk_cols, n_chunks, phases = _plan(_bwd, rows, n, y2.get_device(), y2.dtype)
    stats = dx
    if len(phases) > 1:
        stats = torch.empty((rows, n_chunks), dtype=torch.float32, device=y2.device)
    for phase in phases:
        _bwd.launch(grid, dx, dy2, y2, stats, rows, n, row_stride(dx), row_stride(dy2),
                    row_stride(y2), chunk_cols, n_chunks, phase, dtype=y2.dtype, config=config)
    return dx


_op = RowOp("softmax", softmax_forward, softmax_backward)
SoftmaxFunction = _op.Function
softmax_fwd_op = _op.fwd_op
softmax_bwd_op = _op.bwd_op


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """torch.softmax(x, dim) for float32, bfloat16 or float16 x (result in x's dtype)."""
    check_float("x", x)
    normalize_dim(x, dim)
    return over_dim(_op.last, x, dim)
