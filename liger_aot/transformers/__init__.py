"""Hugging Face integration: Liger-Kernel-named modules, functionals and model patching.

    from liger_aot.transformers import apply_liger_kernel_to_llama, AutoLigerKernelForCausalLM

Names load lazily (PEP 562): importing this package costs no op registration until a name is
used.
"""
import importlib

from . import functional
from .monkey_patch import MODEL_PATCHES

_MODULES = {
    "activations": ("LigerBlockSparseTop2MLP", "LigerGEGLUMLP", "LigerPhi3SwiGLUMLP",
                    "LigerQwen3MoeSwiGLUMLP", "LigerReLUSquared", "LigerSwiGLUMLP"),
    "auto_model": ("AutoLigerKernelForCausalLM",),
    "losses_ce": ("CrossEntropyOutput", "LigerCrossEntropyLoss",
                  "LigerFusedLinearCrossEntropyLoss"),
    "losses_distill": ("LigerFusedLinearJSD", "LigerJSD", "LigerKLDIVLoss", "LigerTVDLoss"),
    "norms": ("LigerDyT", "LigerFusedAddRMSNorm", "LigerGroupNorm", "LigerLayerNorm",
              "LigerPolyNorm", "LigerRMSNorm", "LigerRMSNormForGemma", "LigerRMSNormForGemma2",
              "LigerRMSNormForGemma3"),
    "softmax": ("LigerSoftmax", "LigerSparsemax"),
    "monkey_patch": ("apply_liger_kernel", "apply_liger_kernel_to_instance",
                     "revert_liger_kernel", "supported_model_types",
                     *(f"apply_liger_kernel_to_{t}" for t in MODEL_PATCHES)),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_WHERE) + sorted(n for n in functional.__all__ if "rotary" in n or "rope" in n)


def __getattr__(name):
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    elif name in functional.__all__:
        value = getattr(functional, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return __all__
