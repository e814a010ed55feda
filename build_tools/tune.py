"""`liger-aot tune --arch ARCH`: measure candidate configs of the size-dependent kernels on a
GPU of that arch and write the tuned table kernel_src/tuned/<arch>.json, which the build of
that arch compiles and the runtime picks from (kernel_src/tuning.py).

For each spec in CASES and each of its representative shapes (one per size bucket): the
heuristic rule's config and the case's candidates (configs valid for every row length of the
bucket) run once through Triton JIT of the kernel source and are checked against a torch
reference (a failing or wrong candidate is dropped), then timed (triton.testing.do_bench,
median). Cases with also_rows time every candidate at those row counts too and score it by
its mean time relative to the best at each shape. The heuristic config stays unless the
best is more than KEEP_WITHIN faster (better scored).
Measured in bf16; the choice serves data of bf16's element size (bf16, fp16), other dtypes
take the rule (kernel_src/tuning.py select).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from liger_aot.kernel_src import tuning
from liger_aot.kernel_src.layer_norm import spec as layer_norm
from liger_aot.kernel_src.rms_norm import spec as rms_norm
from liger_aot.kernel_src.softmax import spec as softmax
from liger_aot.kernel_src.spec import (EXACT_KEY, HOLD_KEY, Config, KernelSpec, exact_length,
                                       inexact_twin, next_power_of_2, staged_twin)
from liger_aot.kernel_src.swiglu import spec as swiglu
from liger_aot.ops._common import (accumulators, atomic_weight_grad, block_grid,
                                   multiprocessor_count, norm_backward_grid)

KEEP_WITHIN = 0.02  # keep the heuristic config unless the best is more than 2% faster
TOLERANCE = 2e-2  # relative error (norm) against the fp32 torch reference
EPS = 1e-6
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


# -- candidates: configs a kernel supports for every row of at most `bucket` columns -------

def row_configs(bucket: int, flag: bool = False, *, max_tile: int, whole_row_max: int,
                flag_whole_row_max: int | None = None, loop_from: int, loop_rows=(1,),
                loop_max_tile: int = 0, loop_warps=(8, 16), loop_blocks=(4096, 8192, 16384),
                loop_pass1: int = 0, launches=None, whole_row_warps=None, pass1_rows=(1,),
                exact_pass1: bool = False, hold_pass1: bool = False):
    """Configs of a row kernel with BLOCK_M, BLOCK_N and LOOP constexprs: whole-row tiles
    (BLOCK_N == bucket, BLOCK_M rows, at most max_tile elements) for buckets up to
    whole_row_max (flag_whole_row_max when the rule's flag is set: kernels that compile the
    flag's path out of wider tiles), looped rows for buckets from loop_from (see
    _looped_tiles; loop_rows: the BLOCK_M values a kernel's loop takes, loop_warps and
    loop_blocks the warp counts and BLOCK_N of one row a step); 8-32 elements per thread.
    loop_pass1 > 0: looped rows also with pass 1 over the whole bucket in one chunk
    (PASS1_BLOCK, the norm forwards; not with the flag, the fused residual, which keeps
    BLOCK_N chunks), each count of rows a program in pass1_rows (beyond 1, pass 2 reads w
    and b once for them all), where that is at most loop_pass1 elements a thread. Kernels with
    launch-shape constexprs (STAGES, PROGRAMS_PER_SM, ...) take each dict of them that
    `launches(tile, loop)` yields. whole_row_warps: the warp counts of whole-row tiles (default
    4-16, and 32 with launches); tiles on fewer than 4 warps take up to 64 elements a thread,
    and only the launch of one program a row block (a few such programs an SM could not keep
    its memory busy). exact_pass1: each whole-row pass-1 config also with the bucket's length
    compiled in (EXACT_KEY; the tuned shapes' rows are that long). hold_pass1: each such exact
    config's rows and warps, and one warp, also with pass 2 from the row pass 1 loaded
    (HOLD_KEY; BLOCK_N unused, so once for each) where the row fits the registers."""
    def shaped(constexprs, warps):
        if launches is None:
            yield Config(constexprs, num_warps=warps)
            return
        for launch in launches(constexprs["BLOCK_M"] * constexprs["BLOCK_N"],
                               constexprs["LOOP"]):
            if warps < 4 and launch.get("PROGRAMS_PER_SM", 0) != 0:
                continue
            yield Config({**constexprs, **launch}, num_warps=warps)

    warp_counts = whole_row_warps or ((4, 8, 16) if launches is None else (4, 8, 16, 32))
    if bucket <= (flag_whole_row_max if flag and flag_whole_row_max else whole_row_max):
        for block_m in (1, 2, 4, 8, 16):
            tile = block_m * bucket
            if tile > max_tile:
                break
            for warps in warp_counts:
                # up to 64 elements a thread on 1-2 warps: a 2K row on one warp
                if 8 <= tile // (32 * warps) <= (64 if warps < 4 else 32):
                    yield from shaped({"BLOCK_M": block_m, "BLOCK_N": bucket, "LOOP": False},
                                      warps)
    if bucket >= loop_from:
        for block_m, block_n, warps in _looped_tiles(bucket, loop_rows, loop_max_tile,
                                                     loop_warps, loop_blocks):
            yield from shaped({"BLOCK_M": block_m, "BLOCK_N": block_n, "LOOP": True}, warps)
        for rows in (() if flag else pass1_rows):  # PASS1_BLOCK = the bucket
            for block_n in loop_blocks:
                for warps in loop_warps:
                    if (block_n < bucket and 8 <= rows * block_n // (32 * warps) <= 32
                            and rows * bucket // (32 * warps) <= loop_pass1):
                        for exact in ((0, 1) if exact_pass1 else (0,)):
                            yield from shaped({"BLOCK_M": rows, "BLOCK_N": block_n,
                                               "LOOP": True, "PASS1_BLOCK": bucket,
                                               **({EXACT_KEY: 1} if exact else {})}, warps)
        # held rows: once for each rows and warps (BLOCK_N is unused: the first that would
        # serve), also on one warp (torch.compile's 1K forward: a row's sums in warp
        # shuffles alone); no loop left for STAGES to pipeline, so 1 only
        for rows in (pass1_rows if exact_pass1 and hold_pass1 and not flag else ()):
            for warps in (1, *loop_warps):
                block_n = next((b for b in loop_blocks
                                if b < bucket and 8 <= rows * b // (32 * warps) <= 32), 0)
                if (block_n and rows * bucket // (32 * warps) <= loop_pass1
                        and _row_fits_registers(rows * bucket, warps)):
                    yield from (c for c in shaped(
                        {"BLOCK_M": rows, "BLOCK_N": block_n, "LOOP": True,
                         "PASS1_BLOCK": bucket, EXACT_KEY: 1, HOLD_KEY: 1}, warps)
                        if c.constexprs.get("STAGES", 1) == 1)


def _row_fits_registers(tile: int, warps: int) -> bool:
    """Whether a held tile of `tile` elements (HOLD_KEY) fits a thread's registers: about two
    a column (sm90 ptxas: 64 a thread at 32 columns, 128 at 64), within the 64K-register file
    shared by the program's threads and 255 a thread. At 64 columns on 32 warps LayerNorm's
    spilled 192-200 bytes."""
    per_thread = tile // (32 * warps)
    return 2 * per_thread <= min(255, 65536 // (32 * warps))


def _looped_tiles(bucket: int, loop_rows, loop_max_tile: int, loop_warps, loop_blocks):
    """(BLOCK_M, BLOCK_N, warps) of looped rows shorter than the bucket: one row of
    loop_blocks columns on loop_warps warps at 8-32 elements a thread; several rows (loop_rows
    beyond 1) in tiles of at most loop_max_tile elements at 16 a thread (on sm90, pass 2 of
    the norm backwards needs 160-200 registers a thread at 32, and LayerNorm's spills at
    8)."""
    for block_n in loop_blocks:
        for warps in loop_warps:
            if block_n < bucket and 8 <= block_n // (32 * warps) <= 32:
                yield 1, block_n, warps
    for block_m in loop_rows:
        if block_m == 1:
            continue
        for block_n in (1024, 2048, 4096):
            warps = block_m * block_n // (32 * 16)
            if block_n < bucket and block_m * block_n <= loop_max_tile and warps in (8, 16):
                yield block_m, block_n, warps


def _launch(stages: int, per_sm: int) -> dict:
    return {"STAGES": stages, "PROGRAMS_PER_SM": per_sm}


def forward_launches(tile: int, loop: bool):
    """Launch shapes (STAGES, PROGRAMS_PER_SM) of a norm forward: one program per row block,
    and persistent programs with row blocks in flight as far as shared memory holds them
    (bf16 x: 2 bytes a tile element per stage, 227 KB an SM); looped rows pipeline columns."""
    if loop:
        shapes = ((1, 0), (3, 0))
    elif tile <= 8192:
        shapes = ((1, 0), (3, 2), (3, 4))
    elif tile <= 16384:
        shapes = ((1, 0), (3, 1), (2, 2))
    else:
        shapes = ((1, 0), (2, 1))
    for stages, per_sm in shapes:
        yield _launch(stages, per_sm)


# Staged forwards (kernel_src/staged_rows.py): shared memory an sm90 program may take (227 KB
# a block, less the reductions' scratch) for the ring and the staged weights.
STAGED_SHARED_BYTES = 224 * 1024
STAGED_FROM = 16384


def staged_forward_configs(bucket: int, flag: bool = False, *, weight_rows: int):
    """Staged configs of a norm forward (2-byte data; weight_rows: w, or w and b): one
    persistent program an SM, chunks of 4096-16384 columns at 8 or 16 elements a thread (at
    most 32 warps), a ring of as many chunks as shared memory holds up to three rows, the
    weights staged in shared memory where they fit beside the ring's row and loaded a chunk
    ahead otherwise. From STAGED_FROM columns (below it the whole-row forwards read x once
    already), plain forwards only (the staged kernel has no fused residual: the flag)."""
    if flag or bucket < STAGED_FROM:
        return
    for w_shared in (1, 0):
        free = STAGED_SHARED_BYTES - w_shared * weight_rows * bucket * 2
        for block_n in (4096, 8192, 16384):
            chunks = bucket // block_n
            slots = min(free // (block_n * 2), 3 * chunks)
            if chunks < 2 or slots < chunks:
                continue
            for warps in (block_n // 512, block_n // 256):
                if warps <= 32:
                    yield Config({"BLOCK_M": 1, "BLOCK_N": block_n, "LOOP": True,
                                  "STAGES": slots, "PROGRAMS_PER_SM": 1, "STAGED": chunks,
                                  "W_SHARED": w_shared}, num_warps=warps)


def _with_staged(case, weight_rows: int):
    """A forward case whose candidates also include the staged configs."""
    rows_candidates = case.candidates

    def candidates(bucket, flag=False):
        yield from rows_candidates(bucket, flag)
        yield from staged_forward_configs(bucket, flag, weight_rows=weight_rows)
    return dataclasses.replace(case, candidates=candidates)


# Interleaved looped backwards (CHUNK_ROWS > 0): an H200 sweep of one RMSNorm row a step put
# 64-row chunks first at 32K and 64K columns, 128 within 3%, 32 behind by 10-20%
# (benchmarks/experiment_norm_bwd_split.py); 3 stages won on 8 warps, 1 on 16. In session 11,
# 4 stages of 4096 columns (RMSNorm: 72 KB of shared memory and 54 registers on 8 warps, 3
# programs an SM) won the fused add at 32K-64K, RMSNorm at 32K and LayerNorm at 16K-32K; 2
# stages won nowhere.
_INTERLEAVED_LAUNCHES = ((3, 64), (1, 64), (3, 128), (2, 64), (4, 64))


def backward_launches(tile: int, loop: bool):
    """Launch shapes of a norm backward: persistent (STAGES, PROGRAMS_PER_SM; two tensors, x
    and dy, a stage) and, for looped rows, interleaved (STAGES, CHUNK_ROWS). Looped tiles
    over 4096 elements skip 4 programs an SM and 3 stages at 2 an SM: such programs are not
    resident together on an sm90 SM (ptxas: 64-250 registers a thread at 256-512 threads;
    at 3 stages 104-240 KB of shared memory and 80-125 registers)."""
    if loop:
        wide = tile > 4096
        shapes = ((1, 2), (3, 1)) if wide else ((1, 2), (1, 4), (3, 1), (3, 2))
        for stages, chunk in _INTERLEAVED_LAUNCHES:
            # 4 stages of a 16K-element tile (x and dy, 256 KB) pass the SM's shared memory
            if stages < 4 or tile <= 8192:
                yield {**_launch(stages, 0), "CHUNK_ROWS": chunk}
    else:
        shapes = ((1, 4), (3, 1), (3, 2)) + (((3, 4),) if tile <= 4096 else ())
        if tile > 8192:
            # 3 stages of a 16K-element tile (x and dy) pass the SM's shared memory; 2 fit
            shapes += ((2, 1),)
    for stages, per_sm in shapes:
        yield {**_launch(stages, per_sm), "CHUNK_ROWS": 0}


def tile_configs(bucket: int, flag: bool = False):
    """BLOCK_M x BLOCK_N tiles of 2048 or 4096 elements for the 2-D grid of the gated
    activations (the grid covers any row length); 1024-4096 columns, up to the bucket."""
    for block_n in (1024, 2048, 4096):
        if block_n > max(bucket, 1024):
            break
        for tile, warps in ((2048, 4), (4096, 4), (4096, 8)):
            if tile >= block_n:
                yield Config({"BLOCK_M": tile // block_n, "BLOCK_N": block_n}, num_warps=warps)


def _rows(n: int) -> int:
    """Rows of a representative shape: 16384 (tokens of a training step), at most 64M
    elements. The norm backwards are also timed at suite_rows(n) (more rows for n < 4096)."""
    return min(16384, 2**26 // n)


def _shapes(ns, flag_ns=None):
    """(rows, n) per n; with flag_ns (a rule with a flag), (rows, n, False) per n and
    (rows, n, True) per n of flag_ns."""
    if flag_ns is None:
        return tuple((_rows(n), n) for n in ns)
    return tuple((_rows(n), n, False) for n in ns) + tuple((_rows(n), n, True) for n in flag_ns)


# -- inputs and fp32 references (one factory per family serves its forward and backward) ---

def _randn(*shape, dtype, device, scale=1.0, shift=0.0):
    return (torch.randn(*shape, dtype=torch.float32, device=device) * scale + shift).to(dtype)


def rms_norm_inputs(rows, n, flag, dtype, device):
    """flag: the fused residual add (forward) / the residual gradient (backward)."""
    x = _randn(rows, n, dtype=dtype, device=device)
    w = _randn(n, dtype=dtype, device=device, scale=0.1, shift=1.0)
    t = {"x": x, "w": w, "y": torch.empty_like(x),
         "rstd": torch.empty(rows, dtype=torch.float32, device=device)}
    s = x
    if flag:
        t["r"] = _randn(rows, n, dtype=dtype, device=device)
        s = (x.float() + t["r"].float()).to(dtype)
        t["s"], t["s_ref"] = torch.empty_like(x), s
        t["dres"] = _randn(rows, n, dtype=dtype, device=device)
    sf, wf = s.float().requires_grad_(), w.float().requires_grad_()
    rstd = torch.rsqrt(sf.pow(2).mean(-1) + EPS)
    y = sf * rstd[:, None] * wf
    dy = _randn(rows, n, dtype=dtype, device=device)
    y.backward(dy.float())
    t.update(y_ref=y.detach(), rstd_ref=rstd.detach(), s_in=s, dy=dy,
             dx=torch.empty_like(x), dx_ref=sf.grad + (t["dres"].float() if flag else 0),
             dw_ref=wf.grad)
    return t


def layer_norm_inputs(rows, n, flag, dtype, device):
    x = _randn(rows, n, dtype=dtype, device=device)
    w = _randn(n, dtype=dtype, device=device, scale=0.1, shift=1.0)
    b = _randn(n, dtype=dtype, device=device, scale=0.1)
    xf, wf, bf = (v.float().requires_grad_() for v in (x, w, b))
    mean = xf.mean(-1)
    rstd = torch.rsqrt(xf.var(-1, unbiased=False) + EPS)
    y = (xf - mean[:, None]) * rstd[:, None] * wf + bf
    dy = _randn(rows, n, dtype=dtype, device=device)
    y.backward(dy.float())
    stats = lambda: torch.empty(rows, dtype=torch.float32, device=device)  # noqa: E731
    return {"x": x, "w": w, "b": b, "y": torch.empty_like(x), "mean": stats(),
            "rstd": stats(), "y_ref": y.detach(), "mean_ref": mean.detach(),
            "rstd_ref": rstd.detach(), "dy": dy, "dx": torch.empty_like(x),
            "dx_ref": xf.grad, "dw_ref": wf.grad, "db_ref": bf.grad}


def norm_backward_buffers(t, config, sum_block_n):
    """A norm backward's grid for the config (norm_backward_grid) and its weight-gradient
    outputs, as the op has them (atomic_weight_grad): for whole rows the dw (db) tensors the
    kernel's last program writes, else fp32 partial buffers of one row per program (per
    chunk, interleaved), kept per row count (the check sums them)."""
    x = t["dy"]
    rows, n = x.shape
    t["grid"] = grid = norm_backward_grid(rows, n, x.get_device(), config, sum_block_n)
    t["atomic"] = atomic_weight_grad(config)
    kept = t.setdefault("partials", {})
    for name in ("dw", "db"):
        if name + "_ref" in t:
            key = (name, 0 if t["atomic"] else grid.partial_rows)
            if key not in kept:
                shape = (n,) if t["atomic"] else (grid.partial_rows, n)
                kept[key] = torch.empty(shape, device=x.device,
                                        dtype=x.dtype if t["atomic"] else torch.float32)
            t[name] = kept[key]


def _weight_grad_args(t, names):
    """(sum rows, outputs, counter, atomic flag) of a norm backward launch, as the op passes
    them: in atomic mode zeroed fp32 rows and a counter from one fresh allocation each call
    (its memset is part of what is timed, as in the op), else the partial buffers with the
    outputs and counter as placeholders."""
    if t["atomic"]:
        sums, sync = accumulators(len(names), t["dy"].shape[1], t["dy"].device,
                                  t["grid"].counters)
        return sums, tuple(t[name] for name in names), sync, 1
    partials = tuple(t[name] for name in names)
    return partials, (t["dx"],) * len(names), partials[0], 0


def glu_inputs(rows, n, flag, dtype, device):
    a = _randn(rows, n, dtype=dtype, device=device)
    b = _randn(rows, n, dtype=dtype, device=device)
    af, bf = a.float().requires_grad_(), b.float().requires_grad_()
    c = torch.nn.functional.silu(af) * bf
    dc = _randn(rows, n, dtype=dtype, device=device)
    c.backward(dc.float())
    return {"a": a, "b": b, "c": torch.empty_like(a), "c_ref": c.detach(), "dc": dc,
            "da": torch.empty_like(a), "da_ref": af.grad, "db": torch.empty_like(a),
            "db_ref": bf.grad}


def softmax_inputs(rows, n, flag, dtype, device):
    x = _randn(rows, n, dtype=dtype, device=device, scale=2.0)
    y = torch.softmax(x.float(), -1)
    dy = _randn(rows, n, dtype=dtype, device=device)
    y_in = y.to(dtype)
    dot = (dy.float() * y_in.float()).sum(-1, keepdim=True)
    return {"x": x, "y": torch.empty_like(x), "y_ref": y, "y_in": y_in, "dy": dy,
            "dx": torch.empty_like(x), "dx_ref": y_in.float() * (dy.float() - dot),
            # the split phases' statistics: at most MAX_CHUNKS per row
            "stats": torch.empty(rows * softmax.MAX_CHUNKS * 2, dtype=torch.float32,
                                 device=device),
            "target": 4 * multiprocessor_count(x.get_device())}


# -- launches: the op's arguments for one config, through Triton JIT ------------------------

def _run(fn, grid, args, config, **constexprs):
    fn[grid](*args, **constexprs, **config.constexprs, num_warps=config.num_warps,
             num_stages=config.num_stages)


def rms_norm_fwd(fn, t, config):
    x, rows, n = t["x"], *t["x"].shape
    s, r = (t["s"], t["r"]) if "r" in t else (t["y"], x)
    _run(fn, block_grid(rows, x.get_device(), config),
         (t["y"], x, t["w"], t["rstd"], rows, n, n, n, EPS, 0.0, s, r, n, n, int("r" in t), 1),
         config, CASTING=0)


def rms_norm_bwd(fn, t, config):
    s, rows, n = t["s_in"], *t["s_in"].shape
    dres = t.get("dres", t["dy"])
    (dw_sum,), (dw,), sync, atomic = _weight_grad_args(t, ("dw",))
    _run(fn, (t["grid"].programs,),
         (t["dx"], dw_sum, t["dy"], s, t["w"], t["rstd_ref"], rows, n, n, n, n, 0.0,
          t["grid"].rows_per_program, dres, n, int("dres" in t), dw, sync, atomic),
         config, CASTING=0)


def layer_norm_fwd(fn, t, config):
    x, rows, n = t["x"], *t["x"].shape
    _run(fn, block_grid(rows, x.get_device(), config),
         (t["y"], x, t["w"], t["b"], t["mean"], t["rstd"], rows, n, n, n, EPS, 1, 1), config)


def layer_norm_bwd(fn, t, config):
    x, rows, n = t["x"], *t["x"].shape
    (dw_sum, db_sum), (dw, db), sync, atomic = _weight_grad_args(t, ("dw", "db"))
    _run(fn, (t["grid"].programs,),
         (t["dx"], dw_sum, db_sum, t["dy"], x, t["w"], t["mean_ref"], t["rstd_ref"], rows, n,
          n, n, n, t["grid"].rows_per_program, dw, db, sync, atomic), config)


def glu_fwd(fn, t, config):
    rows, n = t["a"].shape
    _run(fn, swiglu.grid(rows, n, config),
         (t["c"], t["a"], t["b"], rows, n, n, n, n, swiglu.ACT_SILU), config)


def glu_bwd(fn, t, config):
    rows, n = t["a"].shape
    _run(fn, swiglu.grid(rows, n, config),
         (t["da"], t["db"], t["dc"], t["a"], t["b"], rows, n, n, n, n, n, n, swiglu.ACT_SILU),
         config)


def _softmax(fn, config, out, ins, rows, n, t):
    grid, chunk_cols, n_chunks, phases = softmax.plan(config, rows, n, t["target"])
    for phase in phases:
        _run(fn, grid, (out, *ins, t["stats"], rows, n, *(n,) * (len(ins) + 1), chunk_cols,
                        n_chunks, phase), config)


def softmax_fwd(fn, t, config):
    _softmax(fn, config, t["y"], (t["x"],), *t["x"].shape, t)


def softmax_bwd(fn, t, config):
    _softmax(fn, config, t["dx"], (t["dy"], t["y_in"]), *t["x"].shape, t)


@dataclass(frozen=True)
class Case:
    """How to tune one spec: representative shapes (rows, n_cols[, the rule's flag]), one per
    bucket; the family's input factory; the launch of one config; the outputs checked against
    their `<name>_ref` (a per-program partial, one dim more, is summed first); the passes
    over rows x n_cols elements that a launch reads or writes (without, with the flag), for
    the bandwidth; the candidate generator (bucket, flag); what a config needs set up in the
    inputs before its launches (prepare(inputs, config), untimed), if anything."""
    spec: KernelSpec
    shapes: tuple
    make: Callable
    launch: Callable
    outputs: tuple
    passes: tuple
    candidates: Callable
    prepare: Callable | None = None
    also_rows: Callable | None = None  # n_cols -> more row counts to time (see tune)
    # every bucket is timed again at other lengths (measure_inexact), not only those
    # choosing a config with the row length compiled in (EXACT_KEY)
    other_lengths: bool = False


def _rows_case(spec, shapes, make, launch, outputs, passes, prepare=None, **limits):
    return Case(spec, shapes, make, launch, outputs, passes,
                lambda bucket, flag=False: row_configs(bucket, flag, **limits), prepare)


def suite_rows(n: int) -> int:
    """Rows of the benchmark suite's norm shapes (benchmarks/suite.py: 64M elements)."""
    return max(1, 2**26 // n)


_NORM_NS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


def _suite_rows_if_more(n: int) -> tuple:
    """The norms' second shape: a fixed cost per launch (the grid's ramp and tail, the
    backwards' weight-gradient sum) weighs more at 16384 rows than at the suite's 65536 x
    1024 (the forward 1K: 69% of copy in the tuner, 84% in the suite), so a config could win
    at one row count and lose at the other. Added when the suite and the tuner disagreed on
    the fused add 1K backward; the cause there turned out to be the JIT's specialization
    (kernel_src.jit_function), and in the session-6 H200 tune of the backwards the best
    config at 16384 rows was also the best at the suite's rows (docs/perf-notes.md)."""
    return (suite_rows(n),) if suite_rows(n) > _rows(n) else ()


# Forward looped rows also on 32 warps: a minimal looped forward read 2048 x 32768 in 0.0707
# ms on 32 warps of 8192 columns against 0.0818 on 16 (H200, benchmarks/experiment_forward_
# unroll.py); torch.compile's looped 32K forward had read 90% of copy, the library 80%.
# Pass 1 over the whole bucket (PASS1_BLOCK): minimal looped forwards read 4096 x 16384
# (LayerNorm, 4096 columns on 16 warps) at 86.8% of copy against 74.5% by BLOCK_N chunks, and
# 2048 x 32768 (RMSNorm, 8192 on 32) at 88.0 against 76.5 (H200, benchmarks/experiment_norm_
# fwd_pass1.py); up to 64 elements a thread. Pass 2 also by 2048 columns on 8 warps: with
# the whole-row pass 1 that tile read LayerNorm 8192 x 8192 at 87.3% of copy, against 80.6%
# on the table's 4096 x 8 (session 19), which the candidates had not held.
# Whole rows also on 1 and 2 warps: torch.compile's LayerNorm 65536 x 1024 forward, one row a
# program on one warp (its row sums warp shuffles alone), issued 26.5M instructions in 65.3
# us against the library's 48.0M in 69.6 us on 4 rows over 4 warps, whose sums cross warps
# through shared memory (H200, Nsight Compute, session 20). Looped rows with the whole-row
# pass 1 also two a program: LayerNorm's 32K forward moved 500 MB through L2 against
# RMSNorm's 420 MB (pass 2 reads w and b for every row) at 81% of L2 throughput and 69% of
# DRAM's (Nsight Compute, session 20); the tune that followed kept one row for LayerNorm at
# 16K-32K and took two for RMSNorm at 8K. Looped rows from 4K (8K before): with the whole-row
# pass 1 and pass 2 by 2048 columns on 8 warps, 16384 x 4096 read RMSNorm in 0.0683 ms and
# LayerNorm in 0.0693 against 0.0722 and 0.0756 on the whole-row tiles (H200, session 26);
# from 1K (session 27), with pass 2 by 512 and 1024 columns on 2 and 4 warps, the same
# 8-16 elements a thread as the 4K winner's.
_FWD_LIMITS = {"max_tile": 32768, "whole_row_max": 32768, "loop_from": 1024,
               "loop_warps": (2, 4, 8, 16, 32),
               "loop_blocks": (512, 1024, 2048, 4096, 8192, 16384),
               "loop_pass1": 64, "launches": forward_launches,
               "whole_row_warps": (1, 2, 4, 8, 16, 32), "pass1_rows": (1, 2),
               "exact_pass1": True}
# Backward whole rows up to 16K columns: on 32 warps, 16 elements a thread of x, dy, w and
# the dw accumulator (within the 64 registers a thread has at 1024 threads an SM). Looped
# backwards also take 2 or 4 rows a step (one read-modify-write of the dw partial row for
# them all) in tiles of up to 8K elements.
_BWD_LIMITS = {"max_tile": 16384, "whole_row_max": 16384, "loop_from": 8192,
               "loop_rows": (1, 2, 4), "loop_max_tile": 8192, "launches": backward_launches}

CASES = {case.spec.name: case for case in (
    _with_staged(dataclasses.replace(_rows_case(
        rms_norm.FWD, _shapes(_NORM_NS, flag_ns=_NORM_NS), rms_norm_inputs, rms_norm_fwd,
        ("y", "rstd", "s"), (2, 4), **_FWD_LIMITS,
        flag_whole_row_max=rms_norm.RESIDUAL_MAX_BLOCK_N), also_rows=_suite_rows_if_more,
        other_lengths=True), 1),
    dataclasses.replace(_rows_case(
        rms_norm.BWD, _shapes(_NORM_NS, flag_ns=_NORM_NS), rms_norm_inputs, rms_norm_bwd,
        ("dx", "dw"), (3, 4),
        functools.partial(norm_backward_buffers, sum_block_n=rms_norm.SUM_BLOCK_N),
        **_BWD_LIMITS,
        flag_whole_row_max=rms_norm.DRES_MAX_BLOCK_N), also_rows=_suite_rows_if_more,
        other_lengths=True),
    _with_staged(dataclasses.replace(_rows_case(
        layer_norm.FWD, _shapes(_NORM_NS), layer_norm_inputs, layer_norm_fwd,
        ("y", "mean", "rstd"), (2, 2), **_FWD_LIMITS, hold_pass1=True),
        also_rows=_suite_rows_if_more,
        other_lengths=True), 2),
    dataclasses.replace(_rows_case(
        layer_norm.BWD, _shapes(_NORM_NS), layer_norm_inputs, layer_norm_bwd,
        ("dx", "dw", "db"), (3, 3),
        functools.partial(norm_backward_buffers, sum_block_n=layer_norm.SUM_BLOCK_N),
        **_BWD_LIMITS),
        also_rows=_suite_rows_if_more, other_lengths=True),
    Case(swiglu.FWD, ((8192, 4096), (8192, 14336), (8192, 28672)), glu_inputs, glu_fwd,
         ("c",), (3, 3), tile_configs),
    Case(swiglu.BWD, ((8192, 4096), (8192, 14336), (8192, 28672)), glu_inputs, glu_bwd,
         ("da", "db"), (5, 5), tile_configs),
    _rows_case(softmax.FWD, _shapes((1024, 4096, 16384, 32768, 131072)), softmax_inputs,
               softmax_fwd, ("y",), (2, 2), max_tile=16384, whole_row_max=16384,
               loop_from=16384),
    _rows_case(softmax.BWD, _shapes((1024, 4096, 16384, 32768, 131072)), softmax_inputs,
               softmax_bwd, ("dx",), (3, 3), max_tile=16384, whole_row_max=16384,
               loop_from=16384),
)}


# -- measuring --------------------------------------------------------------------------

def candidates_of(case: Case, shape: tuple) -> list:
    """The heuristic rule's config first, then the case's candidates, distinct by tag."""
    configs, tags = [], set()
    for config in (case.spec.rule(*shape[1:]),
                   *case.candidates(next_power_of_2(shape[1]), _flag(shape))):
        if config.constexprs.get(EXACT_KEY) and exact_length(config) != shape[1]:
            continue  # its row length compiled in: rows of that length only
        if config.tag not in tags:
            tags.add(config.tag)
            configs.append(config)
    return configs


def _flag(shape: tuple) -> bool:
    return len(shape) > 2 and bool(shape[2])


def shapes_text(shapes) -> str:
    """"16384x1024, 65536x1024": shapes' rows and lengths, for logs and plans."""
    return ", ".join("x".join(map(str, s[:2])) for s in shapes)


def timed_shapes(case: Case, shape: tuple) -> list:
    """The bucket's shape, then the same with each of the case's also_rows row counts."""
    extra = case.also_rows(shape[1]) if case.also_rows else ()
    return [shape] + [(rows, *shape[1:]) for rows in extra]


def config_runs(cases: dict) -> int:
    """The config runs a tune makes: every candidate at every timed shape of its bucket, and
    where the case measures its buckets' other lengths (other_lengths), every candidate there
    (an estimate: a chosen config not among those candidates adds one run a shape, and which
    config is chosen only the tune knows)."""
    runs = 0
    for name, _, shape, configs in plan(cases):
        case = cases[name]
        runs += len(configs) * len(timed_shapes(case, shape))
        if case.other_lengths:
            shapes = inexact_shapes(case, shape)
            runs += len(candidates_of(case, shapes[0])) * len(shapes)
    return runs


def plan(cases: dict) -> list:
    """(spec name, bucket key, shape, candidate configs) of every measurement, in order."""
    return [(name, tuning.bucket_key(case.spec, shape[1:]), shape, candidates_of(case, shape))
            for name, case in cases.items() for shape in case.shapes]


def only_cols(cases: dict, text: str | None) -> dict:
    """The cases with only their shapes of the given row lengths (comma-separated); all of
    them when text is empty."""
    if not text:
        return cases
    try:
        cols = {int(c) for c in text.split(",") if c.strip()}
    except ValueError:
        cols = set()
    if not cols:
        raise ValueError(f"--cols takes comma-separated row lengths, got {text!r}")
    kept = {name: dataclasses.replace(case, shapes=tuple(s for s in case.shapes if s[1] in cols))
            for name, case in cases.items()}
    kept = {name: case for name, case in kept.items() if case.shapes}
    if not kept:
        lengths = sorted({s[1] for case in cases.values() for s in case.shapes})
        raise ValueError(f"--cols {text}: no tuned shape has such a row length; these specs "
                         f"tune rows of {', '.join(map(str, lengths))}")
    return kept


def do_bench_median(run, config) -> float:
    from triton.testing import do_bench

    return do_bench(run, warmup=10, rep=40, return_mode="median")


def capture_graph(fn) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of one call of fn, captured after three warm-up calls on a side stream
    (so that the caching allocator and lazy initializations have settled)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_ms(fn) -> float:
    """Median ms of CUDA-graph replays of fn (do_bench, 25 / 200 ms): how the benchmark
    suite times with --graphs (benchmarks/suite.py), the graph captured as capture_graph
    does."""
    from triton.testing import do_bench

    return do_bench(capture_graph(fn).replay, warmup=25, rep=200, return_mode="median")


def graph_median(run, config) -> float:
    """graph_ms as a tune() timer (the refine_timer of --graphs-top)."""
    return graph_ms(run)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    got = got.float()
    if got.dim() == want.dim() + 1:
        got = got.sum(0)  # per-program partials
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure(case: Case, shape: tuple, configs: list, device, timer, dtype) -> list:
    """[(config, ms or None, why rejected or None)] for each config at the shape."""
    from liger_aot.kernel_src import jit_function

    torch.manual_seed(0)
    rows, n = shape[:2]
    t = case.make(rows, n, _flag(shape), dtype, device)
    gpu = torch.device(device).type == "cuda"
    results = []
    for config in configs:
        try:
            if case.prepare is not None:
                case.prepare(t, config)
            checked = [(t[name], t[name + "_ref"]) for name in case.outputs if name in t]
            for out, _ in checked:
                out.fill_(float("nan"))
            if staged_twin(config, DTYPE_NAMES[dtype], "a16") is not config:
                raise ValueError("a staged config runs its Gluon kernel on 2-byte data only")
            # the interpreter runs no Gluon: there a staged config runs its Triton twin
            run = staged_twin(config, DTYPE_NAMES[dtype], "a16" if gpu else "any")
            fn = jit_function(case.spec, run)  # compiled as the AOT build compiles it
            case.launch(fn, t, run)
            _sync(device)
            errors = [_error(out, ref) for out, ref in checked]
            if not all(e < TOLERANCE for e in errors):  # nan fails too
                raise AssertionError("relative error " + ", ".join(f"{e:.1e}" for e in errors))
            results.append((config, timer(lambda: case.launch(fn, t, run), config), None))
        except Exception as e:  # a candidate that does not compile, fails or is wrong
            results.append((config, None, f"{type(e).__name__}: {str(e)[:120]}"))
    return results


def _scores(times: dict) -> dict:
    """{config index: mean over the shapes of its time relative to the fastest there} (1.0 =
    the fastest at every shape) of times {index: [ms at each shape]}."""
    shapes = len(next(iter(times.values())))
    fastest = [min(ms[k] for ms in times.values()) for k in range(shapes)]
    return {j: sum(t / f for t, f in zip(ms, fastest)) / shapes for j, ms in times.items()}


def _refine(case, shapes, configs, score, device, timer, dtype, top) -> dict | None:
    """The heuristic config (index 0) and the `top` best others by `score`, timed again at
    every shape with `timer`: {index: [ms at each shape]} of those that ran, or None when
    the heuristic did not run."""
    ranked = sorted((j for j in score if j), key=score.get)[:top]
    picks = [0] + ranked
    per_shape = [measure(case, s, [configs[j] for j in picks], device, timer, dtype)
                 for s in shapes]
    times = {j: [results[i][1] for results in per_shape] for i, j in enumerate(picks)}
    times = {j: ms for j, ms in times.items() if all(t is not None for t in ms)}
    return times if 0 in times else None


@dataclass
class Choice:
    """What _choose measured: times[j][k] config j at shape k (None: failed there), score
    {valid j: relative mean}, best and chosen indexes, whether index 0 was kept, the refined
    times {j: [ms]} or None; failed: why config 0 failed (then nothing else is set)."""
    times: list = None
    score: dict = None
    best: int = 0
    chosen: int = 0
    keep: bool = True
    refined: dict | None = None
    failed: str | None = None


def _choose(case, shapes, configs, device, timer, dtype, refine_top, refine_timer) -> Choice:
    """Time configs at every shape and choose among them: configs[0] (the reference: the
    heuristic, or an exact config's twin) stays unless another is more than KEEP_WITHIN
    faster by score; with refine_top > 0 the choice is made on refine_timer's times of the
    reference and the refine_top best."""
    per_shape = []
    for s in shapes:
        try:
            per_shape.append(measure(case, s, configs, device, timer, dtype))
        except Exception as e:  # e.g. out of memory making the inputs: skip the bucket
            per_shape.append([(configs[0], None, f"{type(e).__name__}: {str(e)[:200]}")])
            break
    # times[j][k]: config j at shape k; a config failing at any shape is dropped
    times = [[results[j][1] if j < len(results) else None for results in per_shape]
             for j in range(len(configs))]
    valid = [j for j, ms in enumerate(times) if all(t is not None for t in ms)]
    if 0 not in valid:
        return Choice(failed=next(r[0][2] for r in per_shape if r[0][1] is None))
    # score: mean over the shapes of the time relative to the best there (1.0 = the
    # fastest at every shape); one shape: the time relative to the best
    score = _scores({j: times[j] for j in valid})
    best = min(valid, key=score.get)
    keep = score[0] <= score[best] * (1 + KEEP_WITHIN)
    chosen = 0 if keep else best
    refined = None
    if refine_top > 0:
        # do_bench (L2 flushed, a launch a call) and graph replays have ranked the same
        # config a few percent apart (H200, session 20): choose on the suite's measure
        refined = _refine(case, shapes, configs, score, device, refine_timer, dtype,
                          refine_top)
        if refined is not None:
            graph_score = _scores(refined)
            graph_best = min(refined, key=graph_score.get)
            keep = graph_score[0] <= graph_score[graph_best] * (1 + KEEP_WITHIN)
            chosen = 0 if keep else graph_best
    return Choice(times, score, best, chosen, keep, refined)


# Where a bucket's other lengths are timed, in eighths of its length, the middle first (the
# record's shape): they lie between half of it and all of it. One probe at 3/4 (session 31)
# chose LayerNorm's 16K record at 12288, where it read 92% of copy, and 86% at 10240 (H100,
# session 32): a block of 4096 divides the one and not the other.
OTHER_EIGHTHS = (6, 5, 7)
# A probe length runs a config of its own where the fastest there is more than this faster
# than the bucket's inexact choice at each of its row counts (and again in the refine timer's
# replays): one config for 5/8 to 7/8 of the 8K bucket left the fused add's backward at 5120
# columns 6% behind the best there (H100, session 33).
LENGTH_MARGIN = 0.03
# The bucket's inexact choice replaces the reference only where no probe without a config
# of its own reads it more than this slower: a choice on the mean may lose a few percent at
# one probe (the fused add's 8K backward: 5% at 7168 columns in the tuner, 15% in the suite;
# H100, sessions 32-33).
PROBE_SLACK = 0.01


def inexact_shapes(case: Case, shape: tuple) -> list:
    """timed_shapes at 3/4, 5/8 and 7/8 of the bucket's length (OTHER_EIGHTHS), each with as
    many elements as the bucket's shape: where a config with the bucket's length compiled in
    (EXACT_KEY) does not serve, and where a whole-row tile of the bucket's length masks some
    of its lanes."""
    n = shape[1]
    return [(rows * n // length, length, *rest)
            for length in (eighths * n // 8 for eighths in OTHER_EIGHTHS)
            for rows, _, *rest in timed_shapes(case, shape)]


def measures_other_lengths(case: Case, config: Config) -> bool:
    """Whether a bucket choosing config is timed again at its other lengths (measure_inexact):
    every bucket of a case that asks for it, and every exact-length choice."""
    return case.other_lengths or bool(config.constexprs.get(EXACT_KEY))


def inexact_candidates(case: Case, shape: tuple, chosen: Config,
                       current: Config | None = None) -> tuple:
    """(inexact_shapes, configs) of measure_inexact: the reference first, what those lengths
    run now (current: the table's inexact config, else the chosen config's twin: itself
    unless its row length is compiled in), then the twin and the bucket's other candidates
    (at 3/4 of its length: candidates_of leaves out the exact ones)."""
    shapes = inexact_shapes(case, shape)
    twin = inexact_twin(chosen)
    first = [twin] if current is None or current.tag == twin.tag else [current, twin]
    tags = {c.tag for c in first}
    return shapes, first + [c for c in candidates_of(case, shapes[0]) if c.tag not in tags]


def _table_inexact(record: dict | None) -> Config | None:
    """The config a table entry's "inexact" record runs at the bucket's other lengths."""
    inexact = (record or {}).get("inexact")
    return tuning.record_config(inexact["config"]) if inexact else None


def _unmeasured_text(record: dict | None) -> str:
    """Why _measured_in_table gave no config for a bucket, in words."""
    return "no record in the table" if record is None else "its other lengths are not measured"


def _twin_text(config: Config, current: Config | None = None) -> str:
    """What a bucket's other lengths run now, in words: the table's inexact config (current),
    else what they run without an "inexact" record."""
    if current is not None:
        return f"the table's inexact {current.tag}"
    return (f"the twin of {config.tag}" if config.constexprs.get(EXACT_KEY)
            else f"the table's {config.tag}")


def _measured_in_table(case: Case, table_specs: dict, name: str, key: str) -> tuple:
    """(record, config) of the table's entry for the bucket where its other lengths are
    measured (measures_other_lengths), else (record or None, None)."""
    record = table_specs.get(name, {}).get(key)
    config = tuning.record_config(record["config"]) if record else None
    return record, (config if config is not None and measures_other_lengths(case, config)
                    else None)


def measure_inexact(case: Case, shapes: list, configs: list, device, timer, dtype, refine_top,
                    refine_timer, description: str, log=print) -> dict | None:
    """The record of what the other lengths of a bucket run (the table entry's "inexact", see
    kernel_src/tuning.py), from inexact_candidates' shapes and configs: the reference (what
    they run now: the table's inexact config, else the chosen config's twin) and the
    bucket's other candidates timed at those shapes. The reference is kept unless another is
    more than KEEP_WITHIN faster by score over them (as the heuristic is for the bucket) and
    no more than PROBE_SLACK slower at any of them that does not get a config of its own;
    the record holds the first shape's times and the others' in "also", and in "lengths"
    the probe lengths that run a config of their own (_own_lengths). None where the
    reference fails: the bucket's other lengths then run the twin. Added after an H100 read
    LayerNorm at 1536 columns 9.8% slower on the 2K bucket's exact config's twin than on
    the table it replaced (session 31); for every norm bucket after the 16K backwards read
    12288 columns at 75-79% of copy and 24576 at 88-92 (session 32)."""
    reference = configs[0]
    c = _choose(case, shapes, configs, device, timer, dtype, refine_top, refine_timer)
    text = shapes_text(shapes)
    if c.failed:
        log(f"    other lengths ({text}): the reference {reference.tag} failed ({c.failed}): "
            f"none kept")
        return None
    timed = c.refined or {j: c.times[j] for j in c.score}
    refine_timer = refine_timer if c.refined is not None else None
    chosen = c.chosen
    own = _own_lengths(case, shapes, configs, c, chosen, device, dtype, refine_timer)
    slower = [k for k, s in enumerate(shapes) if chosen and str(s[1]) not in own
              and timed[chosen][k] > timed[0][k] * (1 + PROBE_SLACK)]
    if slower:
        worst = max(slower, key=lambda k: timed[chosen][k] / timed[0][k])
        log(f"    other lengths: {configs[chosen].tag} kept out, "
            f"{timed[chosen][worst] / timed[0][worst] - 1:+.1%} at {shapes_text([shapes[worst]])}")
        chosen = 0
        own = _own_lengths(case, shapes, configs, c, chosen, device, dtype, refine_timer)
    record = {"config": tuning.config_record(configs[chosen]), "shape": list(shapes[0][:2]),
              "ms": _round(c.times[chosen][0]), "twin_ms": _round(c.times[0][0]),
              "candidates": len(c.score), "device": description,
              "score": _round(c.score[chosen]), "twin_score": _round(c.score[0]),
              "also": [{"shape": list(s[:2]), "ms": _round(c.times[chosen][k]),
                        "twin_ms": _round(c.times[0][k])}
                       for k, s in enumerate(shapes) if k]}
    if refine_timer is not None:
        record["refined"] = {"timer": getattr(refine_timer, "__name__", "refine"),
                             "ms": _round(c.refined[chosen][0]),
                             "twin_ms": _round(c.refined[0][0])}
    log(f"    other lengths ({text}): reference {timed[0][0]:.4f} ms, chosen "
        f"{timed[chosen][0]:.4f} ms " + ("(the reference)" if not chosen
                                         else configs[chosen].tag))
    for length, entry in own.items():
        log(f"    {length} columns: {entry['ms']:.4f} ms against {entry['inexact_ms']:.4f}, "
            f"its own {tuning.record_config(entry['config']).tag}")
    if own:
        record["lengths"] = own
    return record


def _own_lengths(case: Case, shapes: list, configs: list, c: Choice, chosen: int, device,
                 dtype, refine_timer=None) -> dict:
    """{length: record} of the probe lengths whose fastest config by c.times is more than
    LENGTH_MARGIN faster than configs[chosen] at each of the length's row counts, and again
    by refine_timer there where one is given (the record keeps the first row count's times:
    "ms", "inexact_ms", and "refined")."""
    own = {}

    def ahead(ms, ref):
        return all(t is not None and r is not None and t < r * (1 - LENGTH_MARGIN)
                   for t, r in zip(ms, ref))

    for length in sorted({s[1] for s in shapes}):
        ks = [k for k, s in enumerate(shapes) if s[1] == length]
        best = min(c.score, key=lambda j: sum(c.times[j][k] / c.times[chosen][k] for k in ks))
        if best == chosen or not ahead([c.times[best][k] for k in ks],
                                       [c.times[chosen][k] for k in ks]):
            continue
        entry = {"config": tuning.config_record(configs[best]),
                 "ms": _round(c.times[best][ks[0]]),
                 "inexact_ms": _round(c.times[chosen][ks[0]])}
        if refine_timer is not None:
            again = [measure(case, shapes[k], [configs[chosen], configs[best]], device,
                             refine_timer, dtype) for k in ks]
            if not ahead([r[1][1] for r in again], [r[0][1] for r in again]):
                continue
            entry["refined"] = {"ms": _round(again[0][1][1]),
                                "inexact_ms": _round(again[0][0][1])}
        own[str(length)] = entry
    return own


def _tune_inexact_only(cases, table_specs, device, timer, dtype, log, refine_top, refine_timer,
                       description, on_record) -> tuple:
    """tune(inexact_of=...): the table's records of the planned buckets whose other lengths
    are measured (measures_other_lengths), each with a new "inexact" record; the rest are
    left out."""
    specs, problems = {}, []
    for name, key, shape, _ in plan(cases):
        record, config = _measured_in_table(cases[name], table_specs, name, key)
        if config is None:
            log(f"{name} {key}: {_unmeasured_text(record)}, nothing to measure")
            continue
        current = _table_inexact(record)
        log(f"{name} {key}: the table's {config.tag}"
            + (f", its other lengths' {current.tag}" if current is not None else ""))
        inexact = measure_inexact(cases[name],
                                  *inexact_candidates(cases[name], shape, config, current),
                                  device, timer, dtype, refine_top, refine_timer, description,
                                  log)
        kept = {k: v for k, v in record.items() if k != "inexact"}
        if inexact is None:
            problems.append(f"{name} {key}: {_twin_text(config, current)} failed at other lengths")
        else:
            kept["inexact"] = inexact
        specs.setdefault(name, {})[key] = kept
        on_record(name, key, kept)
    return specs, problems


def tune(arch: str, cases: dict, device="cuda", timer=do_bench_median, dtype=torch.bfloat16,
         log=print, refine_top: int = 0, refine_timer=graph_median, description: str = "",
         inexact_of: dict | None = None, on_record=lambda name, key, record: None) -> tuple:
    """Measure every case. Returns ({spec name: {bucket key: record}}, problems): records in
    the table's format (kernel_src/tuning.py), problems a list of lines (a heuristic config
    that failed: its bucket gets no record). refine_top > 0: the heuristic and that many of
    the best candidates by `timer` are timed again with refine_timer (CUDA-graph replays,
    the benchmark suite's measure), and the choice is made among them on those times, with
    the same KEEP_WITHIN rule (the record's "refined"). A bucket of a case with
    other_lengths, or one that chooses a config with the row length compiled in, is measured
    again at another length (measure_inexact: the record's "inexact", `description` naming
    the GPU). inexact_of ({spec name: {bucket key: record}}, a table's): choose nothing;
    measure only that, for the configs those records hold, and return the records with it.
    on_record(spec name, bucket key, record) is called as each bucket's record is made."""
    if inexact_of is not None:
        return _tune_inexact_only(cases, inexact_of, device, timer, dtype, log, refine_top,
                                  refine_timer, description, on_record)
    measurements = plan(cases)
    total = config_runs(cases)
    started, done = time.perf_counter(), 0
    log(f"tuning {len(cases)} spec(s), {len(measurements)} bucket(s), {total} config runs "
        f"on {device} ({DTYPE_NAMES[dtype]})")
    specs, problems = {}, []
    for i, (name, key, shape, configs) in enumerate(measurements, 1):
        case = cases[name]
        shapes = timed_shapes(case, shape)
        shape_text = shapes_text(shapes)
        c = _choose(case, shapes, configs, device, timer, dtype, refine_top, refine_timer)
        done += len(configs) * len(shapes)
        if c.failed:
            problems.append(f"{name} {key} ({shape_text}): the heuristic config "
                            f"{configs[0].tag} failed: {c.failed}")
            log(f"[{i}/{len(measurements)}] {name} {key}: HEURISTIC FAILED {c.failed}")
            continue
        times, score, best, chosen, keep, refined = (c.times, c.score, c.best, c.chosen,
                                                     c.keep, c.refined)
        valid = list(score)
        ms = times[chosen][0]
        moved = (case.passes[_flag(shape)] * shape[0] * shape[1]
                 * torch.empty((), dtype=dtype).element_size())
        record = {
            "config": tuning.config_record(configs[chosen]), "ms": _round(ms),
            "gbps": round(moved / (ms * 1e-3) / 1e9, 1), "shape": list(shape[:2]),
            "dtype": DTYPE_NAMES[dtype], "candidates": len(valid),
            "rejected": len(configs) - len(valid),
            "heuristic": {"tag": configs[0].tag, "ms": _round(times[0][0])},
            "best": {"tag": configs[best].tag, "ms": _round(times[best][0])}}
        if len(shapes) > 1:
            record["heuristic"]["score"] = _round(score[0])
            record["best"]["score"] = _round(score[best])
            record["also"] = [{"shape": list(s[:2]), "ms": _round(times[chosen][k]),
                               "heuristic_ms": _round(times[0][k]),
                               "best_ms": _round(times[best][k])}
                              for k, s in enumerate(shapes) if k]
        if refined is not None:
            record["refined"] = {"timer": getattr(refine_timer, "__name__", "refine"),
                                 "configs": [{"tag": configs[j].tag, "ms": _round(ms[0])}
                                             for j, ms in sorted(refined.items(),
                                                                 key=lambda kv: kv[1][0])],
                                 "ms": _round(refined[chosen][0])}
        if measures_other_lengths(case, configs[chosen]):
            other_shapes, other_configs = inexact_candidates(case, shape, configs[chosen])
            inexact = measure_inexact(case, other_shapes, other_configs, device, timer, dtype,
                                      refine_top, refine_timer, description, log)
            done += len(other_configs) * len(other_shapes)
            if inexact is not None:
                record["inexact"] = inexact
        specs.setdefault(name, {})[key] = record
        on_record(name, key, record)
        log(f"[{i}/{len(measurements)} {time.perf_counter() - started:5.0f}s, {done}/{total} "
            f"runs] {name} {key} {shape_text}: heuristic "
            + ", ".join(f"{t:.4f}" for t in times[0]) + " ms, best "
            + ", ".join(f"{t:.4f}" for t in times[best])
            + f" ms ({score[0] / score[best]:.2f}x) {configs[best].tag}"
            + ("" if refined is None else
               f"; {record['refined']['timer']}: heuristic {refined[0][0]:.4f} ms, "
               f"chosen {refined[chosen][0]:.4f} ms {configs[chosen].tag}")
            + ("" if not keep else "; keeping the heuristic")
            + (f"; {len(configs) - len(valid)} rejected" if len(valid) < len(configs) else ""))
    return specs, problems


def _round(ms: float) -> float:
    return float(f"{ms:.4g}")


def _tag(record: dict) -> str:
    return tuning.record_config(record).tag


def format_results(specs: dict) -> str:
    """One line per bucket: the heuristic's and the best config's times, and what was kept."""
    rows = [("spec", "bucket", "shape", "heuristic ms", "best ms", "speedup", "chosen")]
    for name, buckets in specs.items():
        for key, r in buckets.items():
            kept = _tag(r["config"]) == r["heuristic"]["tag"]
            h, b = r["heuristic"], r["best"]
            shapes = [r["shape"]] + [a["shape"] for a in r.get("also", ())]
            rows.append((name, key, shapes_text(shapes),
                         ", ".join(f"{t:.4f}" for t in
                                   [h["ms"]] + [a["heuristic_ms"] for a in r.get("also", ())]),
                         ", ".join(f"{t:.4f}" for t in
                                   [b["ms"]] + [a["best_ms"] for a in r.get("also", ())]),
                         f"{h.get('score', h['ms']) / b.get('score', b['ms']):.2f}x",
                         "heuristic" if kept else b["tag"]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
                     for row in rows)


def write_table(path: str, arch: str, specs: dict, about: dict, whole_specs: bool = True,
                base: str | None = None):
    """Write the table at `path` (atomically) with the tuned specs' entries replaced (with
    whole_specs False, only the tuned buckets' entries: a partial tune); other specs'
    entries of an existing table for `arch` are kept: the one at `path`, or where there is
    none, the one at `base` (the arch's committed table), so that a tune written to a new
    file is a whole table, not just what this run measured. Its other fields (device,
    versions) are kept where `about` does not replace them."""
    from liger_aot.build_tools.aot import atomic_write

    table = {"format": tuning.TABLE_FORMAT, "arch": arch, "specs": {}}
    start = path if os.path.exists(path) or base is None else base
    try:
        with open(start, "rb") as f:
            old = json.loads(f.read())
        if old.get("format") == tuning.TABLE_FORMAT and old.get("arch") == arch:
            table.update({k: v for k, v in old.items() if k != "specs"})  # about, unless new
            table["specs"].update(old.get("specs", {}))
    except (OSError, ValueError, AttributeError):
        pass
    if whole_specs:
        table["specs"].update(specs)
    else:
        for name, buckets in specs.items():
            table["specs"][name] = {**table["specs"].get(name, {}), **buckets}
    table.update(about)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, tuning.format_table(table))


def select_cases(text: str | None) -> dict:
    if not text:
        return dict(CASES)
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        raise ValueError(f"unknown or no spec {', '.join(unknown)}: tunable specs are "
                         f"{', '.join(CASES)}")
    return {n: CASES[n] for n in dict.fromkeys(names)}


def gpu_for(arch: str) -> tuple:
    """(device index, description) of the current GPU, which must be of `arch`."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"liger-aot tune measures kernels on a GPU of the arch it tunes, and "
                           f"torch sees no GPU here. Run it on an {arch} machine (a table "
                           f"for another arch comes from a GPU of that arch).")
    from liger_aot.runtime.device import device_arch

    index = torch.cuda.current_device()
    found, description = device_arch(index)
    if found != arch:
        raise RuntimeError(f"this GPU is {description}, artifact arch {found or 'none'}; "
                           f"--arch {arch} must be tuned on an {arch} GPU")
    return index, description


def describe_plan(cases: dict) -> str:
    lines = []
    for name, key, shape, configs in plan(cases):
        shapes = shapes_text(timed_shapes(cases[name], shape))
        lines.append(f"{name:<16} {key:<28} {shapes:>22}  "
                     f"{len(configs):>2} configs (heuristic {configs[0].tag})")
    lines.append(f"{len(lines)} buckets, {config_runs(cases)} config runs")
    return "\n".join(lines)


def describe_inexact_plan(cases: dict, table_specs: dict) -> str:
    """describe_plan for --inexact-only: the table's configs whose buckets' other lengths
    would be timed, and where."""
    lines = []
    for name, key, shape, _ in plan(cases):
        record, config = _measured_in_table(cases[name], table_specs, name, key)
        if config is None:
            lines.append(f"{name:<16} {key:<28} {_unmeasured_text(record)}")
            continue
        current = _table_inexact(record)
        shapes, configs = inexact_candidates(cases[name], shape, config, current)
        lines.append(f"{name:<16} {key:<28} "
                     f"{shapes_text(shapes):>22}  "
                     f"{len(configs):>2} configs ({_twin_text(config, current)} first)")
    return "\n".join(lines)


def run(arch: str, specs: str | None = None, out: str | None = None, dry_run: bool = False,
        log=print, cols: str | None = None, graphs_top: int = 0,
        inexact_only: bool = False) -> int:
    """The `liger-aot tune` command. Returns the exit status."""
    if graphs_top < 0:
        raise ValueError(f"--graphs-top takes a count of configs >= 0, got {graphs_top}")
    cases = only_cols(select_cases(specs), cols)
    out = out or tuning.table_path(arch)
    table_specs = None
    if inexact_only:  # the table this run adds to: the one at --out, else the arch's
        path = out if os.path.exists(out) else tuning.table_path(arch)
        if not os.path.exists(path):
            raise FileNotFoundError(f"--inexact-only adds to a tuned table of {arch}, and there "
                                    f"is none at {path}: tune the arch first")
        table_specs = tuning.read_table(path, arch)[1]["specs"]
    if dry_run:
        log(describe_inexact_plan(cases, table_specs) if inexact_only else describe_plan(cases))
        log(f"(dry run: nothing measured; a run writes {os.path.realpath(out)})")
        return 0
    index, description = gpu_for(arch)
    if "triton" not in sys.modules:
        os.environ.pop("TRITON_INTERPRET", None)  # measure compiled kernels, not the interpreter
    import triton

    # --inexact-only keeps the table's own device and versions: its choices are unchanged
    about = {} if inexact_only else {"device": description, "triton_version": triton.__version__,
                                     "torch_version": torch.__version__.split("+")[0]}

    def write_bucket(name, key, record):  # as each is measured: a run cut short keeps them
        write_table(out, arch, {name: {key: record}}, about, whole_specs=False,
                    base=tuning.table_path(arch))

    started = time.perf_counter()
    results, problems = tune(arch, cases, device=f"cuda:{index}", log=log,
                             refine_top=graphs_top, description=description,
                             inexact_of=table_specs, on_record=write_bucket)
    write_table(out, arch, results, about, whole_specs=not (cols or inexact_only),
                base=tuning.table_path(arch))
    if not inexact_only:
        log(format_results(results))
    log(f"wrote {os.path.realpath(out)} ({sum(map(len, results.values()))} buckets of "
        f"{len(results)} spec(s)) in {time.perf_counter() - started:.0f}s; `liger-aot build "
        f"--arch {arch}` compiles what it chose")
    for line in problems:
        log(f"PROBLEM {line}")
    return 1 if problems else 0
