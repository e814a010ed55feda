"""Variant spec for sparsemax over the last dim: see kernels.py for the math."""
from ..spec import Config, KernelSpec, Param

# Whole-row configs hold BLOCK_M rows of up to BLOCK_N columns in registers; longer rows use
# the looped config, one row per program, where every bisection / refinement step is a pass
# over the row (so it bisects less: see BISECT).
WHOLE_ROW = tuple(
    Config({"BLOCK_M": m, "BLOCK_N": n, "LOOP": False}, num_warps=w)
    for m, n, w in ((4, 512, 4), (1, 4096, 8))
)
LOOPED = Config({"BLOCK_M": 1, "BLOCK_N": 4096, "LOOP": True}, num_warps=8)
CONFIGS = WHOLE_ROW + (LOOPED,)

# Bisection steps before the exact refinement: each halves the interval [max - 1, max) that
# holds the threshold, so the refinement starts from a support close to the final one.
BISECT = {False: 16, True: 8}


def select_config(n_cols: int) -> Config:
    for config in WHOLE_ROW:
        if n_cols <= config.constexprs["BLOCK_N"]:
            return config
    return LOOPED


def grid(n_rows: int, config: Config) -> tuple:
    m = config.constexprs["BLOCK_M"]
    return ((n_rows + m - 1) // m,)


FWD = KernelSpec(
    name="sparsemax_fwd", family="sparsemax", function="sparsemax_fwd",
    params=(Param("Y", "ptr"), Param("X", "ptr"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_y", "i64", divisible=True), Param("stride_x", "i64", divisible=True),
            Param("n_bisect", "i32")),
    configs=CONFIGS, rule=select_config,
)

BWD = KernelSpec(
    name="sparsemax_bwd", family="sparsemax", function="sparsemax_bwd",
    params=(Param("DX", "ptr"), Param("DY", "ptr"), Param("Y", "ptr"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_dx", "i64", divisible=True), Param("stride_dy", "i64", divisible=True),
            Param("stride_y", "i64", divisible=True)),
    configs=CONFIGS, rule=select_config,
)

SPECS = (FWD, BWD)
