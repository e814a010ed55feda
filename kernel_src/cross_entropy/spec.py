"""Variant spec for cross entropy: see kernels.py for the math. Also used by fused linear
cross entropy (liger_aot/ops/fused_linear_cross_entropy.py), which runs the same kernel in
place on chunks of logits."""
from ..spec import Config, KernelSpec, Param, row_group_grid

# Bits of the kernel's runtime `flags` argument.
FLAG_GRAD = 1  # write the gradient to GRAD
FLAG_MEAN = 2  # scale the gradient by SCALES[0] (ce part) and SCALES[1] (z-loss part)
FLAG_WEIGHT = 4  # class weights in WEIGHT (fp32, length V), their sum in SCALES[2]
FLAG_SOFTCAP = 8  # x = softcap * tanh(x / softcap) before the softmax
FLAG_Z = 16  # store the per-row z-loss to ZLOSS
FLAG_ACCURACY = 32  # store 1.0 / 0.0 (argmax == target) to ACC
FLAG_TOKEN_SCALING = 64  # multiply the row's loss and gradient by its detached p_target
FLAG_ROW_SCALE = 128  # multiply the row's gradient by ROW_SCALE[row] (grad_output of "none")
# FLAG_WEIGHT, FLAG_SOFTCAP, FLAG_ACCURACY and FLAG_TOKEN_SCALING only act in the FEATURES=1
# variants (see kernels.py: their code costs registers, so the plain case compiles it out).
FULL_FEATURE_FLAGS = FLAG_WEIGHT | FLAG_SOFTCAP | FLAG_ACCURACY | FLAG_TOKEN_SCALING

# One row per program, streamed in BLOCK_V chunks. Measured on an H200 (bf16, JIT of this
# kernel; docs/perf-notes.md, "Cross-entropy, session 2"): loss only, one warp per row and 512
# columns a step (16 elements per thread; the per-chunk max is a warp shuffle, no shared
# memory or barrier) is fastest (8192 x 128256: 0.61 ms, 82% of copy); loss + gradient, four
# warps on 2048 columns are a little ahead (1.62 vs 1.66 ms at 128256, 0.40 vs 0.42 at 32000)
# and they are the only good choice with few rows (fused linear cross entropy's chunks),
# where one warp per row would leave most of the GPU idle.
ROW_CONFIG = Config({"BLOCK_V": 512}, num_warps=1)
WIDE_CONFIG = Config({"BLOCK_V": 2048}, num_warps=4)
CONFIGS = (ROW_CONFIG, WIDE_CONFIG)

# Below this many rows per multiprocessor a row gets four warps (when it is long enough).
WIDE_ROWS_PER_SM = 16


def select_config(n_rows: int, n_cols: int, sm_count: int, grad: bool = False) -> Config:
    if n_cols > 2048 and (grad or n_rows < WIDE_ROWS_PER_SM * sm_count):
        return WIDE_CONFIG
    return ROW_CONFIG


FWD = KernelSpec(
    name="cross_entropy_fwd", family="cross_entropy", function="cross_entropy_fwd",
    params=(Param("LOSS", "ptr", dtype="fp32"), Param("ZLOSS", "ptr", dtype="fp32"),
            Param("ACC", "ptr", dtype="fp32"), Param("GRAD", "ptr"), Param("LOGITS", "ptr"),
            Param("TARGET", "ptr", dtype="i64"), Param("WEIGHT", "ptr", dtype="fp32"),
            Param("SCALES", "ptr", dtype="fp32"), Param("ROW_SCALE", "ptr", dtype="fp32"),
            Param("n_cols", "i32", divisible=True),
            Param("stride_grad", "i64", divisible=True),
            Param("stride_logits", "i64", divisible=True),
            Param("ignore_index", "i64"), Param("label_smoothing", "fp32"),
            Param("lse_square_scale", "fp32"), Param("softcap", "fp32"),
            Param("flags", "i32")),
    options={"FEATURES": (0, 1)},
    configs=CONFIGS, rule=select_config,
)

