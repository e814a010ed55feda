"""Variant spec for total variation distance: see kernels.py for the math."""
from ..spec import Config, KernelSpec, Param

# Tiles of 2048 elements on 4 warps (16 per thread: two 16-byte loads per operand in
# bf16). Short rows stack several rows per tile so few lanes are masked.
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
