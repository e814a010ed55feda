"""Variant spec for the column sum of fp32 partial rows: see kernels.py."""
from ..spec import Config, KernelSpec, Param

# A program owns BLOCK_N columns and walks the partial rows BLOCK_P at a time, STAGES tiles'
# loads in flight. Narrow column blocks for narrow rows so even 1024 columns spread over 32
# programs: the norms' backwards leave 132-528 partial rows (1-4 per SM of an H200).
def _config(block_n, warps):
    return Config({"BLOCK_P": 32, "BLOCK_N": block_n, "STAGES": 3}, num_warps=warps)


CONFIGS = (_config(32, 4), _config(64, 4), _config(128, 4))


def select_config(n_cols: int) -> Config:
    if n_cols <= 2048:
        return CONFIGS[0]
    if n_cols <= 8192:
        return CONFIGS[1]
    return CONFIGS[2]


def grid(n_cols: int, config: Config) -> tuple:
    block = config.constexprs["BLOCK_N"]
    return ((n_cols + block - 1) // block,)


SUM = KernelSpec(
    name="column_sum", family="column_sum", function="column_sum",
    params=(Param("OUT", "ptr"), Param("PARTIAL", "ptr", dtype="fp32"),
            Param("OUT2", "ptr"), Param("PARTIAL2", "ptr", dtype="fp32"),
            Param("n_parts", "i32"), Param("n_cols", "i32"), Param("has_second", "i32")),
    configs=CONFIGS, rule=select_config,
)

SPECS = (SUM,)
