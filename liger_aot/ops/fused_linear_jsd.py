"""Fused linear + generalized JSD (Liger-Kernel's LigerFusedLinearJSD) on an AOT row kernel.

student logits = student_input @ student_weight^T, teacher logits = teacher_input @
teacher_weight^T, both divided by the temperature and log-softmaxed; the loss is the JSD of
ops/jsd.py summed over the vocab and averaged over the rows whose shift_labels entry is not
ignore_index (all rows without labels; 0 when every row is ignored).

Tokens are processed in chunks so the (tokens, vocab) logits never exist for all tokens at
once: per chunk two matmuls give the logits, one kernel launch computes each row's loss and
overwrites the student logits with the gradient w.r.t. them, and two more matmuls turn that
into the chunk's rows of grad_input and its contribution to grad_weight. The gradients are
therefore computed in the forward; backward only scales them by grad_output. The teacher
gets no gradient. Nothing here synchronizes with the host.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from liger_aot.kernel_src.jsd import spec
from liger_aot.runtime import Kernel

from ._common import check_float, check_same_device, check_tensor, liger_chunk_rows
from ._custom_ops import lazy_custom_op
from .jsd import check_beta, check_labels, label_args

_rows = Kernel(spec.FUSED_LINEAR_ROWS)


# Tokens per chunk: Liger-Kernel's choice (see _common.liger_chunk_rows).
default_chunk_size = liger_chunk_rows


def fused_linear_jsd_forward(s_in, s_w, t_in, t_w, labels, beta, ignore_index, temperature,
                             chunk_size, need_input_grad, need_weight_grad):
    """Returns (loss fp32 0-d, grad_input or None, grad_weight or None); the gradients are
    those of the loss itself (grad_output 1), in the dtypes of student_input / _weight.

    Under autocast the matmuls run in the autocast dtype (as they would in PyTorch) and the
    row kernel reads logits of that dtype; autocast is switched off inside so every dtype
    here is explicit."""
    n_rows, hidden = s_in.shape
    vocab = s_w.shape[0]
    device = s_in.device
    amp = torch.is_autocast_enabled(device.type)
    dtype = torch.get_autocast_dtype(device.type) if amp else s_in.dtype
    t_dtype = dtype if amp else t_in.dtype
    has_grad = need_input_grad or need_weight_grad
    grad_input = torch.empty_like(s_in, memory_format=torch.contiguous_format) \
        if need_input_grad else None
    grad_weight = torch.zeros_like(s_w, memory_format=torch.contiguous_format) \
        if need_weight_grad else None
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=device)
    lab, n_valid, has_label, divisor = label_args(labels, ignore_index, device)
    if chunk_size <= 0:
        chunk_size = default_chunk_size(n_rows, hidden, vocab)
    config = spec.select_row_config(vocab)
    with torch.autocast(device.type, enabled=False):
        w = s_w.to(dtype)
        tw = t_w.to(t_dtype)
        for start in range(0, n_rows, chunk_size):
            end = min(start + chunk_size, n_rows)
            x = s_in[start:end].to(dtype)
            s_logits = x @ w.t()  # (chunk, vocab), contiguous
            t_logits = (t_in[start:end].to(t_dtype) @ tw.t()).to(dtype)
            _rows.launch((end - start,), loss_rows, s_logits, t_logits, lab, n_valid, start,
                         vocab, vocab, vocab, int(ignore_index), float(beta),
                         1.0 / temperature, 1.0 / max(n_rows, 1), has_label, int(has_grad),
                         dtype=dtype, config=config)
            # s_logits now holds d loss / d student logits
            if need_input_grad:
                if grad_input.dtype == dtype:
                    torch.mm(s_logits, w, out=grad_input[start:end])
                else:
                    grad_input[start:end] = s_logits @ w
            if need_weight_grad:
                if grad_weight.dtype == dtype:
                    grad_weight.addmm_(s_logits.t(), x)
                else:
                    grad_weight.add_(s_logits.t() @ x)
    total = loss_rows.sum() / (max(n_rows, 1) if divisor is None else divisor)
    return total, grad_input, grad_weight


def _scaled(grad, grad_output):
    if grad is None:
        return None
    return grad * grad_output.to(grad.dtype)


class FusedLinearJSDFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s_in, s_w, t_in, t_w, labels, beta, ignore_index, temperature,
                chunk_size, need_input_grad, need_weight_grad):
        loss, grad_input, grad_weight = fused_linear_jsd_forward(
            s_in, s_w, t_in, t_w, labels, beta, ignore_index, temperature, chunk_size,
            need_input_grad, need_weight_grad)
        ctx.save_for_backward(grad_input, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        grad_input, grad_weight = ctx.saved_tensors
        return (_scaled(grad_input, grad_output), _scaled(grad_weight, grad_output),
                None, None, None, None, None, None, None, None, None)


# torch.compile path: the forward (gradients included) as one custom op; the backward is a
# plain multiply that the compiler traces. Unneeded gradients come back as empty tensors.
@lazy_custom_op("liger_aot::fused_linear_jsd_fwd")
def fused_linear_jsd_fwd_op(s_in: torch.Tensor, s_w: torch.Tensor, t_in: torch.Tensor,
                            t_w: torch.Tensor, labels: Optional[torch.Tensor], beta: float,
                            ignore_index: int, temperature: float, chunk_size: int,
                            need_input_grad: bool, need_weight_grad: bool
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    loss, gi, gw = fused_linear_jsd_forward(s_in, s_w, t_in, t_w, labels, beta, ignore_index,
                                            temperature, chunk_size, need_input_grad,
                                            need_weight_grad)
    if gi is None:
        gi = s_in.new_empty(0)
    if gw is None:
        gw = s_w.new_empty(0)
    return loss, gi, gw


@fused_linear_jsd_fwd_op.register_fake
def _(s_in, s_w, t_in, t_w, labels, beta, ignore_index, temperature, chunk_size,
      need_input_grad, need_weight_grad):
    gi = torch.empty_like(s_in, memory_format=torch.contiguous_format) if need_input_grad \
        else s_in.new_empty(0)
    gw = torch.empty_like(s_w, memory_format=torch.contiguous_format) if need_weight_grad \
        else s_w.new_empty(0)
    return s_in.new_empty((), dtype=torch.float32), gi, gw


def _setup_context(ctx, inputs, output):
    ctx.need_input_grad, ctx.need_weight_grad = inputs[9], inputs[10]
    ctx.save_for_backward(output[1], output[2])


def _backward(ctx, grad_output, _gi, _gw):
    grad_input, grad_weight = ctx.saved_tensors
    gi = _scaled(grad_input, grad_output) if ctx.need_input_grad else None
    gw = _scaled(grad_weight, grad_output) if ctx.need_weight_grad else None
    return gi, gw, None, None, None, None, None, None, None, None, None


fused_linear_jsd_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def fused_linear_jsd(student_input: torch.Tensor, student_weight: torch.Tensor,
                     teacher_input: torch.Tensor, teacher_weight: torch.Tensor,
                     shift_labels: Optional[torch.Tensor] = None, jsd_beta: float = 0.5,
                     ignore_index: int = -100, temperature: float = 1.0, *,
                     chunk_size: Optional[int] = None) -> torch.Tensor:
    """Liger-Kernel's liger_fused_linear_jsd. student_input (BT, H), student_weight (V, H),
    teacher_input (BT, H'), teacher_weight (V, H'); shift_labels optional int64 (BT,).
    Returns the float32 JSD of log_softmax(student logits / temperature) and
    log_softmax(teacher logits / temperature). Gradients flow to student_input and
    student_weight only. chunk_size (keyword, not in Liger-Kernel): tokens per chunk,
    default chosen from BT, H and V. Teacher logits are cast to the student dtype (to the
    autocast dtype under autocast, where the matmuls run in that dtype)."""
    for name, t in (("student_input", student_input), ("student_weight", student_weight),
                    ("teacher_input", teacher_input), ("teacher_weight", teacher_weight)):
        check_float(name, t)
    if shift_labels is not None:
        check_tensor("shift_labels", shift_labels)
    check_same_device(student_input=student_input, student_weight=student_weight,
                      teacher_input=teacher_input, teacher_weight=teacher_weight,
                      shift_labels=shift_labels)
    if student_input.dim() != 2 or student_weight.dim() != 2:
        raise ValueError(f"student_input (BT, H) and student_weight (V, H) must be 2-D, got "
                         f"{tuple(student_input.shape)} and {tuple(student_weight.shape)}")
    if teacher_input.dim() != 2 or teacher_weight.dim() != 2:
        raise ValueError(f"teacher_input (BT, H') and teacher_weight (V, H') must be 2-D, got "
                         f"{tuple(teacher_input.shape)} and {tuple(teacher_weight.shape)}")
    if student_weight.dtype != student_input.dtype:
        raise TypeError(f"student_weight must have student_input's dtype "
                        f"{student_input.dtype}, got {student_weight.dtype}")
    if teacher_weight.dtype != teacher_input.dtype:
        raise TypeError(f"teacher_weight must have teacher_input's dtype "
                        f"{teacher_input.dtype}, got {teacher_weight.dtype}")
    n_rows, hidden = student_input.shape
    if student_weight.shape[1] != hidden:
        raise ValueError(f"student_weight must have shape (V, {hidden}) to match "
                         f"student_input, got {tuple(student_weight.shape)}")
    if teacher_input.shape[0] != n_rows:
        raise ValueError(f"teacher_input must have {n_rows} rows like student_input, got "
                         f"shape {tuple(teacher_input.shape)}")
    if teacher_weight.shape[1] != teacher_input.shape[1]:
        raise ValueError(f"teacher_weight must have shape (V, {teacher_input.shape[1]}) to "
                         f"match teacher_input, got {tuple(teacher_weight.shape)}")
    vocab = student_weight.shape[0]
    if teacher_weight.shape[0] != vocab:
        raise ValueError(f"teacher_weight must have {vocab} rows (the student's vocab size), "
                         f"got shape {tuple(teacher_weight.shape)}")
    if vocab == 0:
        raise ValueError("student_weight must have at least one row (vocab size is 0)")
    labels = check_labels(shift_labels, n_rows, (n_rows,))
    beta = check_beta(jsd_beta)
    temperature = float(temperature)
    if temperature == 0.0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be finite and nonzero, got {temperature}")
    if chunk_size is None:
        chunk_size = 0
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    grad_on = torch.is_grad_enabled()
    need_input_grad = grad_on and student_input.requires_grad
    need_weight_grad = grad_on and student_weight.requires_grad
    if torch.compiler.is_compiling():
        return fused_linear_jsd_fwd_op(student_input, student_weight, teacher_input,
                                       teacher_weight, labels, beta, int(ignore_index),
                                       temperature, chunk_size, need_input_grad,
                                       need_weight_grad)[0]
    return FusedLinearJSDFunction.apply(student_input, student_weight, teacher_input,
                                        teacher_weight, labels, beta, int(ignore_index),
                                        temperature, chunk_size, need_input_grad,
                                        need_weight_grad)


liger_fused_linear_jsd = fused_linear_jsd
