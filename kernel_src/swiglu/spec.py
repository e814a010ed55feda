"""Variant spec for the gated activations SwiGLU and GeGLU: see kernels.py for the math."""

from ..spec import Config, KernelSpec, Param

# Values of the runtime `act` parameter.
ACT_SILU = 0
ACT_GELU_TANH = 1

# Tiles of BLOCK_M x BLOCK_N = 2048 elements: short rows pack several rows per program so
# each program still moves a few KB; rows longer than 1024 columns are split in 2048-column
# blocks.
CONFIGS = tuple(
    Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4)
    for m, n in ((16, 128), (8, 256), (4, 512), (2, 1024), (1, 2048))
)


def select_config(n_cols: int) -> Config:
    for config in CONFIGS:
        if n_cols <= config.constexprs["BLOCK_N"]:
            return config
    return CONFIGS[-1]


def grid(n_rows: int, n_cols: int, config: Config) -> tuple:
    """One program per tile, in one grid axis (at most 2^31 - 1 tiles: 2^42 elements)."""
    m, n = config.constexprs["BLOCK_M"], config.constexprs["BLOCK_N"]
    return (((n_rows + m - 1) // m) * ((n_cols + n - 1) // n),)


FWD = KernelSpec(
    name="swiglu_fwd", family="swiglu", function="swiglu_fwd",
    params=(Param("C", "ptr"), Param("A", "ptr"), Param("B", "ptr"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_c", "i64", divisible=True), Param("stride_a", "i64", divisible=True),
            Param("stride_b", "i64", divisible=True), Param("act", "i32")),
    configs=CONFIGS, rule=select_config,
)

BWD = KernelSpec(
    name="swiglu_bwd", family="swiglu", function="swiglu_bwd",
    params=(Param("DA", "ptr"), Param("DB", "ptr"), Param("DC", "ptr"),
            Param("A", "ptr"), Param("B", "ptr"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_da", "i64", divisible=True), Param("stride_db", "i64", divisible=True),
            Param("stride_dc", "i64", divisible=True), Param("stride_a", "i64", divisible=True),
            Param("stride_b", "i64", divisible=True), Param("act", "i32")),
    configs=CONFIGS, rule=select_config,
)

SPECS = (FWD, BWD)
