"""Variant spec for cross entropy: see kernels.py for the math. Also used by fused linear
cross entropy (liger_aot/ops/fused_linear_cross_entropy.py), which runs the same kernel in
place on chunks of logits."""
from ..spec import Config, KernelSpec, Param

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

SPECS = (FWD, SCALE)
