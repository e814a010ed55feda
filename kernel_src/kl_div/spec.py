"""Variant spec for KL divergence: see kernels.py for the math."""
from ..spec import KernelSpec, Param
from ..tiles import grid, row_tile_configs, row_tile_rule  # noqa: F401 (grid: for the ops)

CONFIGS = row_tile_configs()
select_config = row_tile_rule(CONFIGS)


FWD = KernelSpec(
    name="kl_div_fwd", family="kl_div", function="kl_div_fwd",
    params=(Param("OUT", "ptr", dtype="fp32"), Param("X", "ptr"), Param("T", "ptr"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_out", "i64", divisible=True),
            Param("stride_x", "i64", divisible=True), Param("stride_t", "i64", divisible=True),
            Param("eps", "fp32"), Param("log_target", "i32"), Param("per_element", "i32")),
    configs=CONFIGS, rule=select_config,
)

BWD = KernelSpec(
    name="kl_div_bwd", family="kl_div", function="kl_div_bwd",
    params=(Param("DX", "ptr"), Param("T", "ptr"), Param("GO", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_dx", "i64", divisible=True), Param("stride_t", "i64", divisible=True),
            Param("stride_go", "i64", divisible=True),
            Param("scale", "fp32"), Param("log_target", "i32"), Param("go_per_element", "i32")),
    configs=CONFIGS, rule=select_config,
)

SPECS = (FWD, BWD)
