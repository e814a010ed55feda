"""MLP and activation modules with Liger-Kernel's names, on the gated-activation kernels.

Constructors take a Hugging Face config (attributes hidden_size, intermediate_size,
hidden_act) like the modules they replace, and hold the same nn.Linear layers under the same
names, so a model's state dict loads unchanged.
"""
from __future__ import annotations

import torch.nn as nn

from liger_aot.ops.geglu import geglu
from liger_aot.ops.relu_squared import relu_squared
from liger_aot.ops.swiglu import swiglu

_SILU = ("silu", "swish")


def _check_silu(config):
    act = getattr(config, "hidden_act", None)
    if act not in _SILU:
        raise ValueError(f"Activation function {act} not supported: config.hidden_act must "
                         f"be one of {list(_SILU)} for a SwiGLU MLP")


def _gated_projections(module, config, intermediate_size):
    """The config attributes and the gate_proj / up_proj / down_proj layers of a gated MLP."""
    module.config = config
    module.hidden_size = config.hidden_size
    module.intermediate_size = intermediate_size
    module.gate_proj = nn.Linear(module.hidden_size, intermediate_size, bias=False)
    module.up_proj = nn.Linear(module.hidden_size, intermediate_size, bias=False)
    module.down_proj = nn.Linear(intermediate_size, module.hidden_size, bias=False)


# The MLPs own their projections' outputs: the SwiGLU / GeGLU backward writes the gradients
# over them (in_place), as Liger-Kernel does, instead of two new buffers at the step's peak.

class LigerSwiGLUMLP(nn.Module):
    """Llama / Mistral / Qwen2 MLP: down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, config):
        super().__init__()
        _gated_projections(self, config, config.intermediate_size)
        _check_silu(config)

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), in_place=True))


class LigerBlockSparseTop2MLP(nn.Module):
    """Mixtral expert MLP: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, config):
        super().__init__()
        self.ffn_dim = config.intermediate_size
        self.hidden_dim = config.hidden_size
        self.w1 = nn.Linear(self.hidden_dim, self.ffn_dim, bias=False)
        self.w2 = nn.Linear(self.ffn_dim, self.hidden_dim, bias=False)
        self.w3 = nn.Linear(self.hidden_dim, self.ffn_dim, bias=False)
        _check_silu(config)

    def forward(self, x):
        return self.w2(swiglu(self.w1(x), self.w3(x), in_place=True))


class LigerPhi3SwiGLUMLP(nn.Module):
    """Phi-3 MLP: one fused gate_up_proj whose halves are read in place (row stride 2n)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(self.hidden_size, 2 * self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, bias=False)
        _check_silu(config)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(swiglu(gate, up, in_place=True))


class LigerQwen3MoeSwiGLUMLP(nn.Module):
    """Qwen3-MoE expert MLP; intermediate_size overrides the config's (experts use
    moe_intermediate_size)."""

    def __init__(self, config, intermediate_size=None):
        super().__init__()
        _gated_projections(self, config, intermediate_size if intermediate_size is not None
                           else config.intermediate_size)
        _check_silu(config)

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), in_place=True))


class LigerGEGLUMLP(nn.Module):
    """Gemma MLP: down_proj(gelu_tanh(gate_proj(x)) * up_proj(x)). Always the tanh
    approximation of GELU (Gemma's gelu_pytorch_tanh), whatever config.hidden_act says, as in
    Liger-Kernel."""

    def __init__(self, config):
        super().__init__()
        _gated_projections(self, config, config.intermediate_size)

    def forward(self, x):
        return self.down_proj(geglu(self.gate_proj(x), self.up_proj(x), in_place=True))


class LigerReLUSquared(nn.Module):
    """relu(x) ** 2 (Nemotron-H, Primer MLPs)."""

    def forward(self, x):
        return relu_squared(x)


__all__ = ["LigerBlockSparseTop2MLP", "LigerGEGLUMLP", "LigerPhi3SwiGLUMLP",
           "LigerQwen3MoeSwiGLUMLP", "LigerReLUSquared", "LigerSwiGLUMLP"]
