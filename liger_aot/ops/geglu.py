"""GeGLU: c = gelu_tanh(a) * b elementwise (Hugging Face gelu_pytorch_tanh), forward and
backward on the gated-activation kernels of the swiglu family (act = GELU-tanh)."""
from __future__ import annotations

import torch

from .swiglu import ACT_GELU_TANH, check_gated, gated


def geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """gelu(a, approximate="tanh") * b elementwise; a and b have one shape, dtype and device."""
    check_gated(a, b)
    return gated(a, b, ACT_GELU_TANH)
