"""Variant specs for RoPE and Qwen2-VL M-RoPE (forward and backward in one kernel): see
kernels.py for the math and the two kernels."""
from ..spec import Config, KernelSpec, Param, next_power_of_2

# BLOCK_D covers half the head dim (longer halves loop over BLOCK_D chunks); BLOCK_H heads
# per step keep each half-tile at 512 elements. Picked on an H200 (bf16, head_dim 32-256):
# larger tiles or more warps were slower on these small, latency-bound launches.
# Every config compiles without fma contraction (fp_fusion=False): each product is rounded
# before the sum, as in Hugging Face's elementwise formula, so fp32 results equal it bit for
# bit. Contracted, a kernel's last bits differ from HF's in a fifth of the elements, which
# flipped a near-tied expert choice in the fp32 Mixtral convergence test (session 24).
CONFIGS = tuple(
    Config({"BLOCK_H": 512 // d, "BLOCK_D": d}, num_warps=w, fp_fusion=False)
    for d, w in ((16, 2), (32, 2), (64, 4), (128, 2))
)


def select_config(half_dim: int) -> Config:
    for config in CONFIGS:
        if half_dim <= config.constexprs["BLOCK_D"]:
            return config
    return CONFIGS[-1]


# rope_whole: a whole position a program (kernels.py). BLOCK_D covers the half dim (at least
# 32 columns), BLOCK_HQ the q heads (at least 8), BLOCK_HK the k heads, from BLOCK_HQ / 8 (the
# usual grouped-query ratios; fewer k heads run masked in a larger tile) to BLOCK_HQ; a q tile
# holds at most 4096 elements a half. Warps by that half's elements, measured on an H200
# (bf16, session 24; 1 / 2 / 4 / 8 warps, % of copy fwd+bwd): 16 x 32 69.1 / 67.7 / 55.1 /
# 33.9; 32 x 32 83.9 / 83.7 / 83.7 / 72.2; 8 x 128 81.7 / 82.0 / 81.3 / 79.6; 32 x 64 88.2 /
# 87.8 / 87.0 / 87.2; 16 x 128 87.5 / 87.2 / 87.4 / 85.2; 64 x 64 81.8 / 85.4 / 87.8 / 88.9.
WHOLE_MAX_TILE = 4096


def _whole_warps(q_half_elements: int) -> int:
    return 1 if q_half_elements <= 512 else 2 if q_half_elements <= 2048 else 8


WHOLE_CONFIGS = tuple(
    Config({"BLOCK_HQ": hq, "BLOCK_HK": hk, "BLOCK_D": d}, num_warps=_whole_warps(hq * d),
           fp_fusion=False)
    for d in (32, 64, 128) for hq in (8, 16, 32, 64, 128) if hq * d <= WHOLE_MAX_TILE
    for hk in (hq // 8, hq // 4, hq // 2, hq)
)
_WHOLE = {tuple(c.constexprs.values()): c for c in WHOLE_CONFIGS}


def whole_config(half_dim: int, n_q_heads: int, n_k_heads: int) -> Config | None:
    """rope_whole's config for plain RoPE of these sizes, or None when they do not fit its
    tiles (more than WHOLE_MAX_TILE elements a half of q, a half dim over 128, more k heads
    than the q tile holds): the op then runs the looped kernel, as it does for M-RoPE."""
    hq = max(8, next_power_of_2(n_q_heads))
    return _WHOLE.get((hq, max(hq // 8, next_power_of_2(n_k_heads)),
                       max(32, next_power_of_2(half_dim))))


def _whole_rule(half_dim: int, n_q_heads: int, n_k_heads: int) -> Config:
    config = whole_config(half_dim, n_q_heads, n_k_heads)
    if config is None:
        raise ValueError(f"rope_whole does not fit half_dim {half_dim}, {n_q_heads} q heads "
                         f"and {n_k_heads} k heads: the looped rope kernel runs those")
    return config


def _strides(prefix: str, dims: str):
    return tuple(Param(f"stride_{prefix}{d}", "i64", divisible=True) for d in dims)


_PARAMS = (
    (Param("QO", "ptr"), Param("KO", "ptr"), Param("Q", "ptr"), Param("K", "ptr"),
     Param("COS", "ptr"), Param("SIN", "ptr"),
     Param("seq_len", "i32"), Param("n_q_heads", "i32"), Param("n_k_heads", "i32"),
     Param("half_dim", "i32", divisible=True))
    + _strides("qo", "bhs") + _strides("q", "bhs")
    + _strides("ko", "bhs") + _strides("k", "bhs")
    + _strides("c", "bs") + _strides("s", "bs")
    # M-RoPE: cos/sin plane strides and section bounds (see kernels.py)
    + (Param("stride_cp", "i64", divisible=True), Param("stride_sp", "i64", divisible=True),
       Param("sec0", "i32"), Param("sec1", "i32"), Param("backward", "i32")))

ROPE = KernelSpec(name="rope", family="rope", function="rope", params=_PARAMS,
                  configs=CONFIGS, rule=select_config)
ROPE_WHOLE = KernelSpec(name="rope_whole", family="rope", function="rope_whole",
                        params=_PARAMS, configs=WHOLE_CONFIGS, rule=_whole_rule)

SPECS = (ROPE, ROPE_WHOLE)
