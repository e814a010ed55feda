"""AutoLigerKernelForCausalLM: AutoModelForCausalLM that patches the model family first."""
from __future__ import annotations

import inspect

from .monkey_patch import MODEL_PATCHES, _unsupported, apply_liger_kernel

_PATCH_ARGS = [name for name in inspect.signature(apply_liger_kernel).parameters
               if name not in ("model_type", "model", "unused")]


def _split(kwargs: dict) -> tuple:
    patch_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _PATCH_ARGS}
    return patch_kwargs, kwargs


class AutoLigerKernelForCausalLM:
    """`from_pretrained` / `from_config` as transformers.AutoModelForCausalLM, with the model
    family patched by liger-aot before the model is built. Patch flags (rope, rms_norm,
    swiglu, cross_entropy, fused_linear_cross_entropy) may be passed as keyword arguments."""

    @classmethod
    def from_config(cls, config, **kwargs):
        from transformers import AutoModelForCausalLM

        patch_kwargs, kwargs = _split(kwargs)
        _patch(config.model_type, patch_kwargs)
        return AutoModelForCausalLM.from_config(config, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        from transformers import AutoConfig, AutoModelForCausalLM

        patch_kwargs, kwargs = _split(kwargs)
        config = kwargs.get("config")
        if config is None:
            config = AutoConfig.from_pretrained(
                pretrained_model_name_or_path,
                trust_remote_code=kwargs.get("trust_remote_code", False))
        _patch(config.model_type, patch_kwargs)
        return AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path, *model_args,
                                                    **kwargs)


def _patch(model_type: str, patch_kwargs: dict):
    if model_type not in MODEL_PATCHES:
        raise _unsupported(model_type)
    apply_liger_kernel(model_type, **patch_kwargs)
