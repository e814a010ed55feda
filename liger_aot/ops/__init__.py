"""Ops: autograd functions over the AOT kernels."""
from .cross_entropy import cross_entropy
from .rms_norm import rms_norm
from .rope import liger_rotary_pos_emb
from .swiglu import swiglu

__all__ = ["cross_entropy", "liger_rotary_pos_emb", "rms_norm", "swiglu"]
