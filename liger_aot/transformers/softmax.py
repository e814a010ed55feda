"""Softmax and sparsemax modules with Liger-Kernel's names."""
from __future__ import annotations

import torch
import torch.nn as nn

from liger_aot.ops.softmax import softmax
from liger_aot.ops.sparsemax import sparsemax


class LigerSoftmax(nn.Module):
    """Softmax over the last dim."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x, -1)


class LigerSparsemax(nn.Module):
    """Sparsemax over `dim` (default the last)."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sparsemax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


__all__ = ["LigerSoftmax", "LigerSparsemax"]
