"""Experiment (session 8): cross-entropy loss + gradient with one wide program per row, so that
pass 2 re-reads its row from L2.

The library's kernel (four warps a row, 2048 columns a step, thousands of rows in flight)
reads each 8192 x 128256 bf16 row twice from HBM and writes the gradient: three passes, 1.49 ms
at copy speed; it runs 1.62-1.72 ms. The issue asks 1.1 ms, which needs pass 2 served from L2
(50 MB). Session 2's attempts to keep rows in L2 failed for lack of memory parallelism (one
16-warp row per SM read at 27-61% of copy) but their loops reduced across the whole program
every step (a barrier per chunk) and did not unroll. Session 7 then measured a minimal looped
RMSNorm forward with one 32-warp program per row (8 bf16 a thread, unrolled loop, no barrier
in the loop) at 89% of copy with only 132 rows in flight. Here the same shape is used for the
softmax: each thread keeps its own running max and sum over its 8-16-element slices (one exp an
element plus one rescale a step, no cross-thread work until the row ends), and the rows in
flight are 132 x 256 KB = 34 MB, inside L2. Pass 2 may walk the row backwards (the last
tiles read are the likeliest still in L2) and the loads / stores may carry eviction hints.

Prints ms and the share of the 1R+1W floor for: the library kernel (JIT, as shipped),
the resident kernel over (warps, elements a thread, reverse, hints, stages), loss only and
loss + gradient, gradient to its own buffer and in place. Each result is checked against
torch in fp32 first. JIT; needs a CUDA GPU (--smoke: tiny shapes in Triton's interpreter).

Outcome (docs/perf-notes.md, "Session 8: cross-entropy with one wide program per row"): loss
only 0.671 -> 0.540 ms (16 warps, a program a row); loss + gradient at best 1.44 against 1.55
ms (32 warps, one program per SM), nothing in place: each program is latency-bound, so the
rows in flight cannot shrink to fit L2 without losing bandwidth. Not adopted.

  python benchmarks/experiment_ce_resident.py [--out DIR] [--vocab V] [--grid-sweep |
      --stage-sweep | --configs 'warps,e,unroll,programs_per_sm,hints;...']
  python benchmarks/experiment_ce_resident.py --smoke   # CPU, interpreter: checks only
"""
import argparse
import os
import sys

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from _gpu import copy_bandwidth, cross_entropy_buffers, write_rows  # noqa: E402
from kernel_src.cross_entropy.kernels import cross_entropy_fwd  # noqa: E402


@triton.jit
def _load_tiles(ptr, r, U: tl.constexpr, BLOCK: tl.constexpr, EV: tl.constexpr):
    # U full tiles issued back to back, so U loads a thread are in flight before any math
    # (ptxas does not unroll these loops itself: their bodies are long)
    x0 = tl.load(ptr + r, eviction_policy=EV).to(tl.float32)
    x1 = x0
    x2 = x0
    x3 = x0
    if U >= 2:
        x1 = tl.load(ptr + BLOCK + r, eviction_policy=EV).to(tl.float32)
    if U >= 4:
        x2 = tl.load(ptr + 2 * BLOCK + r, eviction_policy=EV).to(tl.float32)
        x3 = tl.load(ptr + 3 * BLOCK + r, eviction_policy=EV).to(tl.float32)
    return x0, x1, x2, x3


@triton.jit
def _online_step(m, s, sx, x0, x1, x2, x3, U: tl.constexpr):
    # x*: [THREADS, E] fp32; each thread owns one row of each, so every reduction is its own
    c = tl.max(x0, 1)
    if U >= 2:
        c = tl.maximum(c, tl.max(x1, 1))
    if U >= 4:
        c = tl.maximum(c, tl.maximum(tl.max(x2, 1), tl.max(x3, 1)))
    m_new = tl.maximum(m, c)
    e = tl.exp(x0 - m_new[:, None])
    v = x0
    if U >= 2:
        e += tl.exp(x1 - m_new[:, None])
        v += x1
    if U >= 4:
        e += tl.exp(x2 - m_new[:, None]) + tl.exp(x3 - m_new[:, None])
        v += x2 + x3
    return m_new, s * tl.exp(m - m_new) + tl.sum(e, 1), sx + tl.sum(v, 1)


