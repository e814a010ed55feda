"""Total variation distance loss (Liger-Kernel's LigerTVDLoss) on AOT kernels.

loss = 0.5 |p - q| elementwise for probabilities p (the input) and q (the target), rows whose
shift_labels entry is ignore_index excluded. Reductions as in Liger-Kernel: "batchmean" sums
and divides by the number of non-ignored rows, "mean" by that times the vocab size, "sum"
sums, "none" keeps the (rows, vocab) matrix (ignored rows 0). A divisor of 0 (every row
ignored, or no rows) gives nan, like PyTorch's mean of nothing; the gradient is 0 there.
The loss is float32; only p gets a gradient, 0.5 sign(p - q) (0 where p == q, as PyTorch's
abs). The backward recomputes it from p and q fused with grad_output, so no (rows, vocab)
buffer lives between the passes. Nothing here synchronizes with the host.
"""
from __future__ import annotations

from typing import Optional

import torch

from liger_aot.kernel_src.tvd import spec
from liger_aot.runtime import Kernel

from ._common import (check_float, check_same_device, check_same_dtype, check_same_shape,
                      check_tensor, row_stride, rows_view)
from ._custom_ops import lazy_custom_op, saved_inputs_autograd
from .jsd import check_labels, label_args

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)

REDUCTIONS = ("none", "sum", "mean", "batchmean")


def tvd_forward(p, q, labels, reduction, ignore_index):
    """p, q: (rows, vocab) probabilities; labels flat int64 or None."""
    n_rows, n = p.shape
    if reduction == "none":
        out = torch.empty((n_rows, n), dtype=torch.float32, device=p.device)
        if out.numel():
            p2, q2 = rows_view("p", p, n), rows_view("q", q, n)
            lab, _, has_label, _ = label_args(labels, ignore_index, p.device)
            config = _fwd.select_config(p2.get_device(), n)
            _fwd.launch(spec.grid(n_rows, n, config), out, p2, q2, lab, n_rows, n,
                        row_stride(out), row_stride(p2), row_stride(q2), int(ignore_index),
                        has_label, 1, dtype=p.dtype, config=config)
        return out
    if p.numel():
        p2, q2 = rows_view("p", p, n), rows_view("q", q, n)
        lab, _, has_label, _ = label_args(labels, ignore_index, p.device)
        config = _fwd.select_config(p2.get_device(), n)
        grid = spec.grid(n_rows, n, config)
        partial = torch.empty(grid[0] * grid[1], dtype=torch.float32, device=p.device)
        _fwd.launch(grid, partial, p2, q2, lab, n_rows, n, n, row_stride(p2), row_stride(q2),
                    int(ignore_index), has_label, 0, dtype=p.dtype, config=config)
        total = partial.sum()
    else:
        total = torch.zeros((), dtype=torch.float32, device=p.device)
    if reduction == "sum":
        return total
    n_valid = n_rows if labels is None else (labels != ignore_index).sum()
    if reduction == "mean":
        n_valid = n_valid * n
    return total / n_valid  # 0 / 0 = nan when there is nothing to average


def tvd_backward(grad_output, p, q, labels, reduction, ignore_index):
    """Gradient w.r.t. p (p's shape and dtype), times grad_output."""
    n_rows, n = p.shape
    dp = torch.empty((n_rows, n), dtype=p.dtype, device=p.device)
    if dp.numel() == 0:
        return dp
    p2, q2 = rows_view("p", p, n), rows_view("q", q, n)
    lab, n_valid, has_label, _ = label_args(labels, ignore_index, p.device)
    go = grad_output.to(torch.float32)
    if reduction == "none":
        # an expanded grad_output (from loss.sum()) keeps row stride 0: read in place
        go2 = rows_view("grad_output", go.expand(n_rows, n), n)
        go_stride, per_element = row_stride(go2), 1
    else:
        go2, go_stride, per_element = go.reshape(()), n, 0
    scale = 1.0 / n if reduction == "mean" else 1.0
    divide = int(reduction in ("mean", "batchmean"))
    config = _bwd.select_config(p2.get_device(), n)
    _bwd.launch(spec.grid(n_rows, n, config), dp, p2, q2, lab, n_valid, go2, n_rows, n,
                row_stride(dp), row_stride(p2), row_stride(q2), go_stride, int(ignore_index),
                scale, has_label, per_element, divide, dtype=p.dtype, config=config)
    return dp


# torch.compile path: the same helpers as custom ops (one graph node each, no graph break).
@lazy_custom_op("liger_aot::tvd_fwd")
def tvd_fwd_op(p: torch.Tensor, q: torch.Tensor, labels: Optional[torch.Tensor],
               reduction: str, ignore_index: int) -> torch.Tensor:
    return tvd_forward(p, q, labels, reduction, ignore_index)


@tvd_fwd_op.register_fake
def _(p, q, labels, reduction, ignore_index):
    if reduction == "none":
        return p.new_empty(p.shape, dtype=torch.float32)
    return p.new_empty((), dtype=torch.float32)


@lazy_custom_op("liger_aot::tvd_bwd")
def tvd_bwd_op(grad_output: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
               labels: Optional[torch.Tensor], reduction: str, ignore_index: int
               ) -> torch.Tensor:
    return tvd_backward(grad_output, p, q, labels, reduction, ignore_index)


@tvd_bwd_op.register_fake
def _(grad_output, p, q, labels, reduction, ignore_index):
    return torch.empty_like(p, memory_format=torch.contiguous_format)


TVDFunction, _backward, _setup_context = saved_inputs_autograd(
    "TVDFunction", tvd_forward, tvd_backward, tvd_bwd_op)
tvd_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def tvd(input: torch.Tensor, target: torch.Tensor,
        shift_labels: Optional[torch.Tensor] = None, reduction: str = "mean",
        ignore_index: int = -100) -> torch.Tensor:
    """Liger-Kernel's liger_tvd: total variation distance between the distributions input
    (p, (BT, V) probabilities) and target (q, same shape and dtype). shift_labels: optional
    int64 (BT,); rows equal to ignore_index are excluded. reduction: "batchmean", "sum",
    "mean" or "none" (default "mean" as liger_tvd; LigerTVDLoss defaults to "batchmean").
    Returns float32; only input gets a gradient."""
    check_float("input", input)
    check_float("target", target)
    if shift_labels is not None:
        check_tensor("shift_labels", shift_labels)
    check_same_device(input=input, target=target, shift_labels=shift_labels)
    check_same_dtype(input=input, target=target)
    check_same_shape(input=input, target=target)
    if input.dim() != 2:
        raise ValueError(f"input and target must be 2-D (BT, V), got shape "
                         f"{tuple(input.shape)}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    labels = check_labels(shift_labels, input.shape[0], (input.shape[0],))
    ignore_index = int(ignore_index)
    if torch.compiler.is_compiling():
        return tvd_fwd_op(input, target, labels, reduction, ignore_index)
    return TVDFunction.apply(input, target, labels, reduction, ignore_index)


liger_tvd = tvd
