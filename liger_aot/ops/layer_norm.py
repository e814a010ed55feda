"""LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * w (+ b), forward and
backward on AOT kernels."""
from __future__ import annotations

import math
from typing import Optional

import torch

from liger_aot.kernel_src.layer_norm import spec
from liger_aot.kernel_src.spec import grouped_grid
from liger_aot.runtime import Kernel
from liger_aot.runtime._env import grouped_norm_backward, grouped_norm_forward

from ._common import (backward_follows, block_grid, check_float, grouped_backward_applies,
                      grouped_backward_buffers, grouped_layout_applies, multiprocessor_count,
                      norm_backward_grid, param_vector, row_stride, rows_view, unused_stats,
                      weight_grad_buffers)
from ._custom_ops import lazy_custom_op

_fwd = Kernel(spec.FWD)
_fwd_grouped = Kernel(spec.FWD_GROUPED)
_grouped_fwd_devices = {}  # device index -> whether its arch runs the grouped forward
_bwd = Kernel(spec.BWD)
_bwd_grouped = Kernel(spec.BWD_GROUPED)
_grouped_devices = {}  # device index -> whether its arch runs the grouped backward


def layer_norm_forward(x, weight, bias, eps, stats=True):
    """x: (..., n). Returns (y with x's shape, x as rows, mean (rows,), rstd (rows,)) fp32
    statistics. stats False (a forward no backward follows): mean and rstd may be None, not
    written by the kernel."""
    n = x.shape[-1]
    x2 = rows_view("x", x, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    grouped = bool(rows and n) and grouped_forward_applies(x2, weight, bias)
    mean = rstd = None
    if stats or grouped:  # the grouped forward always writes them (1 row in 16K+ columns)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if grouped:
        device = x2.get_device()
        config = _fwd_grouped.select_config(device)
        split, programs = grouped_grid(rows, n, multiprocessor_count(device), config)
        words = torch.zeros(rows * split, dtype=torch.int64, device=x.device)
        _fwd_grouped.launch((programs,), y, mean, rstd, words, x2, weight,
                            weight if bias is None else bias, rows, n, row_stride(y),
                            row_stride(x2), float(eps), int(bias is not None),
                            dtype=x.dtype, config=config)
    elif rows and n:
        device = x2.get_device()
        config = _fwd.select_config(device, n, dtype=x.dtype)
        if not stats:
            mean_ptr = rstd_ptr = unused_stats(x.device)
        else:
            mean_ptr, rstd_ptr = mean, rstd
        _fwd.launch(block_grid(rows, device, config), y, x2, weight,
                    weight if bias is None else bias, mean_ptr, rstd_ptr, rows, n,
                    row_stride(y), row_stride(x2), float(eps), int(bias is not None),
                    int(stats), dtype=x.dtype, config=config)
    return y.view(x.shape), x2, mean, rstd


def grouped_forward_applies(x2, weight, bias) -> bool:
    """Whether the grouped forward (kernels.py: layer_norm_fwd_grouped, each row read once)
    takes a LayerNorm forward: rows from GROUPED_FWD_MIN_COLS but those of
    GROUPED_FWD_LOOPED_COLS (see _common.grouped_layout_applies)."""
    if weight.dtype != x2.dtype or (bias is not None and bias.dtype != x2.dtype):
        return False
    return grouped_layout_applies(spec, spec.GROUPED_FWD_MIN_COLS, _grouped_fwd_devices,
                                  grouped_norm_forward, (x2,),
                                  (weight,) if bias is None else (weight, bias),
                                  spec.GROUPED_FWD_LOOPED_COLS)


def layer_norm_backward(dy, x2, weight, mean, rstd, need_dw=True, need_db=True):
    """Returns (dx as rows, dw or None, db or None)."""
    rows, n = x2.shape
    dy2 = rows_view("grad_output", dy, n)
    if dy2.dtype != x2.dtype:
        dy2 = dy2.to(x2.dtype)
    if grouped_applies(dy2, x2, weight, mean, rstd):
        dx, dw, db = _grouped_backward(dy2, x2, weight, mean, rstd)
        return dx, dw if need_dw else None, db if need_db else None
    dx = torch.empty((rows, n), dtype=x2.dtype, device=x2.device)
    device = x2.get_device()
    config = _bwd.select_config(device, n, dtype=x2.dtype)
    grid = norm_backward_grid(rows, n, device, config, spec.SUM_BLOCK_N)
    (dw_sum, db_sum), (dw, db), sync, atomic = weight_grad_buffers(
        config, rows, n, grid, 2, x2.dtype, x2.device, dx)
    if rows and n:
        _bwd.launch((grid.programs,), dx, dw_sum, db_sum, dy2, x2, weight, mean, rstd,
                    rows, n, row_stride(dx), row_stride(dy2), row_stride(x2),
                    grid.rows_per_program, dw, db, sync, atomic, dtype=x2.dtype, config=config)
    if not atomic:
        dw = dw_sum.sum(0).to(weight.dtype) if need_dw else None
        db = db_sum.sum(0).to(weight.dtype) if need_db else None
    return dx, dw if need_dw else None, db if need_db else None


def grouped_applies(dy2, x2, weight, mean, rstd) -> bool:
    """Whether the grouped backward (kernels.py: layer_norm_bwd_grouped, each row read once)
    takes a LayerNorm backward (see _common.grouped_backward_applies)."""
    return weight.dtype == x2.dtype and grouped_backward_applies(
        spec, _grouped_devices, grouped_norm_backward, x2, dy2, (weight, mean, rstd))


def _grouped_backward(dy2, x2, weight, mean, rstd):
    rows, n = x2.shape
    dx = torch.empty_like(x2)
    config = _bwd_grouped.select_config(x2.get_device())
    split, programs = grouped_grid(rows, n, multiprocessor_count(x2.get_device()), config)
    (dw_sum, db_sum), sync, words = grouped_backward_buffers(rows, n, split, 2, x2.device)
    dw, db = torch.empty_like(weight), torch.empty_like(weight)
    _bwd_grouped.launch((programs,), dx, dw_sum, db_sum, dw, db, sync, words, dy2, x2, weight,
                        mean, rstd, rows, n, row_stride(dx), row_stride(dy2), row_stride(x2),
                        dtype=x2.dtype, config=config)
    return dx, dw, db


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, x2, mean, rstd = layer_norm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.x_shape = x.shape
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy, x2, weight, mean, rstd, ctx.needs_input_grad[1],
                                         ctx.needs_input_grad[2])
        return dx.view(ctx.x_shape), dw, db, None


