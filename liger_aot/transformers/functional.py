"""Functional forms of the ops, under Liger-Kernel's names and signatures."""
from liger_aot.ops.cross_entropy import liger_cross_entropy
from liger_aot.ops.dyt import dyt as liger_dyt
from liger_aot.ops.fused_linear_cross_entropy import \
    fused_linear_cross_entropy as liger_fused_linear_cross_entropy
from liger_aot.ops.fused_linear_jsd import fused_linear_jsd as liger_fused_linear_jsd
from liger_aot.ops.geglu import geglu as liger_geglu
from liger_aot.ops.group_norm import group_norm as liger_group_norm
from liger_aot.ops.jsd import jsd as liger_jsd
from liger_aot.ops.kl_div import kl_div as liger_kl_div
from liger_aot.ops.layer_norm import layer_norm as liger_layer_norm
from liger_aot.ops.llama4_rope import (liger_llama4_text_rotary_pos_emb,
                                       liger_llama4_vision_rotary_pos_emb)
from liger_aot.ops.mrope import liger_multimodal_rotary_pos_emb
from liger_aot.ops.poly_norm import poly_norm as liger_poly_norm
from liger_aot.ops.relu_squared import relu_squared as liger_relu_squared
from liger_aot.ops.rms_norm import fused_add_rms_norm as liger_fused_add_rms_norm
from liger_aot.ops.rms_norm import rms_norm as liger_rms_norm
from liger_aot.ops.rope import liger_rotary_pos_emb
from liger_aot.ops.softmax import softmax as liger_softmax
from liger_aot.ops.sparsemax import sparsemax as liger_sparsemax
from liger_aot.ops.swiglu import swiglu as liger_swiglu
from liger_aot.ops.tvd import tvd as liger_tvd

liger_rope = liger_rotary_pos_emb
liger_qwen2vl_mrope = liger_multimodal_rotary_pos_emb

__all__ = [name for name in dir() if name.startswith("liger_")]
