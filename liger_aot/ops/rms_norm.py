"""RMSNorm: y = x / rms(x) * (offset + w), forward and backward on AOT kernels."""
from __future__ import annotations

import torch

from liger_aot.kernel_src.rms_norm import spec
from liger_aot.runtime import Kernel

from ._common import check_float, check_same_device, multiprocessor_count, row_stride, rows_view

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)


def _casting(mode) -> int:
    if isinstance(mode, int) and mode in spec.CASTING_MODES.values():
        return mode
    try:
        return spec.CASTING_MODES[mode]
    except (KeyError, TypeError):
        raise ValueError(f"casting_mode must be one of {sorted(spec.CASTING_MODES)}, "
                         f"got {mode!r}") from None


def rms_norm_forward(x, weight, eps, offset, casting):
    """x: (..., n). Returns (y with x's shape, x as rows, rstd (rows,) fp32)."""
    n = x.shape[-1]
    x2 = rows_view("x", x, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows and n:
        config = spec.select_config(n)
        block_m = config.constexprs["BLOCK_M"]
        _fwd.launch(((rows + block_m - 1) // block_m,), y, x2, weight, rstd, rows, n,
             row_stride(y), row_stride(x2), float(eps), float(offset),
             dtype=x.dtype, config=config, options=(("CASTING", casting),))
    return y.view(x.shape), x2, rstd


def rms_norm_backward(dy, x2, weight, rstd, offset, casting):
    rows, n = x2.shape
    dy2 = rows_view("grad_output", dy, n)
    dx = torch.empty_like(x2, memory_format=torch.contiguous_format)
    programs = max(1, min(rows, 4 * multiprocessor_count(x2.get_device())))
    rows_per_program = (rows + programs - 1) // programs
    programs = (rows + rows_per_program - 1) // rows_per_program if rows else 0
    dw_partial = torch.empty((programs, n), dtype=torch.float32, device=x2.device)
    if rows and n:
        _bwd.launch((programs,), dx, dw_partial, dy2, x2, weight, rstd, rows, n,
             row_stride(dx), row_stride(dy2), row_stride(x2), float(offset), rows_per_program,
             dtype=x2.dtype, config=spec.select_bwd_config(n), options=(("CASTING", casting),))
    dw = dw_partial.sum(0).to(weight.dtype) if rows else torch.zeros_like(weight)
    return dx, dw


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting):
        y, x2, rstd = rms_norm_forward(x, weight, eps, offset, casting)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.offset, ctx.casting, ctx.x_shape = offset, casting, x.shape
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy, x2, weight, rstd, ctx.offset, ctx.casting)
        return dx.view(ctx.x_shape), dw, None, None, None


# torch.compile path: the same forward/backward as custom ops, so dynamo traces a call as
# one node (no graph break) and autograd comes from register_autograd. Eager calls use the
# autograd.Function above, which costs less host time than custom-op dispatch.
@torch.library.custom_op("liger_aot::rms_norm_fwd", mutates_args=())
def rms_norm_fwd_op(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float,
                    casting: int) -> tuple[torch.Tensor, torch.Tensor]:
    y, _, rstd = rms_norm_forward(x, weight, eps, offset, casting)
    return y, rstd


@rms_norm_fwd_op.register_fake
def _(x, weight, eps, offset, casting):
    return torch.empty_like(x), x.new_empty(x.numel() // max(x.shape[-1], 1),
                                            dtype=torch.float32)


@torch.library.custom_op("liger_aot::rms_norm_bwd", mutates_args=())
def rms_norm_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                    offset: float, casting: int) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw = rms_norm_backward(dy, rows_view("x", x, x.shape[-1]), weight, rstd, offset, casting)
    return dx.view(x.shape), dw


@rms_norm_bwd_op.register_fake
def _(dy, x, weight, rstd, offset, casting):
    return torch.empty_like(x), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, weight, _, offset, casting = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.offset, ctx.casting = offset, casting


def _backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_bwd_op(dy, x, weight, rstd, ctx.offset, ctx.casting)
    return dx, dw, None, None, None


rms_norm_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0,
             casting_mode="llama") -> torch.Tensor:
    """RMSNorm over the last dimension of x with weight (n,). casting_mode: llama | gemma |
    none (see kernel_src/rms_norm/kernels.py)."""
    check_float("x", x)
    check_float("weight", weight)
    check_same_device(x=x, weight=weight)
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape ({x.shape[-1]},) to match x's last "
                         f"dimension, got {tuple(weight.shape)}")
    if not weight.is_contiguous():
        weight = weight.contiguous()
    casting = _casting(casting_mode)
    if torch.compiler.is_compiling():
        return rms_norm_fwd_op(x, weight, float(eps), float(offset), casting)[0]
    return RMSNormFunction.apply(x, weight, eps, offset, casting)
