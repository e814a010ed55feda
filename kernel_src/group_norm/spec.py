"""Variant spec for GroupNorm: see kernels.py for the math."""
from ..spec import Config, KernelSpec, Param

# Forward walks each (batch, group) row flat in 2048-element blocks: one config.
FWD_CONFIG = Config({"BLOCK": 2048}, num_warps=8)

# Backward tiles of BLOCK_C channels x BLOCK_HW positions (1024 elements), picked by hw so
# short spatial extents still fill the tile.
BWD_CONFIGS = tuple(
    Config({"BLOCK_C": c, "BLOCK_HW": s}, num_warps=4)
    for c, s in ((64, 16), (8, 128), (1, 1024))
)


def select_config(hw: int) -> Config:
    return FWD_CONFIG


def select_bwd_config(hw: int) -> Config:
    for config in BWD_CONFIGS[:-1]:
        if hw <= config.constexprs["BLOCK_HW"]:
            return config
    return BWD_CONFIGS[-1]


FWD = KernelSpec(
    name="group_norm_fwd", family="group_norm", function="group_norm_fwd",
    params=(Param("Y", "ptr"), Param("X", "ptr"), Param("W", "ptr"), Param("B", "ptr"),
            Param("MEAN", "ptr", dtype="fp32"), Param("RSTD", "ptr", dtype="fp32"),
            Param("n_groups", "i32"), Param("ch_per_group", "i32"),
            Param("hw", "i32", divisible=True), Param("group_size", "i32", divisible=True),
            Param("eps", "fp32"), Param("has_bias", "i32")),
    configs=(FWD_CONFIG,), rule=select_config,
)

BWD = KernelSpec(
    name="group_norm_bwd", family="group_norm", function="group_norm_bwd",
    params=(Param("DX", "ptr"), Param("DW_PARTIAL", "ptr", dtype="fp32"),
            Param("DB_PARTIAL", "ptr", dtype="fp32"), Param("DY", "ptr"), Param("X", "ptr"),
            Param("W", "ptr"), Param("MEAN", "ptr", dtype="fp32"),
            Param("RSTD", "ptr", dtype="fp32"),
            Param("n_groups", "i32"), Param("ch_per_group", "i32"),
            Param("hw", "i32", divisible=True), Param("group_size", "i32", divisible=True)),
    configs=BWD_CONFIGS, rule=select_bwd_config,
)

SPECS = (FWD, BWD)
