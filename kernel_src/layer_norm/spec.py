"""Variant spec for LayerNorm: see kernels.py for the math."""
from ..spec import EXACT_KEY, HOLD_KEY, Config, KernelSpec, Param

# Whole-row configs (row in registers) up to 16K columns forward / 8K backward (the backward
# also holds dw and db accumulators), one looped config beyond. Forward: one program per row
# block (PROGRAMS_PER_SM 0); backward: 4 persistent programs per SM each owning a run of rows
# and writing fp32 dw/db partials, unpipelined. On an H200 3 stages lose at 4 per SM and win
# at 1-2 per SM (1.25-2.45x from 2K to 16K columns, docs/perf-notes.md): the sm90 tuned
# table holds those; archs without a table keep these rules. The looped backward takes 2 rows
# a step, which halves its per-row read-modify-write of the fp32 dw and db partial rows: at
# [2, 2048] on 8 warps it needs 64 registers a thread for sm90/sm80 (4 programs an SM fit;
# [4, 1024] needs 106-109, which fits 2).
def _config(m, n, w, loop=False, stages=1, per_sm=0):
    return Config({"BLOCK_M": m, "BLOCK_N": n, "LOOP": loop, "STAGES": stages,
                   "PROGRAMS_PER_SM": per_sm}, num_warps=w)


_WHOLE_ROW = tuple(_config(m, n, w) for m, n, w in ((4, 1024, 4), (1, 4096, 8), (1, 16384, 16)))
_LOOPED = _config(1, 4096, 8, loop=True)
CONFIGS = _WHOLE_ROW + (_LOOPED,)

# Backward configs add CHUNK_ROWS: looped rows over 16K columns take the interleaved layout
# (rows of a chunk write dx, then SUM_BLOCK_M x SUM_BLOCK_N column programs sum dw and db
# from L2; see rms_norm/spec.py, where it was measured first), shorter ones the persistent one.
SUM_BLOCK_M = 4
SUM_BLOCK_N = 1024
INTERLEAVED_FROM = 16384


def _bwd_config(m, n, w, loop=False, per_sm=4, stages=1, chunk=0):
    return Config({"BLOCK_M": m, "BLOCK_N": n, "LOOP": loop, "STAGES": stages,
                   "PROGRAMS_PER_SM": 0 if chunk else per_sm, "CHUNK_ROWS": chunk},
                  num_warps=w)


_BWD_WHOLE_ROW = tuple(_bwd_config(m, n, w)
                       for m, n, w in ((4, 1024, 8), (1, 4096, 8), (1, 8192, 16)))
_BWD_LOOPED = _bwd_config(2, 2048, 8, loop=True)
_BWD_INTERLEAVED = _bwd_config(1, 8192, 8, loop=True, stages=3, chunk=64)
BWD_CONFIGS = _BWD_WHOLE_ROW + (_BWD_LOOPED, _BWD_INTERLEAVED)


def _pick(whole_row, looped, n_cols):
    for config in whole_row:
        if n_cols <= config.constexprs["BLOCK_N"]:
            return config
    return looped


def select_config(n_cols: int) -> Config:
    return _pick(_WHOLE_ROW, _LOOPED, n_cols)


def select_bwd_config(n_cols: int) -> Config:
    if n_cols > INTERLEAVED_FROM:
        return _BWD_INTERLEAVED
    return _pick(_BWD_WHOLE_ROW, _BWD_LOOPED, n_cols)


