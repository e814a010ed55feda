"""Hugging Face integration: Liger-Kernel-named modules, functionals and model patching.

    from liger_aot.transformers import apply_liger_kernel_to_llama, AutoLigerKernelForCausalLM
"""
from . import functional
from .activations import (LigerBlockSparseTop2MLP, LigerGEGLUMLP, LigerPhi3SwiGLUMLP,
                          LigerQwen3MoeSwiGLUMLP, LigerReLUSquared, LigerSwiGLUMLP)
from .auto_model import AutoLigerKernelForCausalLM
from .functional import (liger_llama4_text_rotary_pos_emb, liger_llama4_vision_rotary_pos_emb,
                         liger_multimodal_rotary_pos_emb, liger_qwen2vl_mrope, liger_rope,
                         liger_rotary_pos_emb)
from .losses_ce import CrossEntropyOutput, LigerCrossEntropyLoss, LigerFusedLinearCrossEntropyLoss
from .losses_distill import LigerFusedLinearJSD, LigerJSD, LigerKLDIVLoss, LigerTVDLoss
from .monkey_patch import *  # noqa: F401,F403 - apply_liger_kernel_to_<model_type>, one per row
from .monkey_patch import __all__ as _patch_names
from .norms import (LigerDyT, LigerFusedAddRMSNorm, LigerGroupNorm, LigerLayerNorm, LigerPolyNorm,
                    LigerRMSNorm, LigerRMSNormForGemma, LigerRMSNormForGemma2,
                    LigerRMSNormForGemma3)
from .softmax import LigerSoftmax, LigerSparsemax

__all__ = [n for n in dir() if n.startswith(("Liger", "liger_", "Auto", "CrossEntropyOutput"))]
__all__ += list(_patch_names)
