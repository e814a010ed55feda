"""Rotary-embedding functions under Liger-Kernel's names, drop-in replacements for Hugging
Face's: apply_rotary_pos_emb (Llama family), apply_multimodal_rotary_pos_emb (Qwen2-VL,
Qwen2.5-VL) and Llama-4's apply_rotary_emb / vision_apply_rotary_emb."""
from liger_aot.ops.llama4_rope import (liger_llama4_text_rotary_pos_emb,
                                       liger_llama4_vision_rotary_pos_emb)
from liger_aot.ops.mrope import liger_multimodal_rotary_pos_emb, liger_qwen2vl_mrope
from liger_aot.ops.rope import liger_rotary_pos_emb

liger_rope = liger_rotary_pos_emb

__all__ = ["liger_llama4_text_rotary_pos_emb", "liger_llama4_vision_rotary_pos_emb",
           "liger_multimodal_rotary_pos_emb", "liger_qwen2vl_mrope", "liger_rope",
           "liger_rotary_pos_emb"]
