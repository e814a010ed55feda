"""Variant specs for the generalized JSD and the fused-linear JSD row kernel: see kernels.py."""
from ..spec import Config, KernelSpec, Param
from ..tiles import grid, row_tile_configs, row_tile_rule  # noqa: F401 (grid: for the ops)

# jsd: the shared row tiles (see tiles.py).
CONFIGS = row_tile_configs()
select_config = row_tile_rule(CONFIGS)


# fused_linear_jsd_rows: one row per program streamed in BLOCK_V chunks, the layout the
# cross-entropy kernel measured fastest for row streaming (one warp, 512 columns a step;
# the per-chunk max is a warp shuffle). The chunk's matmuls dominate this op's time.
ROW_CONFIGS = (Config({"BLOCK_V": 512}, num_warps=1),)


def select_row_config(n_cols: int) -> Config:
    return ROW_CONFIGS[0]


JSD = KernelSpec(
    name="jsd", family="jsd", function="jsd",
    params=(Param("LOSS_PARTIAL", "ptr", dtype="fp32"), Param("DX", "ptr"), Param("X", "ptr"),
            Param("Y", "ptr"), Param("LABELS", "ptr", dtype="i64"),
            Param("N_VALID", "ptr", dtype="i64"), Param("GO", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_dx", "i64", divisible=True), Param("stride_x", "i64", divisible=True),
            Param("stride_y", "i64", divisible=True), Param("ignore_index", "i64"),
            Param("beta", "fp32"), Param("inv_n", "fp32"), Param("has_label", "i32"),
            Param("has_loss", "i32"), Param("has_grad", "i32")),
    configs=CONFIGS, rule=select_config,
)

FUSED_LINEAR_ROWS = KernelSpec(
    name="fused_linear_jsd_rows", family="jsd", function="fused_linear_jsd_rows",
    params=(Param("LOSS", "ptr", dtype="fp32"), Param("S_LOGITS", "ptr"),
            Param("T_LOGITS", "ptr"), Param("LABELS", "ptr", dtype="i64"),
            Param("N_VALID", "ptr", dtype="i64"), Param("row0", "i64"),
            Param("n_cols", "i32", divisible=True), Param("stride_s", "i64", divisible=True),
            Param("stride_t", "i64", divisible=True),
            Param("ignore_index", "i64"), Param("beta", "fp32"), Param("inv_temp", "fp32"),
            Param("inv_n", "fp32"), Param("has_label", "i32"), Param("has_grad", "i32")),
    configs=ROW_CONFIGS, rule=select_row_config,
)

SPECS = (JSD, FUSED_LINEAR_ROWS)