@triton.jit
def _grad_of(x, c, lse, a, s_coef, t_coef, target):
    return a * tl.exp(x - lse) - s_coef - tl.where(c == target, t_coef, 0.0)


@triton.jit
def _grad_tiles(g_row, x_row, start, r, lse, a, s_coef, t_coef, target, U: tl.constexpr,
                BLOCK: tl.constexpr, EV2: tl.constexpr, EVS: tl.constexpr, CMS: tl.constexpr):
    x0, x1, x2, x3 = _load_tiles(x_row + start, r, U, BLOCK, EV2)
    ty = g_row.dtype.element_ty
    g = g_row + start + r
    tl.store(g, _grad_of(x0, start + r, lse, a, s_coef, t_coef, target).to(ty),
             eviction_policy=EVS, cache_modifier=CMS)
    if U >= 2:
        tl.store(g + BLOCK, _grad_of(x1, start + BLOCK + r, lse, a, s_coef, t_coef,
                                     target).to(ty), eviction_policy=EVS, cache_modifier=CMS)
    if U >= 4:
        tl.store(g + 2 * BLOCK, _grad_of(x2, start + 2 * BLOCK + r, lse, a, s_coef, t_coef,
                                         target).to(ty), eviction_policy=EVS, cache_modifier=CMS)
        tl.store(g + 3 * BLOCK, _grad_of(x3, start + 3 * BLOCK + r, lse, a, s_coef, t_coef,
                                         target).to(ty), eviction_policy=EVS, cache_modifier=CMS)


@triton.jit
def ce_resident(LOSS, GRAD, LOGITS, TARGET, SCALE, n_rows, n_cols, stride_grad, stride_logits,
                eps, WITH_GRAD: tl.constexpr, THREADS: tl.constexpr, E: tl.constexpr,
                U: tl.constexpr, STAGES: tl.constexpr, REVERSE: tl.constexpr, EV1: tl.constexpr,
                EV2: tl.constexpr, EVS: tl.constexpr, CMS: tl.constexpr):
    """Rows pid, pid + grid, ... (grid = n_rows: one row a program; smaller: persistent)."""
    BLOCK: tl.constexpr = THREADS * E
    r = tl.arange(0, THREADS)[:, None] * E + tl.arange(0, E)[None, :]
    n_tiles = n_cols // BLOCK
    n_steps = n_tiles // U  # U tiles a step; the n_tiles % U left go one by one
    tail = n_tiles * BLOCK + r
    tail_mask = tail < n_cols
    for row in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        x_row = LOGITS + row * stride_logits
        target = tl.load(TARGET + row)
        # finite start: a thread whose slice is all -inf must not make exp(-inf - -inf)
        m = tl.full([THREADS], -3.0e38, tl.float32)
        s = tl.zeros([THREADS], tl.float32)
        sx = tl.zeros([THREADS], tl.float32)
        for j in tl.range(0, n_steps, num_stages=STAGES):
            x0, x1, x2, x3 = _load_tiles(x_row + j * U * BLOCK, r, U, BLOCK, EV1)
            m, s, sx = _online_step(m, s, sx, x0, x1, x2, x3, U)
        for j in range(n_steps * U, n_tiles):
            x0, x1, x2, x3 = _load_tiles(x_row + j * BLOCK, r, 1, BLOCK, EV1)
            m, s, sx = _online_step(m, s, sx, x0, x1, x2, x3, 1)
        x = tl.load(x_row + tail, mask=tail_mask, other=float("-inf"),
                    eviction_policy=EV1).to(tl.float32)
        m, s, unused = _online_step(m, s, sx, x, x, x, x, 1)  # its sx would add the -inf
        sx += tl.sum(tl.where(tail_mask, x, 0.0), 1)
        big = tl.max(m, 0)
        lse = big + tl.log(tl.sum(s * tl.exp(m - big), 0))
        x_t = tl.load(x_row + target).to(tl.float32)
        tl.store(LOSS + row, (1.0 - eps) * (lse - x_t)
                 + eps / n_cols * (n_cols * lse - tl.sum(sx, 0)))
        if WITH_GRAD:
            a = tl.load(SCALE)
            t_coef = a * (1.0 - eps)
            s_coef = a * eps / n_cols
            g_row = GRAD + row * stride_grad
            # pass 2: the tail, the odd tiles, then U-tile steps (backwards when REVERSE)
            x = tl.load(x_row + tail, mask=tail_mask, other=0.0,
                        eviction_policy=EV2).to(tl.float32)
            tl.store(g_row + tail, _grad_of(x, tail, lse, a, s_coef, t_coef, target).to(
                g_row.dtype.element_ty), mask=tail_mask, eviction_policy=EVS, cache_modifier=CMS)
            for j in range(n_steps * U, n_tiles):
                _grad_tiles(g_row, x_row, j * BLOCK, r, lse, a, s_coef, t_coef, target, 1,
                            BLOCK, EV2, EVS, CMS)
            for j in tl.range(0, n_steps, num_stages=STAGES):
                if REVERSE:
                    step = n_steps - 1 - j
                else:
                    step = j
                _grad_tiles(g_row, x_row, step * U * BLOCK, r, lse, a, s_coef, t_coef, target,
                            U, BLOCK, EV2, EVS, CMS)


