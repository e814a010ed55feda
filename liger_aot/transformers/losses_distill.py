"""Distillation losses as nn.Modules under Liger-Kernel's names, signatures and defaults:
LigerKLDIVLoss, LigerJSD, LigerFusedLinearJSD and LigerTVDLoss."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from liger_aot.ops.fused_linear_jsd import fused_linear_jsd
from liger_aot.ops.jsd import check_beta, jsd
from liger_aot.ops.kl_div import REDUCTIONS as _KL_REDUCTIONS
from liger_aot.ops.kl_div import kl_div
from liger_aot.ops.tvd import REDUCTIONS as _TVD_REDUCTIONS
from liger_aot.ops.tvd import tvd


class LigerKLDIVLoss(nn.KLDivLoss):
    """torch.nn.KLDivLoss (input: log-probabilities; reduction default "mean", as
    nn.KLDivLoss; "batchmean" gives the mathematical KL) with eps clamping a non-log target
    before its log. Returns float32; the target gets no gradient."""

    def __init__(self, eps: float = 1e-10, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.reduction not in _KL_REDUCTIONS:
            raise ValueError(f"reduction must be one of {_KL_REDUCTIONS}, "
                             f"got {self.reduction!r}")
        self.eps = eps

    def forward(self, y_pred: torch.Tensor, y_true: torch.Tensor) -> torch.Tensor:
        return kl_div(y_pred, y_true, reduction=self.reduction, log_target=self.log_target,
                      eps=self.eps)


class LigerJSD(nn.Module):
    """Generalized JSD: beta KL(P || M) + (1 - beta) KL(Q || M), M = beta P + (1 - beta) Q,
    with log_q the student's log-probabilities (BT, V) and log_p the teacher's. beta = 0 is
    forward KL(P || Q), beta = 1 reverse KL(Q || P). Rows whose shift_labels entry is
    ignore_index are skipped; the loss is averaged over the remaining rows."""

    def __init__(self, beta: float = 0.5, ignore_index: int = -100):
        super().__init__()
        self.beta = check_beta(beta)
        self.ignore_index = ignore_index

    def forward(self, log_q: torch.Tensor, log_p: torch.Tensor,
                shift_labels: Optional[torch.LongTensor] = None) -> torch.Tensor:
        return jsd(log_q, log_p, shift_labels, self.beta, self.ignore_index)


class LigerFusedLinearJSD(nn.Module):
    """The last linear layers of a student and a teacher fused with the generalized JSD of
    their temperature-scaled log-softmaxes, chunked over tokens so the full logits are
    never materialized. Gradients flow to student_input and student_weight."""

    def __init__(self, jsd_beta: float = 0.5, ignore_index: int = -100,
                 temperature: float = 1.0):
        super().__init__()
        if temperature == 0:
            raise ValueError("temperature cannot be 0.")
        self.jsd_beta = check_beta(jsd_beta)
        self.temperature = temperature
        self.ignore_index = ignore_index

    def forward(self, student_input: torch.Tensor, student_weight: torch.Tensor,
                teacher_input: torch.Tensor, teacher_weight: torch.Tensor,
                shift_labels: Optional[torch.LongTensor] = None) -> torch.Tensor:
        return fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                                shift_labels, self.jsd_beta, self.ignore_index,
                                self.temperature)


class LigerTVDLoss(nn.Module):
    """Total variation distance 0.5 |p - q| between probability rows p and q (BT, V), rows
    whose shift_labels entry is ignore_index excluded; reduction default "batchmean"."""

    def __init__(self, reduction: str = "batchmean", ignore_index: int = -100):
        super().__init__()
        if reduction not in _TVD_REDUCTIONS:
            raise ValueError(f"reduction must be one of {_TVD_REDUCTIONS}, got {reduction!r}")
        self.reduction = reduction
        self.ignore_index = ignore_index

    def forward(self, p: torch.Tensor, q: torch.Tensor,
                shift_labels: Optional[torch.LongTensor] = None) -> torch.Tensor:
        return tvd(p, q, shift_labels, self.reduction, self.ignore_index)


__all__ = ["LigerFusedLinearJSD", "LigerJSD", "LigerKLDIVLoss", "LigerTVDLoss"]
