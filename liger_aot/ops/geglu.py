"""GeGLU: c = gelu_tanh(a) * b elementwise (Hugging Face gelu_pytorch_tanh), forward and
backward on the gated-activation kernels of the swiglu family (act = GELU-tanh)."""
from __future__ import annotations

import torch

from .swiglu import ACT_GELU_TANH, checked_gated


def geglu(a: torch.Tensor, b: torch.Tensor, *, in_place: bool = False) -> torch.Tensor:
    """gelu(a, approximate="tanh") * b elementwise; a and b have one shape, dtype and device.
    in_place: as ops.swiglu.swiglu's."""
    return checked_gated(a, b, ACT_GELU_TANH, in_place)
