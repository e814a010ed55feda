"""GroupNorm: x (batch, channels, *) normalized over groups of channels (and all spatial
positions), then a per-channel affine; forward and backward on AOT kernels."""
from __future__ import annotations

import math
from typing import Optional

import torch

from liger_aot.kernel_src.group_norm import spec
from liger_aot.runtime import Kernel

from ._common import check_float, param_vector
from ._custom_ops import lazy_custom_op

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)

_INT32_MAX = 2**31 - 1


def _layout(x, num_groups):
    """(batch, channels, hw) contiguous view of x (a copy when x is not contiguous)."""
    batch, channels = x.shape[0], x.shape[1]
    hw = math.prod(x.shape[2:])
    x3 = x.reshape(batch, channels, hw)
    if not x3.is_contiguous():
        x3 = x3.contiguous()
    return x3, batch, channels, hw


def group_norm_forward(x, weight, bias, num_groups, eps):
    """Returns (y with x's shape, x as (batch, channels, hw), mean, rstd (batch*groups,) fp32)."""
    x3, batch, channels, hw = _layout(x, num_groups)
    cpg = channels // num_groups
    rows = batch * num_groups
    y = torch.empty(x3.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows and cpg * hw:
        _fwd.launch((rows,), y, x3, weight, weight if bias is None else bias, mean, rstd,
                    num_groups, cpg, hw, cpg * hw, float(eps), int(bias is not None),
                    dtype=x.dtype, config=spec.select_config(hw))
    return y.view(x.shape), x3, mean, rstd


def group_norm_backward(dy, x3, weight, mean, rstd, num_groups):
    """Returns (dx as (batch, channels, hw), dw (channels,) fp32, db (channels,) fp32)."""
    batch, channels, hw = x3.shape
    cpg = channels // num_groups
    rows = batch * num_groups
    dy3 = dy.reshape(x3.shape)
    if dy3.dtype != x3.dtype:
        dy3 = dy3.to(x3.dtype)
    if not dy3.is_contiguous():
        dy3 = dy3.contiguous()
    dx = torch.empty(x3.shape, dtype=x3.dtype, device=x3.device)
    dw_partial = torch.empty((batch, channels), dtype=torch.float32, device=x3.device)
    db_partial = torch.empty((batch, channels), dtype=torch.float32, device=x3.device)
    if rows and cpg * hw:
        _bwd.launch((rows,), dx, dw_partial, db_partial, dy3, x3, weight, mean, rstd,
                    num_groups, cpg, hw, cpg * hw, dtype=x3.dtype,
                    config=_bwd.select_config(x3.get_device(), hw))
    elif hw == 0:
        dw_partial.zero_()  # no spatial positions: every sum is empty
        db_partial.zero_()
    return dx, dw_partial.sum(0), db_partial.sum(0)


class GroupNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, num_groups, eps):
        y, x3, mean, rstd = group_norm_forward(x, weight, bias, num_groups, eps)
        ctx.save_for_backward(x3, weight, mean, rstd)
        ctx.x_shape, ctx.num_groups, ctx.has_bias = x.shape, num_groups, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x3, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = group_norm_backward(dy, x3, weight, mean, rstd, ctx.num_groups)
        return (dx.view(ctx.x_shape), dw.to(weight.dtype),
                db.to(weight.dtype) if ctx.has_bias else None, None, None)


# torch.compile path: custom ops traced as single nodes (see ops/rms_norm.py).
@lazy_custom_op("liger_aot::group_norm_fwd")
def group_norm_fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      num_groups: int, eps: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, _, mean, rstd = group_norm_forward(x, weight, bias, num_groups, eps)
    return y, mean, rstd


@group_norm_fwd_op.register_fake
def _(x, weight, bias, num_groups, eps):
    rows = x.shape[0] * num_groups
    return (torch.empty_like(x), x.new_empty(rows, dtype=torch.float32),
            x.new_empty(rows, dtype=torch.float32))


@lazy_custom_op("liger_aot::group_norm_bwd")
def group_norm_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      mean: torch.Tensor, rstd: torch.Tensor, num_groups: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x3 = _layout(x, num_groups)[0]
    dx, dw, db = group_norm_backward(dy, x3, weight, mean, rstd, num_groups)
    return dx.view(x.shape), dw.to(weight.dtype), db.to(weight.dtype)


@group_norm_bwd_op.register_fake
def _(dy, x, weight, mean, rstd, num_groups):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, weight, bias, num_groups, _ = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])
    ctx.num_groups, ctx.has_bias = num_groups, bias is not None


def _backward_op(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = group_norm_bwd_op(dy, x, weight, mean, rstd, ctx.num_groups)
    return dx, dw, (db if ctx.has_bias else None), None, None


group_norm_fwd_op.register_autograd(_backward_op, setup_context=_setup_context)


def group_norm(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               num_channels: int, num_groups: int, eps: float = 1e-6) -> torch.Tensor:
    """GroupNorm of x (batch, num_channels, *spatial) over num_groups groups of consecutive
    channels, then weight[c] * xhat + bias[c] (bias may be None). Liger-Kernel's argument
    order: (X, affine_scaling_weight, affine_shifting_bias, num_channels, num_groups, eps)."""
    check_float("x", x)
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (batch, channels, *), got {tuple(x.shape)}")
    if x.shape[1] != num_channels:
        raise ValueError(f"x must have num_channels={num_channels} channels in dim 1, got "
                         f"shape {tuple(x.shape)}")
    if num_channels % num_groups:
        raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups "
                         f"({num_groups})")
    if math.prod(x.shape[2:]) * (num_channels // num_groups) > _INT32_MAX:
        raise ValueError(f"a group of x holds more than 2^31 - 1 elements (shape "
                         f"{tuple(x.shape)}, num_groups {num_groups})")
    weight = param_vector("weight", weight, x, num_channels, of="num_channels")
    bias = param_vector("bias", bias, x, num_channels, of="num_channels",
                        optional=True)
    if torch.compiler.is_compiling():
        return group_norm_fwd_op(x, weight, bias, num_groups, float(eps))[0]
    return GroupNormFunction.apply(x, weight, bias, num_groups, eps)
