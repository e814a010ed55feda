"""Cross-entropy loss modules under Liger-Kernel's names, signatures and defaults."""
from __future__ import annotations

from typing import Optional

import torch

from liger_aot.ops.cross_entropy import CrossEntropyOutput, check_options, cross_entropy
from liger_aot.ops.fused_linear_cross_entropy import ACCUM_DTYPES, fused_linear_cross_entropy


class _CrossEntropyOptions(torch.nn.Module):
    """The options both losses share: checked once, kept as attributes under Liger-Kernel's
    names; the class weights as a buffer named weight_name."""

    def __init__(self, weight_name: str, weight, ignore_index, lse_square_scale,
                 label_smoothing, reduction, softcap, return_z_loss, return_token_accuracy):
        super().__init__()
        check_options(ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
                      return_z_loss, return_token_accuracy)
        if weight is not None and not isinstance(weight, torch.Tensor):
            raise TypeError(f"{weight_name} must be a torch.Tensor or None, got "
                            f"{type(weight).__name__}")
        # a buffer (like torch.nn.CrossEntropyLoss) so .to(device) moves it; not saved
        self.register_buffer(weight_name, weight, persistent=False)
        self.ignore_index = ignore_index
        self.lse_square_scale = lse_square_scale
        self.label_smoothing = label_smoothing
        self.reduction = reduction
        self.softcap = softcap
        self.return_z_loss = return_z_loss
        self.return_token_accuracy = return_token_accuracy

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, "
                f"lse_square_scale={self.lse_square_scale}, softcap={self.softcap}")


class LigerCrossEntropyLoss(_CrossEntropyOptions):
    """Cross entropy over logits (n_rows, V) and int64 targets (n_rows,).

    Arguments as Liger-Kernel's LigerCrossEntropyLoss (weight: class weights (V,);
    lse_square_scale: z-loss scale; softcap: logit soft-capping; return_z_loss: forward
    returns (loss, z_loss); return_token_accuracy: forward returns a CrossEntropyOutput).
    in_place (liger-aot only, default False): write the logits' gradient into the logits
    buffer, as Liger-Kernel always does (see liger_aot.ops.cross_entropy)."""

    def __init__(self, weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                 lse_square_scale: float = 0.0, label_smoothing: float = 0.0,
                 reduction: str = "mean", softcap: Optional[float] = None,
                 return_z_loss: bool = False, return_token_accuracy: bool = False, *,
                 in_place: bool = False):
        super().__init__("weight", weight, ignore_index, lse_square_scale, label_smoothing,
                         reduction, softcap, return_z_loss, return_token_accuracy)
        self.in_place = in_place

    def forward(self, _input: torch.Tensor, target: torch.Tensor):
        return cross_entropy(_input, target, self.ignore_index, self.reduction,
                             self.label_smoothing, weight=self.weight,
                             lse_square_scale=self.lse_square_scale, softcap=self.softcap,
                             return_z_loss=self.return_z_loss,
                             return_token_accuracy=self.return_token_accuracy,
                             in_place=self.in_place)


class LigerFusedLinearCrossEntropyLoss(_CrossEntropyOptions):
    """Cross entropy of _input @ lin_weight^T + bias without materializing the logits.

    Arguments as Liger-Kernel's LigerFusedLinearCrossEntropyLoss; forward(lin_weight, _input,
    target, bias=None) with _input (..., H), target (...), lin_weight (V, H). chunk_size: rows
    per chunk (None: automatic, see liger_aot.ops.fused_linear_cross_entropy)."""

    def __init__(self, ce_weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                 lse_square_scale: float = 0.0, label_smoothing: float = 0.0,
                 reduction: str = "mean", softcap: Optional[float] = None,
                 return_z_loss: bool = False, accum_dtype: Optional[torch.dtype] = None,
                 use_token_scaling: bool = False, return_token_accuracy: bool = False,
                 chunk_size: Optional[int] = None):
        if accum_dtype is not None and accum_dtype not in ACCUM_DTYPES:
            raise ValueError(f"accum_dtype must be None or one of {ACCUM_DTYPES}, got "
                             f"{accum_dtype!r}")
        super().__init__("ce_weight", ce_weight, ignore_index, lse_square_scale,
                         label_smoothing, reduction, softcap, return_z_loss,
                         return_token_accuracy)
        self.accum_dtype = accum_dtype
        self.use_token_scaling = use_token_scaling
        self.chunk_size = chunk_size

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None):
        return fused_linear_cross_entropy(
            _input, lin_weight, target, bias, self.ce_weight, self.ignore_index,
            self.lse_square_scale, self.label_smoothing, self.reduction, self.softcap,
            self.return_z_loss, self.accum_dtype, self.use_token_scaling,
            self.return_token_accuracy, chunk_size=self.chunk_size)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, accum_dtype={self.accum_dtype}"


__all__ = ["CrossEntropyOutput", "LigerCrossEntropyLoss", "LigerFusedLinearCrossEntropyLoss"]
