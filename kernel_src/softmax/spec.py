"""Variant spec for softmax over the last dim: see kernels.py for the math and the phases."""
from ..spec import Config, KernelSpec, Param

# Whole-row configs: rows up to BLOCK_N columns held in registers (at most 32 fp32 values per
# thread), several rows per program for short rows. Longer rows: the looped config.
WHOLE_ROW = tuple(
    Config({"BLOCK_M": m, "BLOCK_N": n, "LOOP": False}, num_warps=w)
    for m, n, w in ((8, 256, 4), (2, 1024, 4), (1, 4096, 8), (1, 16384, 16))
)
LOOPED = Config({"BLOCK_M": 1, "BLOCK_N": 4096, "LOOP": True}, num_warps=8)
CONFIGS = WHOLE_ROW + (LOOPED,)

# A long row is split over at most this many programs (the kernel combines up to 64 chunk
# statistics in one vector).
MAX_CHUNKS = 64

PHASE_STATS, PHASE_APPLY, PHASE_FUSED = 0, 1, 2


def select_config(n_cols: int) -> Config:
    for config in WHOLE_ROW:
        if n_cols <= config.constexprs["BLOCK_N"]:
            return config
    return LOOPED


def split(n_rows: int, n_cols: int, target_programs: int,
          block: int = LOOPED.constexprs["BLOCK_N"]) -> tuple:
    """(chunk_cols, n_chunks) for a looped config of BLOCK_N `block`: one chunk per row when
    there are enough rows to fill `target_programs`, else the row split into block-multiple
    chunks."""
    blocks = (n_cols + block - 1) // block
    want = min(MAX_CHUNKS, blocks, max(1, (target_programs + n_rows - 1) // max(n_rows, 1)))
    chunk_blocks = (blocks + want - 1) // want
    chunk_cols = chunk_blocks * block
    return chunk_cols, (n_cols + chunk_cols - 1) // chunk_cols


def plan(config: Config, n_rows: int, n_cols: int, target_programs: int) -> tuple:
    """(grid, chunk_cols, n_chunks, phases) of the launches over n_rows x n_cols."""
    if not config.constexprs["LOOP"]:
        block_m = config.constexprs["BLOCK_M"]
        return ((n_rows + block_m - 1) // block_m,), 0, 1, (PHASE_FUSED,)
    chunk_cols, n_chunks = split(n_rows, n_cols, target_programs, config.constexprs["BLOCK_N"])
    phases = (PHASE_FUSED,) if n_chunks == 1 else (PHASE_STATS, PHASE_APPLY)
    return (n_rows, n_chunks), chunk_cols, n_chunks, phases


FWD = KernelSpec(
    name="softmax_fwd", family="softmax", function="softmax_fwd",
    params=(Param("Y", "ptr"), Param("X", "ptr"), Param("STATS", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_y", "i64", divisible=True), Param("stride_x", "i64", divisible=True),
            Param("chunk_cols", "i32", divisible=True), Param("n_chunks", "i32"),
            Param("phase", "i32")),
    configs=CONFIGS, rule=select_config,
)

BWD = KernelSpec(
    name="softmax_bwd", family="softmax", function="softmax_bwd",
    params=(Param("DX", "ptr"), Param("DY", "ptr"), Param("Y", "ptr"),
            Param("STATS", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_dx", "i64", divisible=True), Param("stride_dy", "i64", divisible=True),
            Param("stride_y", "i64", divisible=True),
            Param("chunk_cols", "i32", divisible=True), Param("n_chunks", "i32"),
            Param("phase", "i32")),
    configs=CONFIGS, rule=select_config,
)

SPECS = (FWD, BWD)