# Backward's multiply by grad_output: torch's bf16 `grad.mul_(0-d fp32 tensor)` ran at ~1.1
# TB/s on an H200 (3.8 ms for a 8192 x 128256 gradient); a flat fp32 kernel is copy-bound.
# Programs stride over BLOCK-element tiles: SCALE_PROGRAMS_PER_SM per multiprocessor.
SCALE_CONFIG = Config({"BLOCK": 4096}, num_warps=8)
SCALE_PROGRAMS_PER_SM = 8

SCALE = KernelSpec(
    name="cross_entropy_scale", family="cross_entropy", function="scale_by_grad_output",
    params=(Param("OUT", "ptr"), Param("GRAD", "ptr"), Param("GRAD_OUTPUT", "ptr", dtype="fp32"),
            Param("n_elements", "i64"), Param("n_cols", "i32"), Param("per_row", "i32"),
            Param("in_place", "i32")),
    configs=(SCALE_CONFIG,), rule=lambda n_elements: SCALE_CONFIG,
)

# One-program kernels around the row kernels (kernels.py: reduction_scales before them,
# reduce_loss_rows after; ~24 us of torch kernels in a 1.11 ms step replaced). The op takes
# them for up to SMALL_MAX_ROWS rows: one program of 8 warps reads 64K int64 targets or fp32
# loss rows (512 KB / 256 KB) in a few microseconds, and many more rows would be better
# spread over the GPU, which torch's reductions do.
SMALL_CONFIG = Config({"BLOCK": 4096}, num_warps=8)
SMALL_MAX_ROWS = 65536

REDUCTION_SCALES = KernelSpec(
    name="cross_entropy_reduction_scales", family="cross_entropy", function="reduction_scales",
    params=(Param("SCALES", "ptr", dtype="fp32"), Param("TARGET", "ptr", dtype="i64"),
            Param("WEIGHT", "ptr", dtype="fp32"), Param("n_rows", "i32"),
            Param("n_classes", "i32"), Param("ignore_index", "i64")),
    dtypes=("fp32",), options={"WEIGHTED": (0, 1)},
    configs=(SMALL_CONFIG,), rule=lambda: SMALL_CONFIG,
)

# bits of reduce_loss_rows' flags
REDUCE_MEAN = 1
REDUCE_Z = 2
REDUCE_ACC = 4

REDUCE_ROWS = KernelSpec(
    name="cross_entropy_reduce_rows", family="cross_entropy", function="reduce_loss_rows",
    params=(Param("LOSS", "ptr", dtype="fp32"), Param("Z", "ptr", dtype="fp32"),
            Param("ACC", "ptr", dtype="fp32"), Param("LOSS_ROWS", "ptr", dtype="fp32"),
            Param("Z_ROWS", "ptr", dtype="fp32"), Param("ACC_ROWS", "ptr", dtype="fp32"),
            Param("SCALES", "ptr", dtype="fp32"), Param("n_rows", "i32"),
            Param("flags", "i32")),
    dtypes=("fp32",), configs=(SMALL_CONFIG,), rule=lambda: SMALL_CONFIG,
)

