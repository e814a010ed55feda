"""Functional forms of the ops, under Liger-Kernel's names and signatures.

Imported lazily (PEP 562): each name loads its op module on first use, so a process that uses
three ops does not register the custom ops of thirty."""
import importlib

_NAMES = {
    "liger_cross_entropy": ("cross_entropy", "liger_cross_entropy"),
    "liger_dyt": ("dyt", "dyt"),
    "liger_fused_add_rms_norm": ("rms_norm", "fused_add_rms_norm"),
    "liger_fused_linear_cross_entropy": ("fused_linear_cross_entropy",
                                         "fused_linear_cross_entropy"),
    "liger_fused_linear_jsd": ("fused_linear_jsd", "fused_linear_jsd"),
    "liger_geglu": ("geglu", "geglu"),
    "liger_group_norm": ("group_norm", "group_norm"),
    "liger_jsd": ("jsd", "jsd"),
    "liger_kl_div": ("kl_div", "kl_div"),
    "liger_layer_norm": ("layer_norm", "layer_norm"),
    "liger_llama4_text_rotary_pos_emb": ("llama4_rope", "liger_llama4_text_rotary_pos_emb"),
    "liger_llama4_vision_rotary_pos_emb": ("llama4_rope", "liger_llama4_vision_rotary_pos_emb"),
    "liger_multimodal_rotary_pos_emb": ("mrope", "liger_multimodal_rotary_pos_emb"),
    "liger_qwen2vl_mrope": ("mrope", "liger_multimodal_rotary_pos_emb"),
    "liger_poly_norm": ("poly_norm", "poly_norm"),
    "liger_relu_squared": ("relu_squared", "relu_squared"),
    "liger_rms_norm": ("rms_norm", "rms_norm"),
    "liger_rope": ("rope", "liger_rotary_pos_emb"),
    "liger_rotary_pos_emb": ("rope", "liger_rotary_pos_emb"),
    "liger_softmax": ("softmax", "softmax"),
    "liger_sparsemax": ("sparsemax", "sparsemax"),
    "liger_swiglu": ("swiglu", "swiglu"),
    "liger_tvd": ("tvd", "tvd"),
}

__all__ = sorted(_NAMES)


def __getattr__(name):
    try:
        module, attr = _NAMES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"liger_aot.ops.{module}"), attr)
    globals()[name] = value
    return value


def __dir__():
    return __all__