def library_call(loss, grad, logits, target, scales, with_grad, block_v, warps):
    flags = 3 if with_grad else 2  # FLAG_GRAD | FLAG_MEAN
    n_rows, n_cols = logits.shape
    cross_entropy_fwd[(n_rows,)](loss, loss, loss, grad, logits, target, scales, scales, scales,
                                 n_cols, grad.stride(0), logits.stride(0), -100, 0.0, 0.0, 1.0,
                                 flags, FEATURES=0, BLOCK_V=block_v, num_warps=warps)


def resident_call(loss, grad, logits, target, scales, with_grad, warps, e, unroll, reverse,
                  hints, grid, stages=1):
    # hints 1: keep pass 1's lines, drop pass 2's; 2: also stream the stores (st.global.cs)
    ev = (("", "", "", ""), ("evict_last", "evict_first", "evict_first", ""),
          ("evict_last", "evict_first", "", ".cs"))[hints]
    n_rows, n_cols = logits.shape
    ce_resident[(grid or n_rows,)](loss, grad, logits, target, scales, n_rows, n_cols,
                                   grad.stride(0), logits.stride(0), 0.0, WITH_GRAD=with_grad,
                                   THREADS=32 * warps, E=e, U=unroll, STAGES=stages,
                                   REVERSE=reverse,
                                   EV1=ev[0], EV2=ev[1], EVS=ev[2], CMS=ev[3], num_warps=warps)


