"""Normalization modules under Liger-Kernel's names, signatures and defaults."""
from __future__ import annotations

import torch
import torch.nn as nn

from liger_aot.ops.dyt import dyt
from liger_aot.ops.group_norm import group_norm
from liger_aot.ops.layer_norm import layer_norm
from liger_aot.ops.poly_norm import poly_norm
from liger_aot.ops.rms_norm import fused_add_rms_norm, rms_norm


def _init_vector(size, init_fn):
    if init_fn not in ("ones", "zeros"):
        raise ValueError(f"init_fn must be either 'ones' or 'zeros', got {init_fn!r}")
    return torch.ones(size) if init_fn == "ones" else torch.zeros(size)


class LigerRMSNorm(nn.Module):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * (offset + weight). in_place: the backward writes
    dx into the output gradient's buffer (see liger_aot.ops.rms_norm.rms_norm for when to
    turn it off). row_mode is accepted for signature compatibility and unused.
    elementwise_affine=False: no weight (plain x / rms(x))."""

    def __init__(self, hidden_size, eps=1e-6, offset=0.0, casting_mode="llama", init_fn="ones",
                 in_place=True, row_mode=None, elementwise_affine=True):
        super().__init__()
        weight = _init_vector(hidden_size, init_fn)
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(weight)
        else:
            self.register_parameter("weight", None)
        self.variance_epsilon, self.offset, self.casting_mode, self.in_place, self.row_mode = (
            eps, offset, casting_mode, in_place, row_mode)

    def forward(self, hidden_states):
        weight, offset = self.weight, self.offset
        if weight is None:
            weight = torch.ones(hidden_states.shape[-1], dtype=hidden_states.dtype,
                                device=hidden_states.device)
            offset = 0.0
        return rms_norm(hidden_states, weight, self.variance_epsilon, offset,
                        self.casting_mode, self.in_place)

    def extra_repr(self):
        shape = tuple(self.weight.shape) if self.weight is not None else None
        return (f"weight_shape={shape}, eps={self.variance_epsilon}, offset={self.offset}, "
                f"in_place={self.in_place}, row_mode={self.row_mode}")


class LigerRMSNormForGemma(LigerRMSNorm):
    def __init__(self, hidden_size, eps=1e-6, offset=1.0, casting_mode="gemma", init_fn="zeros",
                 in_place=True, row_mode=None):
        super().__init__(hidden_size, eps, offset, casting_mode, init_fn, in_place, row_mode)


class LigerRMSNormForGemma2(LigerRMSNorm):
    def __init__(self, hidden_size, eps=1e-6, offset=1.0, casting_mode="gemma", init_fn="zeros",
                 in_place=False, row_mode=None):
        super().__init__(hidden_size, eps, offset, casting_mode, init_fn, in_place, row_mode)


class LigerRMSNormForGemma3(LigerRMSNorm):
    """Gemma3's q_norm / k_norm take `dim`, not hidden_size."""

    def __init__(self, dim, eps=1e-6, offset=1.0, casting_mode="gemma", init_fn="zeros",
                 in_place=False):
        super().__init__(dim, eps, offset, casting_mode, init_fn, in_place)


class LigerFusedAddRMSNorm(nn.Module):
    """forward(hidden_states, residual) -> (rmsnorm(hidden_states + residual), hidden_states +
    residual): the residual add of a decoder layer fused into the RMSNorm that follows it."""

    def __init__(self, hidden_size, eps=1e-6, offset=0.0, casting_mode="llama", init_fn="ones",
                 in_place=False, row_mode=None):
        super().__init__()
        self.weight = nn.Parameter(_init_vector(hidden_size, init_fn))
        self.variance_epsilon, self.offset, self.casting_mode, self.in_place, self.row_mode = (
            eps, offset, casting_mode, in_place, row_mode)

    def forward(self, hidden_states, residual):
        return fused_add_rms_norm(hidden_states, residual, self.weight, self.variance_epsilon,
                                  self.offset, self.casting_mode, self.in_place)

    def extra_repr(self):
        return (f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, offset={self.offset}, "
                f"in_place={self.in_place}, row_mode={self.row_mode}")


class LigerLayerNorm(nn.Module):
    """LayerNorm over the last dimension. As in Liger-Kernel, a bias parameter always exists:
    zeros when bias=False, random normal when bias=True."""

    def __init__(self, hidden_size, eps=1e-6, bias=False, init_fn="ones"):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(_init_vector(hidden_size, init_fn))
        self.bias = nn.Parameter(torch.randn(hidden_size) if bias else torch.zeros(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        return layer_norm(hidden_states, self.weight, self.bias, self.variance_epsilon)

    def extra_repr(self):
        return f"{self.hidden_size}, eps={self.eps}"


class LigerGroupNorm(nn.Module):
    """GroupNorm of (batch, num_channels, *) input. As in Liger-Kernel, a bias parameter always
    exists: zeros when bias=False, random normal when bias=True."""

    def __init__(self, num_channels, num_groups, eps=1e-6, bias=False, init_fn="ones"):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"Number of channels {num_channels} must be divisible by "
                             f"num_groups {num_groups}")
        self.num_channels = num_channels
        self.num_groups = num_groups
        self.eps = eps
        self.weight = nn.Parameter(_init_vector(num_channels, init_fn))
        self.bias = nn.Parameter(torch.randn(num_channels) if bias
                                 else torch.zeros(num_channels))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        if hidden_states.dim() < 3:
            raise ValueError(f"Input must have at least 3 dimensions, got "
                             f"{hidden_states.dim()}")
        return group_norm(hidden_states, self.weight, self.bias, self.num_channels,
                          self.num_groups, self.variance_epsilon)

    def extra_repr(self):
        return (f"num_channels={self.num_channels}, num_groups={self.num_groups}, "
                f"eps={self.eps}")


class LigerPolyNorm(nn.Module):
    """PolyNorm: w0*norm(x^3) + w1*norm(x^2) + w2*norm(x) + b, weight initialized to 1/3 each
    and bias to 1 (as PolyCom and Liger-Kernel)."""

    def __init__(self, eps=1e-6, in_place=True):
        super().__init__()
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3.0))
        self.bias = nn.Parameter(torch.tensor(1.0))
        self.variance_epsilon = eps
        self.in_place = in_place

    def forward(self, hidden_states):
        return poly_norm(hidden_states, self.weight, self.bias, self.variance_epsilon,
                         self.in_place)

    def extra_repr(self):
        return (f"weight_shape={tuple(self.weight.shape)}, eps={self.variance_epsilon}, "
                f"in_place={self.in_place}")


class LigerDyT(nn.Module):
    """Dynamic tanh: gamma * tanh(alpha * x) + beta, alpha a learned scalar (shape (1,))."""

    def __init__(self, hidden_size, beta=True, init_alpha=0.5):
        super().__init__()
        self.hidden_size = hidden_size
        self.init_alpha = init_alpha
        self.alpha = nn.Parameter(torch.ones(1) * init_alpha)
        self.gamma = nn.Parameter(torch.ones(hidden_size))
        self.beta = None
        if beta:
            self.beta = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x):
        return dyt(x, self.alpha, self.gamma, self.beta)

    def extra_repr(self):
        return f"{self.hidden_size}, init_alpha={self.init_alpha}, beta={self.beta is not None}"


__all__ = ["LigerDyT", "LigerFusedAddRMSNorm", "LigerGroupNorm", "LigerLayerNorm",
           "LigerPolyNorm", "LigerRMSNorm", "LigerRMSNormForGemma", "LigerRMSNormForGemma2",
           "LigerRMSNormForGemma3"]
