"""Variant specs for the generalized JSD and the fused-linear JSD row kernel: see kernels.py."""
from ..spec import Config, KernelSpec, Param

# jsd: tiles of 2048 elements on 4 warps; short rows stack several rows per tile.
CONFIGS = (
    Config({"BLOCK_M": 16, "BLOCK_N": 128}, num_warps=4),
    Config({"BLOCK_M": 4, "BLOCK_N": 512}, num_warps=4),
    Config({"BLOCK_M": 1, "BLOCK_N": 2048}, num_warps=4),
)


def select_config(n_cols: int) -> Config:
    for config in CONFIGS[:-1]:
        if n_cols <= config.constexprs["BLOCK_N"]:
            return config
    return CONFIGS[-1]


def grid(n_rows: int, n_cols: int, config: Config) -> tuple:
    bm, bn = config.constexprs["BLOCK_M"], config.constexprs["BLOCK_N"]
    return ((n_rows + bm - 1) // bm, (n_cols + bn - 1) // bn)


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
