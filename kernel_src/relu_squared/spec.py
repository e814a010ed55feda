"""Variant spec for ReLU squared: see kernels.py for the math."""
from ..spec import Config, KernelSpec, Param

# One flat config: 2048 elements per program (16 per thread at 4 warps, two 16-byte vectors
# for bf16), any n. Elementwise work needs no size-dependent tiling.
CONFIG = Config({"BLOCK": 2048}, num_warps=4)
CONFIGS = (CONFIG,)


def select_config(n: int) -> Config:
    return CONFIG


def grid(n: int, config: Config) -> tuple:
    block = config.constexprs["BLOCK"]
    return ((n + block - 1) // block,)


FWD = KernelSpec(
    name="relu_squared_fwd", family="relu_squared", function="relu_squared_fwd",
    params=(Param("Y", "ptr"), Param("X", "ptr"), Param("n", "i64", divisible=True)),
    configs=CONFIGS, rule=select_config,
)

BWD = KernelSpec(
    name="relu_squared_bwd", family="relu_squared", function="relu_squared_bwd",
    params=(Param("DX", "ptr"), Param("DY", "ptr"), Param("X", "ptr"),
            Param("n", "i64", divisible=True)),
    configs=CONFIGS, rule=select_config,
)

SPECS = (FWD, BWD)
