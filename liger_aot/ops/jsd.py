"""Generalized Jensen-Shannon divergence (Liger-Kernel's LigerJSD) on one AOT kernel.

JSD_beta(P || Q) = beta KL(P || M) + (1 - beta) KL(Q || M), M = beta P + (1 - beta) Q, with
the student's log-probabilities as input (log Q) and the teacher's as target (log P); beta = 0
is forward KL(P || Q) and beta = 1 reverse KL(Q || P), as in Liger-Kernel. The loss is summed
over the vocab and averaged over the rows whose shift_labels entry is not ignore_index (all
rows without labels); with every row ignored it is 0. Only the input gets a gradient.

The forward only reads (no gradient stored); the backward recomputes the elementwise
gradient fused with grad_output, so no (rows, vocab) buffer lives between the two passes.
The row count divisor stays on the device: nothing here synchronizes with the host.
"""
from __future__ import annotations

from typing import Optional

import torch

from liger_aot.kernel_src.jsd import spec
from liger_aot.runtime import Kernel

from ._common import (check_float, check_same_device, check_same_dtype, check_same_shape,
                      check_tensor, row_stride, rows_view)
from ._custom_ops import lazy_custom_op, saved_inputs_autograd

_jsd = Kernel(spec.JSD)


def check_labels(labels, n_rows: int, lead_shape, name: str = "shift_labels"):
    """Validates optional int64 labels with one entry per row; returns them flat or None."""
    if labels is None:
        return None
    check_tensor(name, labels)
    if labels.dtype != torch.int64:
        raise TypeError(f"{name} must be int64 (torch.long), got {labels.dtype}")
    if tuple(labels.shape) not in ((n_rows,), tuple(lead_shape)):
        raise ValueError(f"{name} must have shape ({n_rows},), one entry per row, "
                         f"got {tuple(labels.shape)}")
    return labels.reshape(-1).contiguous()


def check_beta(beta) -> float:
    beta = float(beta)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    return beta


def label_args(labels, ignore_index, device):
    """(LABELS, N_VALID) pointers and has_label for a kernel launch, plus the divisor of the
    summed loss: a device tensor (labels != ignore_index).sum() clamped to 1, or None."""
    if labels is None:
        dummy = torch.empty(1, dtype=torch.int64, device=device)
        return dummy, dummy, 0, None
    n_valid = (labels != ignore_index).sum()
    return labels, n_valid, 1, n_valid.clamp_min(1)


def _launch(x2, y2, labels, beta, ignore_index, *, loss_partial=None, dx=None, go=None):
    rows, n = x2.shape
    config = _jsd.select_config(x2.get_device(), n)
    grid = spec.grid(rows, n, config)
    lab, n_valid, has_label, divisor = label_args(labels, ignore_index, x2.device)
    _jsd.launch(grid, go if loss_partial is None else loss_partial,
                x2 if dx is None else dx, x2, y2, lab, n_valid,
                loss_partial if go is None else go, rows, n,
                n if dx is None else row_stride(dx), row_stride(x2), row_stride(y2),
                int(ignore_index), float(beta), 1.0 / max(rows, 1), has_label,
                int(loss_partial is not None), int(dx is not None),
                dtype=x2.dtype, config=config)
    return divisor


def jsd_forward(x, y, labels, beta, ignore_index):
    """x, y: (rows, vocab) log-probabilities; labels flat int64 or None. Returns the loss
    (0-d, x's dtype)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    n = x.shape[-1]
    x2, y2 = rows_view("input", x, n), rows_view("target", y, n)
    config = _jsd.select_config(x2.get_device(), n)
    grid = spec.grid(x2.shape[0], n, config)
    partial = torch.empty(grid[0] * grid[1], dtype=torch.float32, device=x.device)
    divisor = _launch(x2, y2, labels, beta, ignore_index, loss_partial=partial)
    total = partial.sum() / (x2.shape[0] if divisor is None else divisor)
    return total.to(x.dtype)


def jsd_backward(grad_output, x, y, labels, beta, ignore_index):
    """Gradient of the loss w.r.t. x, times grad_output (0-d)."""
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return dx
    n = x.shape[-1]
    x2, y2 = rows_view("input", x, n), rows_view("target", y, n)
    go = grad_output.to(torch.float32).reshape(())
    _launch(x2, y2, labels, beta, ignore_index, dx=dx.view(-1, n), go=go)
    return dx


# torch.compile path: the same helpers as custom ops (one graph node each, no graph break).
@lazy_custom_op("liger_aot::jsd_fwd")
def jsd_fwd_op(x: torch.Tensor, y: torch.Tensor, labels: Optional[torch.Tensor], beta: float,
               ignore_index: int) -> torch.Tensor:
    return jsd_forward(x, y, labels, beta, ignore_index)


@jsd_fwd_op.register_fake
def _(x, y, labels, beta, ignore_index):
    return x.new_empty(())


@lazy_custom_op("liger_aot::jsd_bwd")
def jsd_bwd_op(grad_output: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
               labels: Optional[torch.Tensor], beta: float, ignore_index: int) -> torch.Tensor:
    return jsd_backward(grad_output, x, y, labels, beta, ignore_index)


@jsd_bwd_op.register_fake
def _(grad_output, x, y, labels, beta, ignore_index):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


JSDFunction, _backward, _setup_context = saved_inputs_autograd(
    "JSDFunction", jsd_forward, jsd_backward, jsd_bwd_op)
jsd_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def jsd(input: torch.Tensor, target: torch.Tensor,
        shift_labels: Optional[torch.Tensor] = None, beta: float = 0.5,
        ignore_index: int = -100) -> torch.Tensor:
    """Generalized JSD of Liger-Kernel's liger_jsd. input: student log-probabilities
    (rows, vocab) (any leading dims are flattened into rows); target: teacher
    log-probabilities, same shape and dtype; shift_labels: optional int64, one per row, rows
    equal to ignore_index are skipped. beta in [0, 1]: 0 forward KL, 1 reverse KL. Returns a
    0-d loss in input's dtype; target gets no gradient."""
    check_float("input", input)
    check_float("target", target)
    if shift_labels is not None:
        check_tensor("shift_labels", shift_labels)
    check_same_device(input=input, target=target, shift_labels=shift_labels)
    check_same_dtype(input=input, target=target)
    check_same_shape(input=input, target=target)
    if input.dim() == 0:
        raise ValueError("input and target must have at least one dimension, got 0-d tensors")
    n_rows = torch.Size(input.shape[:-1]).numel()
    labels = check_labels(shift_labels, n_rows, input.shape[:-1])
    beta = check_beta(beta)
    ignore_index = int(ignore_index)
    if torch.compiler.is_compiling():
        return jsd_fwd_op(input, target, labels, beta, ignore_index)
    return JSDFunction.apply(input, target, labels, beta, ignore_index)


liger_jsd = jsd
