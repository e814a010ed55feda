"""Cross entropy with ignore_index and label smoothing on one AOT kernel.

The forward kernel writes each row's loss and, when logits need a gradient, the gradient of
the reduced loss w.r.t. the logits (so backward is one multiply by grad_output). Nothing
here synchronizes with the host: the "mean" divisor is a device tensor read by the kernel.
"""
from __future__ import annotations

import torch

from liger_aot.kernel_src.cross_entropy import spec
from liger_aot.runtime import Kernel

from ._common import check_float, check_same_device, check_tensor, last_dim_contiguous

_fwd = Kernel(spec.FWD)

REDUCTIONS = ("mean", "sum", "none")


def cross_entropy_forward(logits, target, ignore_index, reduction, label_smoothing, need_grad):
    """logits (n_rows, V), target (n_rows,) int64. Returns (loss, grad or None); grad is the
    gradient of the reduced loss w.r.t. logits, in logits' dtype."""
    n_rows, n_cols = logits.shape
    logits = last_dim_contiguous(logits)
    target = target.contiguous()
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    mean = reduction == "mean"
    n_valid = (target != ignore_index).sum() if mean else None
    grad = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device) \
        if need_grad else None
    if n_rows:
        stride_logits = logits.stride(0) if n_rows > 1 else n_cols
        _fwd.launch((n_rows,), loss_rows, grad if need_grad else logits, logits, target,
             n_valid if mean else target, n_cols, n_cols, stride_logits,
             int(ignore_index), float(label_smoothing), int(need_grad), int(mean),
             dtype=logits.dtype, config=spec.select_config(n_cols))
    if reduction == "none":
        loss = loss_rows
    elif reduction == "sum":
        loss = loss_rows.sum()
    else:
        loss = loss_rows.sum() / n_valid  # 0 / 0 = nan when every target is ignored
    return loss, grad


def cross_entropy_backward(grad, grad_output, reduction):
    """grad: the stored gradient of the reduced loss; grad_output: 0-d, or (n_rows,) for
    reduction "none". Out of place, so a retained graph can run backward again."""
    if reduction == "none":
        return grad * grad_output.to(grad.dtype)[:, None]
    return grad * grad_output.to(grad.dtype)


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction, label_smoothing, need_grad):
        # need_grad comes from the caller: inside forward grad mode is always off, and
        # ctx.needs_input_grad stays True under torch.no_grad()
        loss, grad = cross_entropy_forward(logits, target, ignore_index, reduction,
                                           label_smoothing, need_grad)
        ctx.reduction = reduction
        if grad is not None:
            ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return (cross_entropy_backward(grad, grad_output, ctx.reduction),
                None, None, None, None, None)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """Like torch.nn.functional.cross_entropy for logits (n_rows, V) and int64 class indices
    target (n_rows,), returning float32 (what PyTorch gives on float32-upcast logits).
    reduction "mean" divides by the number of targets != ignore_index (nan if there are
    none). Targets outside [0, V) other than ignore_index are not checked (checking would
    synchronize with the device) and give meaningless values."""
    check_float("logits", logits)
    check_tensor("target", target)
    check_same_device(logits=logits, target=target)
    if target.dtype != torch.int64:
        raise TypeError(f"target must be int64 (torch.long) class indices, got {target.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D (n_rows, vocab), got shape {tuple(logits.shape)}")
    if target.dim() != 1 or target.shape[0] != logits.shape[0]:
        raise ValueError(f"target must have shape ({logits.shape[0]},) to match logits "
                         f"{tuple(logits.shape)}, got {tuple(target.shape)}")
    if logits.shape[1] == 0 and logits.shape[0] > 0:
        raise ValueError("logits must have at least one class (vocab size is 0)")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    label_smoothing = float(label_smoothing)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    need_grad = logits.requires_grad and torch.is_grad_enabled()
    return CrossEntropyFunction.apply(logits, target, int(ignore_index), reduction,
                                      label_smoothing, need_grad)
