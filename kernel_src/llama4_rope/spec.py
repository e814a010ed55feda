"""Variant spec for Llama-4 complex RoPE (forward and backward in one kernel): see kernels.py."""
from ..spec import Config, KernelSpec, Param

# BLOCK_D complex pairs (2 * BLOCK_D columns) per step, longer heads loop; BLOCK_H heads per
# step keep a tile at 1024 elements, the same as RoPE's two 512-element half tiles. Llama-4
# text heads have 64 pairs (head_dim 128), vision heads 44 (head_dim 88).
CONFIGS = tuple(
    Config({"BLOCK_H": 512 // d, "BLOCK_D": d}, num_warps=w)
    for d, w in ((32, 2), (64, 4), (128, 4))
)


def select_config(n_pairs: int) -> Config:
    for config in CONFIGS:
        if n_pairs <= config.constexprs["BLOCK_D"]:
            return config
    return CONFIGS[-1]


def _strides(prefix: str, dims: str):
    return tuple(Param(f"stride_{prefix}{d}", "i64", divisible=True) for d in dims)


LLAMA4_ROPE = KernelSpec(
    name="llama4_rope", family="llama4_rope", function="llama4_rope",
    params=(Param("QO", "ptr"), Param("KO", "ptr"), Param("Q", "ptr"), Param("K", "ptr"),
            Param("FREQS", "ptr", dtype="fp32"),
            Param("seq_len", "i32"), Param("n_q_heads", "i32"), Param("n_k_heads", "i32"),
            Param("head_dim", "i32", divisible=True))
           + _strides("qo", "bhs") + _strides("q", "bhs")
           + _strides("ko", "bhs") + _strides("k", "bhs")
           + _strides("f", "bs")
           + (Param("backward", "i32"),),
    configs=CONFIGS, rule=select_config,
)

SPECS = (LLAMA4_ROPE,)
