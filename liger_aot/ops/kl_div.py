"""KL divergence loss (input in log-space), like torch.nn.functional.kl_div, on AOT kernels.

loss_i = target_i * (log(max(target_i, eps)) - input_i), or with log_target
exp(target_i) * (target_i - input_i); reductions "batchmean" (sum / input.shape[0]), "sum",
"mean" (sum / numel) and "none". The loss is float32 (as in Liger-Kernel). Only the input
gets a gradient: the target is treated as a constant (the teacher distribution), as in
Liger-Kernel. Nothing here synchronizes with the host.
"""
from __future__ import annotations

import torch

from liger_aot.kernel_src.kl_div import spec
from liger_aot.runtime import Kernel

from ._common import (check_float, check_same_device, check_same_dtype, check_same_shape,
                      row_stride, rows_view)
from ._custom_ops import lazy_custom_op

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)

REDUCTIONS = ("none", "sum", "mean", "batchmean")


def _scale(shape, reduction) -> float:
    """Factor between the summed loss and the reduced loss (1 for "sum" and "none")."""
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        return 1.0
    if reduction == "batchmean":
        return 1.0 / shape[0]
    if reduction == "mean":
        return 1.0 / numel
    return 1.0


def kl_div_forward(x, target, reduction, log_target, eps):
    """x, target: same shape (at least 1-D). Returns the reduced float32 loss."""
    shape = x.shape
    n = shape[-1]
    numel = x.numel()
    if reduction == "none":
        out = torch.empty(shape, dtype=torch.float32, device=x.device)
        if numel == 0:
            return out
        x2, t2 = rows_view("input", x, n), rows_view("target", target, n)
        out2 = out.view(-1, n)
        rows = x2.shape[0]
        config = _fwd.select_config(x2.get_device(), n)
        _fwd.launch(spec.grid(rows, n, config), out2, x2, t2, rows, n, row_stride(out2),
                    row_stride(x2), row_stride(t2), float(eps), int(log_target), 1,
                    dtype=x.dtype, config=config)
        return out
    if numel == 0:
        total = torch.zeros((), dtype=torch.float32, device=x.device)
    else:
        x2, t2 = rows_view("input", x, n), rows_view("target", target, n)
        rows = x2.shape[0]
        config = _fwd.select_config(x2.get_device(), n)
        grid = spec.grid(rows, n, config)
        partial = torch.empty(grid[0] * grid[1], dtype=torch.float32, device=x.device)
        _fwd.launch(grid, partial, x2, t2, rows, n, n, row_stride(x2), row_stride(t2),
                    float(eps), int(log_target), 0, dtype=x.dtype, config=config)
        total = partial.sum()
    if reduction == "batchmean":
        return total / shape[0]  # PyTorch: divided by input.size(0)
    if reduction == "mean":
        return total / numel  # 0 / 0 = nan for an empty input, as in PyTorch
    return total


def kl_div_backward(grad_output, target, reduction, log_target):
    """Gradient w.r.t. the input (target's shape and dtype)."""
    shape = target.shape
    dx = torch.empty(shape, dtype=target.dtype, device=target.device)
    if target.numel() == 0:
        return dx
    n = shape[-1]
    t2 = rows_view("target", target, n)
    rows = t2.shape[0]
    dx2 = dx.view(-1, n)
    go = grad_output.to(torch.float32)
    if reduction == "none":
        # an expanded grad_output (from loss.sum()) keeps row stride 0: read in place
        go2 = rows_view("grad_output", go.expand(shape), n)
        go_stride, per_element = row_stride(go2), 1
    else:
        go2, go_stride, per_element = go.reshape(()), n, 0
    config = _bwd.select_config(t2.get_device(), n)
    _bwd.launch(spec.grid(rows, n, config), dx2, t2, go2, rows, n, row_stride(dx2),
                row_stride(t2), go_stride, _scale(shape, reduction), int(log_target),
                per_element, dtype=target.dtype, config=config)
    return dx


class KLDivFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, target, reduction, log_target, eps):
        ctx.save_for_backward(target)
        ctx.reduction, ctx.log_target = reduction, log_target
        return kl_div_forward(x, target, reduction, log_target, eps)

    @staticmethod
    def backward(ctx, grad_output):
        (target,) = ctx.saved_tensors
        dx = kl_div_backward(grad_output, target, ctx.reduction, ctx.log_target)
        return dx, None, None, None, None


# torch.compile path: the same helpers as custom ops (one graph node each, no graph break).
@lazy_custom_op("liger_aot::kl_div_fwd")
def kl_div_fwd_op(x: torch.Tensor, target: torch.Tensor, reduction: str, log_target: bool,
                  eps: float) -> torch.Tensor:
    return kl_div_forward(x, target, reduction, log_target, eps)


@kl_div_fwd_op.register_fake
def _(x, target, reduction, log_target, eps):
    if reduction == "none":
        return x.new_empty(x.shape, dtype=torch.float32)
    return x.new_empty((), dtype=torch.float32)


@lazy_custom_op("liger_aot::kl_div_bwd")
def kl_div_bwd_op(grad_output: torch.Tensor, target: torch.Tensor, reduction: str,
                  log_target: bool) -> torch.Tensor:
    return kl_div_backward(grad_output, target, reduction, log_target)


@kl_div_bwd_op.register_fake
def _(grad_output, target, reduction, log_target):
    return torch.empty_like(target, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    _, target, reduction, log_target, _ = inputs
    ctx.save_for_backward(target)
    ctx.reduction, ctx.log_target = reduction, log_target


def _backward(ctx, grad_output):
    (target,) = ctx.saved_tensors
    dx = kl_div_bwd_op(grad_output, target, ctx.reduction, ctx.log_target)
    return dx, None, None, None, None


kl_div_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def check_reduction(reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def kl_div(input: torch.Tensor, target: torch.Tensor, size_average: bool = True,
           reduce: bool = True, reduction: str = "mean", log_target: bool = False,
           eps: float = 1e-10) -> torch.Tensor:
    """KL(target || exp(input)) like torch.nn.functional.kl_div; input holds log-probabilities,
    target probabilities (log-probabilities when log_target). Signature and defaults of
    Liger-Kernel's liger_kl_div: size_average and reduce are accepted and ignored
    (placeholders, as in Liger-Kernel). "batchmean" divides the sum by input.shape[0],
    "mean" by input.numel(). Returns float32; the target gets no gradient."""
    check_float("input", input)
    check_float("target", target)
    check_same_device(input=input, target=target)
    check_same_dtype(input=input, target=target)
    check_same_shape(input=input, target=target)
    if input.dim() == 0:
        raise ValueError("input and target must have at least one dimension, got 0-d tensors")
    check_reduction(reduction)
    eps = float(eps)
    log_target = bool(log_target)
    if torch.compiler.is_compiling():
        return kl_div_fwd_op(input, target, reduction, log_target, eps)
    return KLDivFunction.apply(input, target, reduction, log_target, eps)


liger_kl_div = kl_div
