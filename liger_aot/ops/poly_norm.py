"""PolyNorm (Liger-Kernel, from PolyCom): y = w0*norm(x^3) + w1*norm(x^2) + w2*norm(x) + b over
the last dimension, norm(u) = u / sqrt(mean(u^2) + eps); forward and backward on AOT kernels."""
from __future__ import annotations

import math

import torch

from liger_aot.kernel_src.poly_norm import spec
from liger_aot.runtime import Kernel

from ._common import check_float, check_same_device, persistent_grid, row_stride, rows_view
from ._custom_ops import lazy_custom_op

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)


def poly_norm_forward(x, weight, bias, eps):
    """x: (..., n), weight (3,), bias (1 element). Returns (y with x's shape, x as rows,
    rstd (rows, 3) fp32)."""
    n = x.shape[-1]
    x2 = rows_view("x", x, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    rstd = torch.empty((rows, 3), dtype=torch.float32, device=x.device)
    if rows and n:
        config = _fwd.select_config(x2.get_device(), n)
        block_m = config.constexprs["BLOCK_M"]
        _fwd.launch(((rows + block_m - 1) // block_m,), y, x2, weight, bias, rstd, rows, n,
                    row_stride(y), row_stride(x2), float(eps), dtype=x.dtype, config=config)
    return y.view(x.shape), x2, rstd


def poly_norm_backward(dy, x2, weight, rstd, in_place=False):
    """Returns (dx as rows, dw (3,) fp32, db () fp32). With in_place, dx is written into dy's
    buffer when dy is a dense tensor of x's dtype."""
    rows, n = x2.shape
    dy2 = rows_view("grad_output", dy, n)
    if dy2.dtype != x2.dtype:
        dy2 = dy2.to(x2.dtype)
    if in_place and dy2.is_contiguous():
        dx = dy2
    else:
        dx = torch.empty((rows, n), dtype=x2.dtype, device=x2.device)
    device = x2.get_device()
    programs, rows_per_program = persistent_grid(rows, device)
    partial = torch.empty((programs, 4), dtype=torch.float32, device=x2.device)
    if rows and n:
        _bwd.launch((programs,), dx, partial, dy2, x2, weight, rstd, rows, n,
                    row_stride(dx), row_stride(dy2), row_stride(x2), rows_per_program,
                    dtype=x2.dtype, config=_bwd.select_config(device, n))
    elif programs:
        partial.zero_()  # rows without columns: every sum is empty
    return dx, partial[:, :3].sum(0), partial[:, 3].sum()  # separate tensors: no aliasing


class PolyNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, in_place=False):
        y, x2, rstd = poly_norm_forward(x, weight, bias.reshape(()), eps)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape, ctx.in_place = x.shape, in_place
        ctx.w_dtype, ctx.b_shape, ctx.b_dtype = weight.dtype, bias.shape, bias.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw, db = poly_norm_backward(dy, x2, weight, rstd, ctx.in_place)
        return (dx.view(ctx.x_shape), dw.to(ctx.w_dtype), db.reshape(ctx.b_shape).to(ctx.b_dtype),
                None, None)


# torch.compile path: custom ops traced as single nodes (see ops/rms_norm.py); never in place.
@lazy_custom_op("liger_aot::poly_norm_fwd")
def poly_norm_fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    y, _, rstd = poly_norm_forward(x, weight, bias, eps)
    return y, rstd


@poly_norm_fwd_op.register_fake
def _(x, weight, bias, eps):
    return torch.empty_like(x), x.new_empty((math.prod(x.shape[:-1]), 3), dtype=torch.float32)


@lazy_custom_op("liger_aot::poly_norm_bwd")
def poly_norm_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor, rstd: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dw, db = poly_norm_backward(dy, rows_view("x", x, x.shape[-1]), weight, rstd)
    return dx.view(x.shape), dw.to(weight.dtype), db.reshape(bias.shape).to(bias.dtype)


@poly_norm_bwd_op.register_fake
def _(dy, x, weight, bias, rstd):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)


def _setup_context(ctx, inputs, output):
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight, bias, output[1])


def _backward_op(ctx, dy, _drstd):
    x, weight, bias, rstd = ctx.saved_tensors
    dx, dw, db = poly_norm_bwd_op(dy, x, weight, bias, rstd)
    return dx, dw, db, None


poly_norm_fwd_op.register_autograd(_backward_op, setup_context=_setup_context)


def poly_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6,
              in_place: bool = False) -> torch.Tensor:
    """PolyNorm over the last dimension of x: weight (3,) = (w0, w1, w2), bias one element
    (0-d or (1,)). in_place (Liger-Kernel's option): the eager backward writes dx into the
    buffer of y's gradient. Off by default here (Liger-Kernel's functional and the module
    LigerPolyNorm default to True); see rms_norm for when it is unsafe."""
    check_float("x", x)
    check_float("weight", weight)
    check_float("bias", bias)
    check_same_device(x=x, weight=weight, bias=bias)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension, got a 0-d tensor")
    if weight.shape != (3,):
        raise ValueError(f"weight must have shape (3,), got {tuple(weight.shape)}")
    if bias.numel() != 1:
        raise ValueError(f"bias must have one element, got shape {tuple(bias.shape)}")
    # kernels read the parameters in x's dtype; autograd casts their gradients back
    if weight.dtype != x.dtype or not weight.is_contiguous():
        weight = weight.to(x.dtype).contiguous()
    if bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    if torch.compiler.is_compiling():
        return poly_norm_fwd_op(x, weight, bias, float(eps))[0]
    return PolyNormFunction.apply(x, weight, bias, eps, bool(in_place))
