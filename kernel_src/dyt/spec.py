"""Variant spec for DyT: see kernels.py for the math."""
from ..spec import Config, KernelSpec, Param

# Tiles of 2048 elements: several rows per program for short rows, 1024-column blocks
# (grid axis 1) otherwise.
CONFIGS = tuple(
    Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4)
    for m, n in ((8, 256), (2, 1024))
)


# Backward tiles of 1024 elements: it holds three fp32 accumulators per element of the tile.
BWD_CONFIGS = tuple(
    Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4)
    for m, n in ((4, 256), (1, 1024))
)


def _pick(configs, n_cols):
    return configs[0] if n_cols <= configs[0].constexprs["BLOCK_N"] else configs[1]


def select_config(n_cols: int) -> Config:
    return _pick(CONFIGS, n_cols)


def select_bwd_config(n_cols: int) -> Config:
    return _pick(BWD_CONFIGS, n_cols)


def col_blocks(n_cols: int, config: Config) -> int:
    n = config.constexprs["BLOCK_N"]
    return (n_cols + n - 1) // n


FWD = KernelSpec(
    name="dyt_fwd", family="dyt", function="dyt_fwd",
    params=(Param("Y", "ptr"), Param("X", "ptr"), Param("ALPHA", "ptr"), Param("GAMMA", "ptr"),
            Param("BETA", "ptr"), Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_y", "i64", divisible=True), Param("stride_x", "i64", divisible=True),
            Param("has_beta", "i32")),
    configs=CONFIGS, rule=select_config,
)

BWD = KernelSpec(
    name="dyt_bwd", family="dyt", function="dyt_bwd",
    params=(Param("DX", "ptr"), Param("DGAMMA_PARTIAL", "ptr", dtype="fp32"),
            Param("DBETA_PARTIAL", "ptr", dtype="fp32"),
            Param("DALPHA_PARTIAL", "ptr", dtype="fp32"), Param("DY", "ptr"), Param("X", "ptr"),
            Param("ALPHA", "ptr"), Param("GAMMA", "ptr"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_dx", "i64", divisible=True), Param("stride_dy", "i64", divisible=True),
            Param("stride_x", "i64", divisible=True), Param("rows_per_program", "i32")),
    configs=BWD_CONFIGS, rule=select_bwd_config,
)

SPECS = (FWD, BWD)
