"""Helpers shared by the ops: argument checks with messages that name the argument."""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from liger_aot.kernel_src.spec import next_power_of_2

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def graph_retained() -> bool:
    """Whether the running backward keeps the graph (retain_graph / create_graph): then saved
    tensors must survive it. True when it cannot be told (the safe answer)."""
    try:
        return bool(torch._C._autograd._get_current_graph_task_keep_graph())
    except (AttributeError, RuntimeError):
        return True


def liger_chunk_rows(n_rows: int, hidden: int, vocab: int) -> int:
    """Tokens per chunk of a fused linear loss so a chunk's logits take about as much memory
    as the input: the power of two >= n_rows / ceil(vocab / hidden) (Liger-Kernel's choice)."""
    inc = max(1, -(-vocab // max(hidden, 1)))
    return next_power_of_2(max(1, -(-n_rows // inc)))


def check_float(name: str, t: torch.Tensor):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")


def check_same_device(**tensors):
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"tensors must be on one device, got {listing}")


def rows_view(name: str, t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """A 2-D (rows, n_cols) view whose last dim is contiguous; copies only when needed."""
    if t.shape[-1] != n_cols:
        raise ValueError(f"{name} must have last dimension {n_cols}, got shape {tuple(t.shape)}")
    if n_cols == 0:  # reshape(-1, 0) is ambiguous
        return t.new_empty((math.prod(t.shape[:-1]), 0))
    t2 = t.reshape(-1, n_cols)
    if n_cols > 1 and t2.stride(1) != 1:
        t2 = t2.contiguous()
    return t2


def row_stride(t2: torch.Tensor) -> int:
    return t2.stride(0) if t2.shape[0] > 1 else t2.shape[1]


def backward_follows(*tensors) -> bool:
    """Whether autograd will record a call on these tensors (None ignored): grad mode on and
    one of them requiring grad. Where it will not, a forward need not keep what only its
    backward reads (the norms' row statistics)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


_unused_stats = {}  # device -> a 16-byte fp32 tensor


def unused_stats(device: torch.device) -> torch.Tensor:
    """The statistics pointer of a norm forward launched with store_stats 0: an fp32 tensor
    the kernel never reads or writes (aligned, so the launch keeps its alignment class)."""
    t = _unused_stats.get(device)
    if t is None:
        t = _unused_stats[device] = torch.empty(4, dtype=torch.float32, device=device)
    return t


def block_grid(rows: int, device_index: int, config) -> tuple:
    """Grid of a kernel whose programs stride over blocks of BLOCK_M rows: one program per
    block, or with the config's PROGRAMS_PER_SM k > 0 at most k per SM (persistent)."""
    blocks = (rows + config.constexprs["BLOCK_M"] - 1) // config.constexprs["BLOCK_M"]
    per_sm = config.constexprs["PROGRAMS_PER_SM"]
    if per_sm:
        blocks = min(blocks, per_sm * multiprocessor_count(device_index))
    return (blocks,)


def persistent_grid(rows: int, device_index: int, per_sm: int = 4, split: int = 1) -> tuple:
    """(programs, rows_per_program) for a persistent grid of about per_sm programs per SM in
    all, `split` of them per row (e.g. one per column block); programs is 0 when rows is 0."""
    if rows == 0:
        return 0, 1
    target = max(1, (per_sm * multiprocessor_count(device_index) + split - 1) // split)
    programs = min(rows, target)
    rows_per_program = (rows + programs - 1) // programs
    return (rows + rows_per_program - 1) // rows_per_program, rows_per_program


class NormBackwardGrid(NamedTuple):
    programs: int
    rows_per_program: int
    partial_rows: int  # rows of the fp32 partial buffers (deterministic weight gradients)
    counters: int  # arrival counters of the atomic weight gradients


def norm_backward_grid(rows: int, n: int, device_index: int, config,
                       sum_block_n: int) -> NormBackwardGrid:
    """The launch of a norm backward (rms_norm / layer_norm kernels.py). Persistent layouts:
    about PROGRAMS_PER_SM programs per SM, each with a run of rows and a partial row of its
    own; one arrival counter. Interleaved (CHUNK_ROWS > 0): per chunk of CHUNK_ROWS rows,
    CHUNK_ROWS // BLOCK_M row programs and one column program per sum_block_n columns (the
    family's SUM_BLOCK_N); a partial row per chunk, a counter per column block."""
    chunk = config.constexprs["CHUNK_ROWS"]
    if not chunk:
        programs, rows_per_program = persistent_grid(rows, device_index,
                                                     config.constexprs["PROGRAMS_PER_SM"])
        return NormBackwardGrid(programs, rows_per_program, programs, 1)
    chunks = (rows + chunk - 1) // chunk
    column_blocks = (n + sum_block_n - 1) // sum_block_n
    per_chunk = chunk // config.constexprs["BLOCK_M"] + column_blocks
    return NormBackwardGrid(chunks * per_chunk, chunk, chunks, column_blocks)


def atomic_weight_grad(config) -> bool:
    """Whether a norm backward with this config sums its weight (and bias) gradients with
    atomic adds in the kernel (rms_norm / layer_norm kernels.py: one launch instead of a
    partial buffer, a reduction and a cast): whole-row and interleaved configs (the
    persistent looped layout keeps a private partial row per program), and never in torch's
    deterministic mode, as the order of those sums varies from run to run (PyTorch's own
    convention for atomic reductions)."""
    return (not config.constexprs["LOOP"] or config.constexprs["CHUNK_ROWS"] > 0) \
        and not torch.are_deterministic_algorithms_enabled()


def accumulators(count: int, n: int, device, counters: int = 1) -> tuple:
    """`count` zeroed fp32 rows of n and `counters` zeroed int32 counters, from one
    allocation (one memset): ((rows...), counters). Each starts 16-byte aligned, so the
    kernel keeps its aligned variant."""
    n_pad = (n + 3) // 4 * 4
    buf = torch.zeros(count * n_pad + (counters + 3) // 4 * 4, dtype=torch.float32,
                      device=device)
    rows = tuple(buf[i * n_pad:i * n_pad + n] for i in range(count))
    return rows, buf[count * n_pad:count * n_pad + counters].view(torch.int32)


def weight_grad_buffers(config, rows: int, n: int, grid: NormBackwardGrid, count: int, dtype,
                        device, placeholder: torch.Tensor) -> tuple:
    """A norm backward's buffers for its `count` column-sum gradients (dw, and db), as
    (sums, outputs, counter, atomic flag). Atomic (atomic_weight_grad, with something to
    compute): zeroed fp32 rows and the grid's counters (accumulators) that the kernel adds
    into, and the (n,) outputs of `dtype` its last programs write. Else fp32 partial buffers
    of the grid's partial rows, for the caller to sum; `placeholder` then stands in for the
    outputs and the partials for the counter (neither is touched)."""
    if rows and n and atomic_weight_grad(config):
        sums, sync = accumulators(count, n, device, grid.counters)
        outputs = tuple(torch.empty(n, dtype=dtype, device=device) for _ in range(count))
        return sums, outputs, sync, 1
    partials = tuple(torch.empty((grid.partial_rows, n), dtype=torch.float32, device=device)
                     for _ in range(count))
    return partials, (placeholder,) * count, partials[0], 0


def device_runs(cache: dict, device_index: int, archs, enabled) -> bool:
    """Whether the GPU `device_index` takes a kernel built only for `archs` (e.g. the staged
    cross-entropy): its arch is one of them and the kernel's switch `enabled()` (an env
    reader) is on. Cached per device in `cache`."""
    runs = cache.get(device_index)
    if runs is None:
        from liger_aot.runtime.device import device_arch

        runs = cache[device_index] = enabled() and device_arch(device_index)[0] in archs
    return runs


def aligned16(tensors, ints) -> bool:
    """Every pointer 16-byte aligned and every int a multiple of 16: the aligned class
    ("a16"), which the Gluon kernels' 16-byte copies need."""
    bits = 0
    for t in tensors:
        bits |= t.data_ptr()
    for n in ints:
        bits |= n
    return not bits & 15


_GROUPED_DTYPES = (torch.bfloat16, torch.float16)


def grouped_backward_applies(kernel_spec, cache: dict, enabled, s2, dy2, params,
                             more_rows=()) -> bool:
    """Whether a grouped norm backward (rms_norm_bwd_grouped, layer_norm_bwd_grouped: each
    row read once; `kernel_spec` the family's spec module, its GROUPED_* names) takes a
    backward of rows s2 and gradient dy2 (and the row tensors `more_rows` of their shape:
    the fused add's residual gradient) with the 1-D fp32 or weight tensors `params`: rows
    from GROUPED_MIN_COLS (grouped_layout_applies), and torch's deterministic mode off (its
    weight-gradient sums are atomic adds)."""
    return grouped_layout_applies(kernel_spec, kernel_spec.GROUPED_MIN_COLS, cache, enabled,
                                  (s2, dy2) + tuple(more_rows), params) \
        and not torch.are_deterministic_algorithms_enabled()


def grouped_layout_applies(kernel_spec, min_cols: int, cache: dict, enabled, row_tensors,
                           params, excluded_cols=()) -> bool:
    """Whether a grouped norm kernel (kernel_spec: the family's spec module, its GROUPED_*
    names) takes the row tensors `row_tensors` (first: the normalized rows) with the 1-D
    fp32 or weight tensors `params`: a GPU whose arch it is built for (cached in `cache`;
    `enabled` the env switch), 2-byte data of one dtype, rows of a multiple of its slice
    (GROUPED_BLOCK_N) from `min_cols` to GROUPED_MAX_COLS but those in `excluded_cols`, and
    the aligned class (16-byte pointers, 32-bit strides a multiple of 16). The row length,
    which refuses the models' usual rows, is checked first: this runs every call."""
    rows, n = row_tensors[0].shape
    if not (min_cols <= n <= kernel_spec.GROUPED_MAX_COLS
            and n % kernel_spec.GROUPED_BLOCK_N == 0) or n in excluded_cols:
        return False
    dtype = row_tensors[0].dtype
    if dtype not in _GROUPED_DTYPES or rows == 0 or any(t.dtype != dtype for t in row_tensors):
        return False
    if any(p.dtype not in (dtype, torch.float32) for p in params):
        return False
    device = row_tensors[0].get_device()
    if device < 0 or not device_runs(cache, device, kernel_spec.GROUPED_ARCHS, enabled):
        return False
    strides = tuple(row_stride(t) for t in row_tensors)
    return max(strides) < 2**31 and aligned16(tuple(row_tensors) + tuple(params), strides)


def grouped_backward_buffers(rows: int, n: int, split: int, sums: int, device) -> tuple:
    """A grouped norm backward's zeroed scratch from one allocation (one memset): `sums`
    fp32 rows of n (its column sums: dw, or dw and db), the slices' `split` int32 counters,
    and one int64 word a (row, part) (its shares of the row: kernel_src/staged_rows.py); each
    part 16-byte aligned. Returns ((rows...), counters, words)."""
    row_words = (n + 3) // 4 * 2  # int64 elements a 16-byte aligned fp32 row takes
    sync_at = sums * row_words
    words_at = sync_at + (split + 3) // 4 * 2
    buf = torch.zeros(words_at + rows * split, dtype=torch.int64, device=device)
    sum_rows = tuple(buf[i * row_words:(i + 1) * row_words].view(torch.float32)[:n]
                     for i in range(sums))
    return sum_rows, buf[sync_at:words_at].view(torch.int32)[:split], buf[words_at:]


@functools.lru_cache(maxsize=None)
def multiprocessor_count(device_index: int) -> int:
    if device_index < 0:
        return 4  # interpreter: a few programs are enough to exercise the partial sums
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def check_same_dtype(**tensors):
    dtypes = {name: t.dtype for name, t in tensors.items() if t is not None}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{n} is {d}" for n, d in dtypes.items())
        raise TypeError(f"tensors must have one dtype, got {listing}")


def check_same_shape(**tensors):
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if t is not None}
    if len(set(shapes.values())) > 1:
        listing = ", ".join(f"{n} {s}" for n, s in shapes.items())
        raise ValueError(f"tensors must have one shape, got {listing}")


def param_vector(name: str, t, x: torch.Tensor, n: int, of: str = "x's last dimension",
                 optional: bool = False):
    """A per-column parameter (a norm's weight or bias, DyT's gamma or beta) as the kernels
    read it: checked (floating point, on x's device, shape (n,)) and returned in x's dtype,
    contiguous; autograd casts its gradient back to t's dtype. An optional one may be None."""
    if t is None and optional:
        return None
    check_float(name, t)
    check_same_device(x=x, **{name: t})
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) to match {of}, got {tuple(t.shape)}")
    if t.dtype != x.dtype:
        t = t.to(x.dtype)
    return t if t.is_contiguous() else t.contiguous()


def check_tensor(name: str, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t itself when its last dim has stride 1 (or size <= 1), else a contiguous copy."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        return t.contiguous()
    return t