FWD = KernelSpec(
    name="layer_norm_fwd", family="layer_norm", function="layer_norm_fwd",
    params=(Param("Y", "ptr"), Param("X", "ptr"), Param("W", "ptr"), Param("B", "ptr"),
            Param("MEAN", "ptr", dtype="fp32"), Param("RSTD", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_y", "i64", divisible=True), Param("stride_x", "i64", divisible=True),
            Param("eps", "fp32"), Param("has_bias", "i32"),
            # 0: mean and rstd are not written (the op's forward when no backward reads them)
            Param("store_stats", "i32")),
    configs=CONFIGS, rule=select_config,
    # PASS1_BLOCK, looped rows' pass-1 chunk: 0 (BLOCK_N) but in tuned configs; EXACT_KEY,
    # the row length compiled in, and HOLD_KEY, pass 2 from pass 1's registers
    # (kernel_src/spec.py): 0 but in tuned configs
    constexpr_defaults={"PASS1_BLOCK": 0, EXACT_KEY: 0, HOLD_KEY: 0}, staged=True,
)

BWD = KernelSpec(
    name="layer_norm_bwd", family="layer_norm", function="layer_norm_bwd",
    params=(Param("DX", "ptr"), Param("DW_PARTIAL", "ptr", dtype="fp32"),
            Param("DB_PARTIAL", "ptr", dtype="fp32"), Param("DY", "ptr"), Param("X", "ptr"),
            Param("W", "ptr"), Param("MEAN", "ptr", dtype="fp32"),
            Param("RSTD", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_dx", "i64", divisible=True), Param("stride_dy", "i64", divisible=True),
            Param("stride_x", "i64", divisible=True), Param("rows_per_program", "i32"),
            # atomic_dw = 1 (whole rows, interleaved): DW_PARTIAL and DB_PARTIAL are zeroed
            # fp32 rows the programs add into, SYNC zeroed counters, and the last program
            # (per column block, interleaved) writes DW and DB; else those are placeholders
            # and the partials hold one row per program (per chunk, interleaved)
            Param("DW", "ptr"), Param("DB", "ptr"), Param("SYNC", "ptr", dtype="i32"),
            Param("atomic_dw", "i32")),
    configs=BWD_CONFIGS, rule=select_bwd_config,
)

# The grouped backward (kernels.py, layer_norm_bwd_grouped; rms_norm/spec.py's grouped
# backward with two sums a row and db): rows split over groups of programs, BLOCK_N columns
# each, every row read once. One config: the grid's programs must all be resident.
GROUPED_BLOCK_N = 2048  # the config's slice: the op's row-length check reads it
GROUPED_CONFIG = Config({"BLOCK_N": GROUPED_BLOCK_N, "SLOTS": 3, "PROGRAMS_PER_SM": 6,
                         "W_SHARED": 1}, num_warps=4, maxnreg=80)
MAX_GROUPED_SPLIT = 32  # programs a row: up to 65536 columns
# Row lengths that take it (the op also needs sm90, 2-byte data in the aligned class and
# torch's deterministic mode off): multiples of BLOCK_N over 8K, to 64K, the longest timed.
# From 16K first, where the other backwards ran under 60-80% of copy; from 10240 since an
# H100 read the plain backwards (the 16K bucket's tuned configs, none faster among the
# candidates) 14-18% slower than this one at 10240-14336 columns, RMSNorm, LayerNorm and
# the fused add alike, and level at 4K-8K (session 32, experiment_grouped_bwd_min_cols.py).
GROUPED_MIN_COLS = 8192 + GROUPED_BLOCK_N
GROUPED_MAX_COLS = MAX_GROUPED_SPLIT * GROUPED_BLOCK_N
GROUPED_ARCHS = ("sm90",)

BWD_GROUPED = KernelSpec(
    name="layer_norm_bwd_grouped", family="layer_norm", function="layer_norm_bwd_grouped",
    params=(Param("DX", "ptr"), Param("DW_SUM", "ptr", dtype="fp32"),
            Param("DB_SUM", "ptr", dtype="fp32"), Param("DW", "ptr"), Param("DB", "ptr"),
            Param("SYNC", "ptr", dtype="i32"), Param("WORDS", "ptr", dtype="i64"),
            Param("DY", "ptr"), Param("X", "ptr"), Param("W", "ptr"),
            Param("MEAN", "ptr", dtype="fp32"), Param("RSTD", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_dx", "i32", divisible=True), Param("stride_dy", "i32", divisible=True),
            Param("stride_x", "i32", divisible=True)),
    dtypes=("bf16", "fp16"), align_classes=("a16",), archs=GROUPED_ARCHS,
    configs=(GROUPED_CONFIG,), rule=lambda: GROUPED_CONFIG,
)

# The grouped forward (kernels.py, layer_norm_fwd_grouped): the grouped backward's layout
# for y. H200, bf16, 2^26 elements, CUDA graphs with the words' memset (benchmarks/
# experiment_norm_fwd_grouped.py; docs/perf-notes.md, sessions 17 and 22): 2-warp programs,
# 32 elements a thread, 10 an SM (a cap of 96 registers, 91 used, no spills) 83.5-84.2% of
# copy at 20K-64K columns, against 78.4-79.0% for 4-warp ones 9 an SM (56) and 82% for
# 4096-column slices on 4 warps 5 an SM (96); 9 (112) 82%, 11 (88) 67%, 1-warp programs 16
# an SM 51%. The looped forward's exact whole-row pass 1 (PASS1_BLOCK, tuned; session 21)
# reads whole buckets of 16K at 88.9% and 32K at 86.4-86.8% (64K 73.6), so rows of
# GROUPED_FWD_LOOPED_COLS stay looped, those between them grouped (session 17 at 20K: the
# looped 55%).
GROUPED_FWD_CONFIG = Config({"BLOCK_N": GROUPED_BLOCK_N, "SLOTS": 3, "PROGRAMS_PER_SM": 10},
                            num_warps=2, maxnreg=96)
GROUPED_FWD_MIN_COLS = 16384  # the backward's from 10240: not timed for the forward
GROUPED_FWD_LOOPED_COLS = (16384, 32768)

FWD_GROUPED = KernelSpec(
    name="layer_norm_fwd_grouped", family="layer_norm", function="layer_norm_fwd_grouped",
    params=(Param("Y", "ptr"), Param("MEAN", "ptr", dtype="fp32"),
            Param("RSTD", "ptr", dtype="fp32"), Param("WORDS", "ptr", dtype="i64"),
            Param("X", "ptr"), Param("W", "ptr"), Param("B", "ptr"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_y", "i32", divisible=True), Param("stride_x", "i32", divisible=True),
            Param("eps", "fp32"), Param("has_bias", "i32")),
    dtypes=("bf16", "fp16"), align_classes=("a16",), archs=GROUPED_ARCHS,
    configs=(GROUPED_FWD_CONFIG,), rule=lambda: GROUPED_FWD_CONFIG,
)

SPECS = (FWD, BWD, BWD_GROUPED, FWD_GROUPED)
