"""Functional forms of the ops, under Liger-Kernel's names."""
from liger_aot.ops.cross_entropy import cross_entropy as liger_cross_entropy
from liger_aot.ops.rms_norm import rms_norm as liger_rms_norm
from liger_aot.ops.rope import liger_rotary_pos_emb
from liger_aot.ops.swiglu import swiglu as liger_swiglu

liger_rope = liger_rotary_pos_emb

__all__ = ["liger_cross_entropy", "liger_rms_norm", "liger_rope", "liger_rotary_pos_emb",
           "liger_swiglu"]
