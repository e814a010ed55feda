"""Variant spec for RMSNorm (and the fused residual add + RMSNorm, which runs on the same
kernels through runtime flags): see kernels.py for the math."""
from ..spec import EXACT_KEY, Config, KernelSpec, Param

CASTING_MODES = {"llama": 0, "gemma": 1, "none": 2}

# Forward: whole-row configs (row held in registers), several rows per program for short
# rows so each program moves at least ~8 KB, one program per row block (PROGRAMS_PER_SM 0);
# one looped config for rows over 16K columns. The tuned table (kernel_src/tuned) may pick
# persistent forwards (PROGRAMS_PER_SM > 0, STAGES row blocks in flight), 32K-column whole
# rows on 32 warps and pipelined column loops.
def _fwd(m, n, w, loop=False, stages=1, per_sm=0):
    return Config({"BLOCK_M": m, "BLOCK_N": n, "LOOP": loop, "STAGES": stages,
                   "PROGRAMS_PER_SM": per_sm}, num_warps=w)


_WHOLE_ROW = tuple(_fwd(m, n, w) for m, n, w in (
    (16, 128, 4), (8, 256, 4), (4, 512, 4), (2, 1024, 4), (1, 2048, 4), (1, 4096, 8),
    (1, 8192, 16), (1, 16384, 16)))
_LOOPED = _fwd(1, 4096, 8, loop=True)
CONFIGS = _WHOLE_ROW + (_LOOPED,)

# Widest whole-row tiles that carry the fused residual path, forward (the residual) and
# backward (its gradient dres): kernels.py compiles it out of wider ones, which have no
# registers to spare (the 16K whole-row backward spills even without it: an H200 tune timed
# it 0.167 ms without the path, 0.181 ms with it). The rules send fused calls of rows over
# RESIDUAL_MAX_WHOLE_ROW to the looped config (8K on 16 warps: no spills on sm90, forward
# or backward); a tuned table may pick up to the MAX_BLOCK_N widths.
RESIDUAL_MAX_BLOCK_N = 16384
DRES_MAX_BLOCK_N = 8192
RESIDUAL_MAX_WHOLE_ROW = 8192


def select_config(n_cols: int, residual: bool = False) -> Config:
    if residual and n_cols > RESIDUAL_MAX_WHOLE_ROW:
        return _LOOPED
    for config in _WHOLE_ROW:
        if n_cols <= config.constexprs["BLOCK_N"]:
            return config
    return _LOOPED


# Backward: persistent programs (PROGRAMS_PER_SM per SM, each owning a run of rows and
# writing one fp32 dw partial) that hold the weight and a dw accumulator, so one row per step
# from 1K columns. Whole rows up to 8K keep 3 row blocks' loads in flight (STAGES): on an
# H200 that took 16384 x 4096 from 65% to 80% of copy, best with 2 programs per SM from 2K
# columns and 4 below (benchmarks/pipeline_experiment.py, docs/perf-notes.md).
# Looped rows (LOOP) come in two layouts. Persistent (CHUNK_ROWS 0): each program
# read-modify-writes its fp32 dw partial row in global memory once per column block and step;
# 4 rows a step make that a quarter of the traffic of one row a step ([4, 1024] on 8 warps is
# 16 elements a thread, 128 registers for sm90 without spills). Interleaved (CHUNK_ROWS > 0,
# PROGRAMS_PER_SM unused): chunks of CHUNK_ROWS rows, each with row programs for dx and then
# column programs of SUM_BLOCK_M x SUM_BLOCK_N tiles for dw that find the chunk in L2. An
# H200 ran 2048 x 32768 in 0.154 ms (8 warps, 8192-column blocks, 3 stages, 64-row chunks)
# against 0.213 for the best persistent config, and 1024 x 65536 in 0.170 against 0.234
# (benchmarks/experiment_norm_bwd_split.py); the rule takes it for rows over 16K.
SUM_BLOCK_M = 4
SUM_BLOCK_N = 1024


def _bwd(m, n, w, loop=False, stages=3, per_sm=2, chunk=0):
    return Config({"BLOCK_M": m, "BLOCK_N": n, "LOOP": loop, "STAGES": stages,
                   "PROGRAMS_PER_SM": 0 if chunk else per_sm, "CHUNK_ROWS": chunk},
                  num_warps=w)


_BWD_WHOLE_ROW = tuple(_bwd(m, n, w, per_sm=4 if n <= 2048 else 2) for m, n, w in (
    (8, 128, 4), (4, 256, 4), (2, 512, 4), (1, 1024, 4), (1, 2048, 4), (1, 4096, 8),
    (1, 8192, 16)))