# torch.compile path: custom ops traced as single nodes (see ops/rms_norm.py).
@lazy_custom_op("liger_aot::layer_norm_fwd")
def layer_norm_fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, _, mean, rstd = layer_norm_forward(x, weight, bias, eps)
    return y, mean, rstd


@layer_norm_fwd_op.register_fake
def _(x, weight, bias, eps):
    rows = math.prod(x.shape[:-1])
    return (torch.empty_like(x), x.new_empty(rows, dtype=torch.float32),
            x.new_empty(rows, dtype=torch.float32))


@lazy_custom_op("liger_aot::layer_norm_bwd")
def layer_norm_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      mean: torch.Tensor, rstd: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dw, db = layer_norm_backward(dy, rows_view("x", x, x.shape[-1]), weight, mean, rstd)
    return dx.view(x.shape), dw, db


@layer_norm_bwd_op.register_fake
def _(dy, x, weight, mean, rstd):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])
    ctx.has_bias = bias is not None


def _backward_op(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = layer_norm_bwd_op(dy, x, weight, mean, rstd)
    return dx, dw, (db if ctx.has_bias else None), None


layer_norm_fwd_op.register_autograd(_backward_op, setup_context=_setup_context)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm over the last dimension of x with weight (n,) and optional bias (n,):
    (x - mean) / sqrt(var + eps) * weight + bias, var the biased variance (as torch)."""
    check_float("x", x)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension, got a 0-d tensor")
    n = x.shape[-1]
    weight = param_vector("weight", weight, x, n)
    bias = param_vector("bias", bias, x, n, optional=True)
    if torch.compiler.is_compiling():
        return layer_norm_fwd_op(x, weight, bias, float(eps))[0]
    if not backward_follows(x, weight, bias):
        return layer_norm_forward(x, weight, bias, eps, stats=False)[0]
    return LayerNormFunction.apply(x, weight, bias, eps)