# The staged kernel (kernels.py, cross_entropy_fwd_staged): rows read once, in slices of
# CHUNKS x BLOCK_N columns held in shared memory by groups of programs. Measured on an H200
# (benchmarks/experiment_ce_staged.py, bf16, loss + gradient; docs/perf-notes.md, session 13):
# small programs many an SM won, because each program's chunk loop waits at a barrier per
# chunk (Gluon's, around the ring) and only other programs fill that time. Session 19: with
# the ring a whole slice (SLOTS = CHUNKS: constant slot indices, one refill address a row)
# and half the instructions a chunk, 4 warps, 10 an SM, 8 KB slices (8 x 1024 columns), 48
# registers (ptxas's cap, or it takes more): 8192 x 128256 in 1.08-1.09 ms (session 18's 11
# slots, 9 an SM: 1.18; cross_entropy_fwd 1.55), 8192 x 256000 in 2.18 (2.40); 9 and 12 an
# SM within 0.5%, 6 an SM with two slices of ring 8% slower. Session 22 (after the grouped
# norms gained on 2-warp programs): 2 warps, 12 an SM, 64 registers, 8192 x 128256 in
# 1.070-1.074 ms against 1.085-1.090 for 4 warps 10 an SM in the same process (8192 x 256000
# level, 2.165-2.172 against 2.167-2.172; 13 an SM at 72 level with 4 warps). One config: the
# grid's programs must all be resident (see kernels.py), which this one is on sm90 (12 x 17
# KB of 228 KB, 12 x 64 x 64 of 64K registers).
STAGED_CONFIG = Config({"BLOCK_N": 1024, "CHUNKS": 8, "SLOTS": 8, "PROGRAMS_PER_SM": 12},
                       num_warps=2, maxnreg=64)
STAGED_SLICE = STAGED_CONFIG.constexprs["CHUNKS"] * STAGED_CONFIG.constexprs["BLOCK_N"]
MAX_STAGED_SPLIT = 32  # programs a row: up to 262144 columns
# Row lengths that take the staged kernel (the op also needs sm90, 2-byte data in the aligned
# class, a gradient and no FEATURES=1 flag). Checked on the H200 from 65536 to 262144
# columns; timed at 128256 and 256000. From 65536 a row is 8 or more slices and each slice
# costs what it costs at 128256 (one exchange a slice); shorter rows stay on the two-pass
# kernel, where the staged layout was not timed with this config.
STAGED_MIN_COLS = 65536
STAGED_MAX_COLS = MAX_STAGED_SPLIT * STAGED_SLICE
STAGED_ARCHS = ("sm90",)
STAGED_FLAGS = FLAG_GRAD | FLAG_MEAN | FLAG_Z | FLAG_ROW_SCALE  # what the staged kernel reads


def staged_split(n_cols: int, config: Config = STAGED_CONFIG) -> int:
    """Programs a row of the staged kernel on `config`."""
    return -(-n_cols // (config.constexprs["CHUNKS"] * config.constexprs["BLOCK_N"]))


def staged_grid(n_rows: int, n_cols: int, sm_count: int,
                config: Config = STAGED_CONFIG) -> tuple:
    """(programs a row, programs) of the staged kernel (see row_group_grid)."""
    return row_group_grid(n_rows, staged_split(n_cols, config), sm_count, config)


STAGED = KernelSpec(
    name="cross_entropy_fwd_staged", family="cross_entropy",
    function="cross_entropy_fwd_staged",
    params=(Param("LOSS", "ptr", dtype="fp32"), Param("ZLOSS", "ptr", dtype="fp32"),
            Param("GRAD", "ptr"), Param("LOGITS", "ptr"), Param("TARGET", "ptr", dtype="i64"),
            Param("SCALES", "ptr", dtype="fp32"), Param("ROW_SCALE", "ptr", dtype="fp32"),
            Param("STATS", "ptr", dtype="i64"),
            Param("n_rows", "i32"), Param("n_cols", "i32", divisible=True),
            # 32-bit strides and ignore_index (the op checks that they fit): with 64-bit ones
            # the sm90 SASS of STAGED_CONFIG has 3160 instructions against 2888, and the
            # kernel ran 1.258 against 1.173 ms in the op (H200, 8192 x 128256, session 14)
            Param("stride_grad", "i32", divisible=True),
            Param("stride_logits", "i32", divisible=True),
            Param("ignore_index", "i32"), Param("label_smoothing", "fp32"),
            Param("lse_square_scale", "fp32"), Param("flags", "i32")),
    dtypes=("bf16", "fp16"), align_classes=("a16",), archs=STAGED_ARCHS,
    configs=(STAGED_CONFIG,), rule=lambda: STAGED_CONFIG,
)

SPECS = (FWD, SCALE, STAGED, REDUCTION_SCALES, REDUCE_ROWS)
