"""Variant spec for RoPE and Qwen2-VL M-RoPE (forward and backward in one kernel): see
kernels.py for the math."""
from ..spec import Config, KernelSpec, Param

# BLOCK_D covers half the head dim (longer halves loop over BLOCK_D chunks); BLOCK_H heads
# per step keep each half-tile at 512 elements. Picked on an H200 (bf16, head_dim 32-256):
# larger tiles or more warps were slower on these small, latency-bound launches.
CONFIGS = tuple(
    Config({"BLOCK_H": 512 // d, "BLOCK_D": d}, num_warps=w)
    for d, w in ((16, 2), (32, 2), (64, 4), (128, 2))
)


def select_config(half_dim: int) -> Config:
    for config in CONFIGS:
        if half_dim <= config.constexprs["BLOCK_D"]:
            return config
    return CONFIGS[-1]


def _strides(prefix: str, dims: str):
    return tuple(Param(f"stride_{prefix}{d}", "i64", divisible=True) for d in dims)


ROPE = KernelSpec(
    name="rope", family="rope", function="rope",
    params=(Param("QO", "ptr"), Param("KO", "ptr"), Param("Q", "ptr"), Param("K", "ptr"),
            Param("COS", "ptr"), Param("SIN", "ptr"),
            Param("seq_len", "i32"), Param("n_q_heads", "i32"), Param("n_k_heads", "i32"),
            Param("half_dim", "i32", divisible=True))
           + _strides("qo", "bhs") + _strides("q", "bhs")
           + _strides("ko", "bhs") + _strides("k", "bhs")
           + _strides("c", "bs") + _strides("s", "bs")
           # M-RoPE: cos/sin plane strides and section bounds (see kernels.py)
           + (Param("stride_cp", "i64", divisible=True), Param("stride_sp", "i64", divisible=True),
              Param("sec0", "i32"), Param("sec1", "i32"), Param("backward", "i32")),
    configs=CONFIGS, rule=select_config,
)

SPECS = (ROPE,)