def variants(smoke, sms, grid_sweep, stage_sweep, configs=None):
    if configs:  # "warps,e,unroll,grid,hints;...": loss + gradient; grid in programs per SM
        yield "library", dict(block_v=2048, warps=4), True
        for item in configs.split(";"):
            warps, e, unroll, per_sm, hints = map(int, item.split(","))
            yield "resident", dict(warps=warps, e=e, unroll=unroll, reverse=0, hints=hints,
                                   grid=per_sm * sms), True
        return
    if stage_sweep:  # pass 1 and 2 loads software-pipelined through shared memory (cp.async)
        for with_grad in (False, True):
            for warps, e, unroll in ((32, 8, 1), (32, 8, 2), (16, 16, 1), (16, 16, 2)):
                for stages in (2, 3, 4):
                    for grid in (0, sms):
                        yield "resident", dict(warps=warps, e=e, unroll=unroll, reverse=0,
                                               hints=int(with_grad), grid=grid,
                                               stages=stages), with_grad
        return
    if grid_sweep:  # loss + gradient with fewer rows in flight: does pass 2 start to hit L2?
        for warps, e, unroll in ((32, 8, 2), (32, 8, 4), (16, 16, 4)):
            for hints in (1, 2):
                for grid in (33, 66, 99, 132, 198, 264):
                    yield "resident", dict(warps=warps, e=e, unroll=unroll, reverse=0,
                                           hints=hints, grid=grid), True
        return
    yield "library", dict(block_v=512, warps=1), False
    yield "library", dict(block_v=2048, warps=4), True
    # (warps, elements a thread): 16 B loads; grid 0 = a program a row, else persistent
    shapes = ((1, 8),) if smoke else ((32, 8), (16, 16))
    grids = (0, 3) if smoke else (0, sms, 2 * sms)
    for with_grad in (False, True):
        for warps, e in shapes:
            for unroll in ((1, 2, 4) if not with_grad or smoke else (2, 4)):
                for grid in grids:
                    for hints in ((0, 1) if with_grad else (0,)):
                        for reverse in ((0, 1) if with_grad else (0,)):
                            yield "resident", dict(warps=warps, e=e, unroll=unroll,
                                                   reverse=reverse, hints=hints,
                                                   grid=grid), with_grad


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--out", help="folder for ce_resident.csv")
    p.add_argument("--grid-sweep", action="store_true",
                   help="only loss + gradient (own buffer) over persistent grids of 33-264")
    p.add_argument("--configs", help="only these: 'warps,e,unroll,programs_per_sm,hints;...'"
                   " (programs_per_sm 0: a program a row), loss + gradient, and the library")
    p.add_argument("--stage-sweep", action="store_true",
                   help="only software-pipelined loops (num_stages 2-4)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU, Triton's interpreter, tiny shapes: checks only, no timings")
    args = p.parse_args()
    torch.manual_seed(0)
    device = "cpu" if args.smoke else "cuda"
    n_rows, vocab = (5, 2000) if args.smoke else (args.rows, args.vocab)
    logits, target, error, scales, loss, grad, work = cross_entropy_buffers(n_rows, vocab,
                                                                           device)
    if args.smoke:
        copy_tbps = float("nan")
    else:
        copy_tbps = copy_bandwidth() / 1e12
    floor_ms = 2 * logits.numel() * logits.element_size() / copy_tbps / 1e9
    print(f"{n_rows} x {vocab} bf16; copy {copy_tbps:.2f} TB/s; read once + write once "
          f"{floor_ms:.3f} ms, three passes {1.5 * floor_ms:.3f} ms")
    print(f"{'kernel':>9} {'config':<48} {'grad':>8} {'ms':>7} {'of floor':>8} {'err':>8}")
    rows = []
    sms = 0 if args.smoke else torch.cuda.get_device_properties(0).multi_processor_count
    for kind, cfg, with_grad in variants(args.smoke, sms, args.grid_sweep,
                                             args.stage_sweep, args.configs):
        call = library_call if kind == "library" else resident_call
        for in_place in ((False, True) if with_grad and not args.grid_sweep else (False,)):
            if in_place and args.stage_sweep and cfg["grid"]:
                continue
            if in_place and kind == "library" and not args.configs:
                continue  # same kernel; the library runs in place only inside FLCE
            work.copy_(logits)
            out = work if in_place else grad

            def run():
                call(loss, out, work, target, scales, with_grad, **cfg)
            run()
            err = error(loss, out if with_grad else None)
            if args.smoke:
                ms = float("nan")
            else:
                ms = triton.testing.do_bench(run, return_mode="median")
            mode = ("in place" if in_place else "own buf") if with_grad else "loss"
            desc = " ".join(f"{k}={v}" for k, v in cfg.items())
            print(f"{kind:>9} {desc:<48} {mode:>8} {ms:7.3f} {floor_ms / ms:8.0%} {err:8.1e}",
                  flush=True)
            if err > 2e-2:
                print("  ^ WRONG RESULT", flush=True)
            rows.append(dict(kernel=kind, config=desc, grad=mode, ms=ms, err=err))
    if args.out:
        write_rows(args.out, "ce_resident_grid.csv" if args.grid_sweep else
                   "ce_resident_stages.csv" if args.stage_sweep else
                   f"ce_resident_configs_{vocab}.csv" if args.configs else "ce_resident.csv",
                   rows)


if __name__ == "__main__":
    main()
