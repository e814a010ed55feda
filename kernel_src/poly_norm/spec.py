"""Variant spec for PolyNorm: see kernels.py for the math."""
from ..spec import Config, KernelSpec, Param

# Whole-row configs up to 4096 columns, one looped config beyond (rows read twice). Eight
# elements per thread and tensor: x, x^2, x^3 (and dy, four accumulators when looped) stay in
# registers without spills.
_WHOLE_ROW = tuple(
    Config({"BLOCK_M": m, "BLOCK_N": n, "LOOP": False}, num_warps=w)
    for m, n, w in ((2, 1024, 8), (1, 4096, 16))
)
_LOOPED = Config({"BLOCK_M": 1, "BLOCK_N": 2048, "LOOP": True}, num_warps=8)
CONFIGS = _WHOLE_ROW + (_LOOPED,)


def select_config(n_cols: int) -> Config:
    for config in _WHOLE_ROW:
        if n_cols <= config.constexprs["BLOCK_N"]:
            return config
    return _LOOPED


FWD = KernelSpec(
    name="poly_norm_fwd", family="poly_norm", function="poly_norm_fwd",
    params=(Param("Y", "ptr"), Param("X", "ptr"), Param("W", "ptr"), Param("B", "ptr"),
            Param("RSTD", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_y", "i64", divisible=True), Param("stride_x", "i64", divisible=True),
            Param("eps", "fp32")),
    configs=CONFIGS, rule=select_config,
)

BWD = KernelSpec(
    name="poly_norm_bwd", family="poly_norm", function="poly_norm_bwd",
    params=(Param("DX", "ptr"), Param("DWB_PARTIAL", "ptr", dtype="fp32"), Param("DY", "ptr"),
            Param("X", "ptr"), Param("W", "ptr"), Param("RSTD", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_dx", "i64", divisible=True), Param("stride_dy", "i64", divisible=True),
            Param("stride_x", "i64", divisible=True), Param("rows_per_program", "i32")),
    configs=CONFIGS, rule=select_config,
)

SPECS = (FWD, BWD)
