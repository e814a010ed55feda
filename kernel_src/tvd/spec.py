"""Variant spec for total variation distance: see kernels.py for the math."""
from ..spec import KernelSpec, Param
from ..tiles import grid, row_tile_configs, row_tile_rule  # noqa: F401 (grid: for the ops)

CONFIGS = row_tile_configs()
select_config = row_tile_rule(CONFIGS)


FWD = KernelSpec(
    name="tvd_fwd", family="tvd", function="tvd_fwd",
    params=(Param("OUT", "ptr", dtype="fp32"), Param("P", "ptr"), Param("Q", "ptr"),
            Param("LABELS", "ptr", dtype="i64"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_out", "i64", divisible=True),
            Param("stride_p", "i64", divisible=True), Param("stride_q", "i64", divisible=True),
            Param("ignore_index", "i64"), Param("has_label", "i32"),
            Param("per_element", "i32")),
    configs=CONFIGS, rule=select_config,
)

BWD = KernelSpec(
    name="tvd_bwd", family="tvd", function="tvd_bwd",
    params=(Param("DP", "ptr"), Param("P", "ptr"), Param("Q", "ptr"),
            Param("LABELS", "ptr", dtype="i64"), Param("N_VALID", "ptr", dtype="i64"),
            Param("GO", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_dp", "i64", divisible=True), Param("stride_p", "i64", divisible=True),
            Param("stride_q", "i64", divisible=True), Param("stride_go", "i64", divisible=True),
            Param("ignore_index", "i64"), Param("scale", "fp32"), Param("has_label", "i32"),
            Param("go_per_element", "i32"), Param("divide", "i32")),
    configs=CONFIGS, rule=select_config,
)

SPECS = (FWD, BWD)