_BWD_LOOPED = _bwd(4, 1024, 8, loop=True, stages=1)
_BWD_INTERLEAVED = _bwd(1, 8192, 8, loop=True, stages=3, chunk=64)
BWD_CONFIGS = _BWD_WHOLE_ROW + (_BWD_LOOPED, _BWD_INTERLEAVED)
INTERLEAVED_FROM = 16384  # rows longer than this take the interleaved layout by rule


def select_bwd_config(n_cols: int, dres: bool = False) -> Config:
    if n_cols > INTERLEAVED_FROM:
        return _BWD_INTERLEAVED
    if dres and n_cols > RESIDUAL_MAX_WHOLE_ROW:
        return _BWD_LOOPED
    for config in _BWD_WHOLE_ROW:
        if n_cols <= config.constexprs["BLOCK_N"]:
            return config
    return _BWD_LOOPED


FWD = KernelSpec(
    name="rms_norm_fwd", family="rms_norm", function="rms_norm_fwd",
    params=(Param("Y", "ptr"), Param("X", "ptr"), Param("W", "ptr"),
            Param("RSTD", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_y", "i64", divisible=True), Param("stride_x", "i64", divisible=True),
            Param("eps", "fp32"), Param("offset", "fp32"),
            # fused residual add (has_residual = 1): S = X + R; otherwise S, R are unused
            # placeholders (the op passes Y and X, so the alignment class is unchanged)
            Param("S", "ptr"), Param("R", "ptr"),
            Param("stride_s", "i64", divisible=True), Param("stride_r", "i64", divisible=True),
            Param("has_residual", "i32"),
            # 0: rstd is not written (the op's forward when no backward will read it)
            Param("store_stats", "i32")),
    options={"CASTING": (0, 1, 2)},
    configs=CONFIGS, rule=select_config,
    # PASS1_BLOCK, looped rows' pass-1 chunk: 0 (BLOCK_N) but in tuned configs; EXACT_KEY,
    # the row length compiled in (kernel_src/spec.py): 0 but in tuned configs
    constexpr_defaults={"PASS1_BLOCK": 0, EXACT_KEY: 0},
    staged=True,  # rms_norm_fwd_staged: plain forwards only, never the fused residual add
)

BWD = KernelSpec(
    name="rms_norm_bwd", family="rms_norm", function="rms_norm_bwd",
    params=(Param("DX", "ptr"), Param("DW_PARTIAL", "ptr", dtype="fp32"), Param("DY", "ptr"),
            Param("X", "ptr"), Param("W", "ptr"), Param("RSTD", "ptr", dtype="fp32"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_dx", "i64", divisible=True), Param("stride_dy", "i64", divisible=True),
            Param("stride_x", "i64", divisible=True),
            Param("offset", "fp32"), Param("rows_per_program", "i32"),
            # gradient of the residual output added to dx (has_dres = 1), else a placeholder
            Param("DRES", "ptr"), Param("stride_dres", "i64", divisible=True),
            Param("has_dres", "i32"),
            # atomic_dw = 1 (whole rows, interleaved): DW_PARTIAL is one zeroed fp32 row the
            # programs add into, SYNC zeroed counters, and the last program (per column
            # block, interleaved) writes DW; else DW and SYNC are placeholders and DW_PARTIAL
            # holds one partial row per program (per chunk, interleaved)
            Param("DW", "ptr"), Param("SYNC", "ptr", dtype="i32"), Param("atomic_dw", "i32")),
    options={"CASTING": (0, 1, 2)},
    configs=BWD_CONFIGS, rule=select_bwd_config,
)

# The grouped backward (kernels.py, rms_norm_bwd_grouped): rows split over groups of
# programs, BLOCK_N columns each, every row read once. Measured on an H200 (benchmarks/
# experiment_norm_bwd_staged.py, bf16, 2^26 elements, dx and dw; docs/perf-notes.md, session
# 14): 4-warp programs 8 an SM with 2048-column slices and 3 ring slots (24 KB; 64 registers,
# no spills) ran 16K / 32K / 64K columns at 85.0 / 84.9 / 84.8% of copy, the library's
# backwards 70 / 59 / 55%. One config: the grid's programs must all be resident.
GROUPED_BLOCK_N = 2048  # both configs' slice: the op's row-length check reads it
GROUPED_CONFIG = Config({"BLOCK_N": GROUPED_BLOCK_N, "SLOTS": 3, "PROGRAMS_PER_SM": 8,
                         "HAS_DRES": 0}, num_warps=4, maxnreg=64)
# The fused add's backward (dx += dres, read in pass 2 from global memory), 7 an SM at 72
# registers (no spills; at 64, 32 bytes): 89% of its 8-byte floor at 16K-64K, against 88% at
# 6 an SM with w in shared memory (session 15).
GROUPED_DRES_CONFIG = Config({"BLOCK_N": GROUPED_BLOCK_N, "SLOTS": 3, "PROGRAMS_PER_SM": 7,
                              "HAS_DRES": 1}, num_warps=4, maxnreg=72)
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
    name="rms_norm_bwd_grouped", family="rms_norm", function="rms_norm_bwd_grouped",
    params=(Param("DX", "ptr"), Param("DW_SUM", "ptr", dtype="fp32"), Param("DW", "ptr"),
            Param("SYNC", "ptr", dtype="i32"), Param("WORDS", "ptr", dtype="i64"),
            Param("DY", "ptr"), Param("X", "ptr"), Param("W", "ptr"),
            Param("RSTD", "ptr", dtype="fp32"), Param("n_rows", "i32"),
            Param("n_cols", "i32", divisible=True),
            Param("stride_dx", "i32", divisible=True), Param("stride_dy", "i32", divisible=True),
            Param("stride_x", "i32", divisible=True), Param("offset", "fp32"),
            Param("DRES", "ptr"), Param("stride_dres", "i32", divisible=True)),
    options={"CASTING": (0, 1, 2)},
    dtypes=("bf16", "fp16"), align_classes=("a16",), archs=GROUPED_ARCHS,
    configs=(GROUPED_CONFIG, GROUPED_DRES_CONFIG),
    rule=lambda has_dres: GROUPED_DRES_CONFIG if has_dres else GROUPED_CONFIG,
)

# The grouped forward (kernels.py, rms_norm_fwd_grouped): the grouped backward's layout for
# y (and the fused add's s). H200, bf16, 2^26 elements, CUDA graphs with the words' memset
# (benchmarks/experiment_norm_fwd_grouped.py; docs/perf-notes.md, session 17): RMSNorm at 10
# an SM (48 registers, no spills) 86% of copy from 16K to 64K columns, against the library's
# 87 / 70 / 76 / 85 / 80% at 16K / 20K / 24K / 32K / 64K; the fused add at 6 an SM (80
# registers) 91% from 32K, against 93 / 82 / 88 / 82% at 32K / 40K / 48K / 64K. So each takes
# rows from the first length where it was ahead: RMSNorm over 16K, the fused add over 32K.
# Since session 18 the looped forward's whole-row pass 1 (PASS1_BLOCK, tuned) reads a whole
# bucket's rows faster at 32K (87.5% against 85.6; 64K 83.7 against 85.2), and in session 19
# also the partial buckets between 16K and 32K (20K / 24K / 28K: 89.0 / 89.3 / 88.4% against
# the grouped 85.9 / 85.5 / 85.6), so plain RMSNorm rows go grouped only over 32K. Session
# 22, Llama casting: 2-warp programs 16 an SM (64 registers) 86.7-87.5% at 40K and 64K and
# 14 an SM (72) 87.1-87.2%, against 85.7-86.0% for 4-warp ones 10 an SM (48); both spill
# with Gemma casting (64 and 24 bytes), so 12 an SM (80, no spills in any mode; 86.8-87.1%).
# The fused add's 4-warp config stays (2 warps: 88.6-90.3% against 90.7-91.4%).
GROUPED_FWD_CONFIG = Config({"BLOCK_N": GROUPED_BLOCK_N, "SLOTS": 3, "PROGRAMS_PER_SM": 12,
                             "HAS_RESIDUAL": 0}, num_warps=2, maxnreg=80)
GROUPED_FWD_RES_CONFIG = Config({"BLOCK_N": GROUPED_BLOCK_N, "SLOTS": 3, "PROGRAMS_PER_SM": 6,
                                 "HAS_RESIDUAL": 1}, num_warps=4, maxnreg=80)
GROUPED_FWD_MIN_COLS = 32768 + GROUPED_BLOCK_N
GROUPED_FWD_RES_MIN_COLS = 32768 + GROUPED_BLOCK_N

FWD_GROUPED = KernelSpec(
    name="rms_norm_fwd_grouped", family="rms_norm", function="rms_norm_fwd_grouped",
    params=(Param("Y", "ptr"), Param("RSTD", "ptr", dtype="fp32"),
            Param("WORDS", "ptr", dtype="i64"), Param("X", "ptr"), Param("W", "ptr"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            Param("stride_y", "i32", divisible=True), Param("stride_x", "i32", divisible=True),
            Param("eps", "fp32"), Param("offset", "fp32"), Param("S", "ptr"), Param("R", "ptr"),
            Param("stride_s", "i32", divisible=True), Param("stride_r", "i32", divisible=True)),
    options={"CASTING": (0, 1, 2)},
    dtypes=("bf16", "fp16"), align_classes=("a16",), archs=GROUPED_ARCHS,
    configs=(GROUPED_FWD_CONFIG, GROUPED_FWD_RES_CONFIG),
    rule=lambda has_residual: GROUPED_FWD_RES_CONFIG if has_residual else GROUPED_FWD_CONFIG,
)

SPECS = (FWD, BWD, BWD_GROUPED, FWD_GROUPED)
