"""Experiment (session 10): cross-entropy loss + gradient with each row split over several
programs, so that the row's second read finds it in L2. Three layouts (--kernel).

The library's kernel reads every 8192 x 128256 bf16 row twice from HBM (pass 1: max and sum;
pass 2: gradient) and writes the gradient: three passes, 1.48 ms at copy speed; it runs
1.54-1.72 ms. The issue asks 1.1 ms: pass 2 must be served from L2. Sessions 2 and 8 tried one
program a row with fewer rows in flight (so their working set fits L2); each such program
was latency-bound, and fewer rows in flight lost more bandwidth than the L2 hits gained.
Here rows stay many programs wide instead:

  split   program p takes slice p % SLICES of row p // SLICES, streams it once (online max
          and sum), stores its (max, sum) pair and bumps the row's arrival counter (atomic,
          acq_rel). The last to arrive combines the pairs into the row's log-sum-exp and
          writes the whole row's gradient, reading it back just after the others read it.
          Nothing waits (safe under any scheduling; the interpreter runs it too).
  coop    session 5's cooperative rows (experiment_cooperative_rows.py) in their simplest
          form: one BLOCK_V tile a program, kept in registers while the row's programs
          exchange their (max, sum, x[target]) and spin on the row's counter until all have
          arrived; then each writes its tile's gradient without a second read. Optionally with
          virtual program ids from a ticket counter (TICKETS), and SYNC 0/1 diagnostics that
          leave the exchange or the wait out (wrong results, timing only).
  banded  program ids run band by band: a band's pass-1 programs (slices, as in split; the
          last to arrive stores the row's lse), then its pass-2 programs (a slice each),
          which wait for the row's counter (only for lower ids, at most MAX_SPIN polls, then
          they compute the lse themselves: no deadlock under any scheduling).

Prediction (each): HBM traffic falls from three passes to about two, so loss + gradient
approaches 1.1 ms.

Outcome (docs/perf-notes.md, "Session 10: cross-entropy"): refuted, all three. split:
1.537 ms at best (the library 1.544-1.606), the pass-2 programs are a whole row each and
thousands are resident, as before; coop: 2.16-3.56 ms, and 2.2-2.8 ms even with no exchange
at all (SYNC 0): one-tile programs are a latency chain; banded: 1.61-1.86 ms, and Nsight
Compute counted 4.1-4.2 GB of DRAM reads (two full reads; L2 read hit rate 1-2%).

Prints ms and the share of the 1R+1W floor for the library kernel (JIT, as shipped) and the
chosen layout's configs, loss only, gradient to its own buffer and in place; each result is
checked against torch in fp32 first (banded also prints how many pass-2 programs stopped
waiting). JIT; needs a CUDA GPU (--smoke: tiny shapes in Triton's interpreter; --once: one
checked call each, no timing, for a profiler).

  python benchmarks/experiment_ce_split_rows.py [--kernel split|coop|banded] [--out DIR]
      [--vocab V] [--configs ...] [--once]
  python benchmarks/experiment_ce_split_rows.py --smoke [--kernel ...]  # CPU: checks only
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
from experiment_ce_resident import library_call  # noqa: E402


@triton.jit
def _row_slice_stats(x_row, lo, hi, BLOCK_V: tl.constexpr, STAGES: tl.constexpr,
                     EV: tl.constexpr):
    """(max, sum of exp(x - max)) of columns [lo, hi) of a row: online, BLOCK_V a step."""
    cols = tl.arange(0, BLOCK_V)
    m = tl.max(tl.full([BLOCK_V], float("-inf"), tl.float32), axis=0)
    d = tl.zeros([BLOCK_V], dtype=tl.float32)
    for start in tl.range(lo, hi, BLOCK_V, num_stages=STAGES):
        c = start + cols
        x = tl.load(x_row + c, mask=c < hi, other=float("-inf"),
                    eviction_policy=EV).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        d = d * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
    return m, tl.sum(d, axis=0)


@triton.jit
def ce_split(LOSS, GRAD, LOGITS, TARGET, STATS, COUNT, SCALES, n_cols, stride_grad,
             stride_logits, WITH_GRAD: tl.constexpr, SLICES: tl.constexpr,
             SLICE_V: tl.constexpr, BLOCK_V: tl.constexpr, STAGES: tl.constexpr,
             EV1: tl.constexpr, EV2: tl.constexpr):
    pid = tl.program_id(0)
    row = (pid // SLICES).to(tl.int64)
    part = pid % SLICES
    x_row = LOGITS + row * stride_logits
    cols = tl.arange(0, BLOCK_V)
    lo = part * SLICE_V
    m, d = _row_slice_stats(x_row, lo, tl.minimum(lo + SLICE_V, n_cols), BLOCK_V, STAGES, EV1)
    stats = STATS + row * (2 * SLICES)
    tl.store(stats + part, m)
    tl.store(stats + SLICES + part, d)
    # every thread's stores before the one thread's release
    tl.debug_barrier()
    arrived = tl.atomic_add(COUNT + row, 1, sem="acq_rel")
    if arrived == SLICES - 1:
        tl.store(COUNT + row, 0)
        k = tl.arange(0, SLICES)
        # .cg: past this SM's L1, which may hold a stale line of another row's pairs
        ms = tl.load(stats + k, cache_modifier=".cg")
        big = tl.max(ms, axis=0)
        lse = big + tl.log(tl.sum(tl.load(stats + SLICES + k, cache_modifier=".cg")
                                  * tl.exp(ms - big), axis=0))
        target = tl.load(TARGET + row)
        x_t = tl.load(x_row + target).to(tl.float32)
        tl.store(LOSS + row, lse - x_t)
        if WITH_GRAD:
            scale = tl.load(SCALES)
            g_row = GRAD + row * stride_grad
            for start in tl.range(0, n_cols, BLOCK_V, num_stages=STAGES):
                c = start + cols
                mask = c < n_cols
                x = tl.load(x_row + c, mask=mask, other=0.0, eviction_policy=EV2).to(tl.float32)
                g = scale * (tl.exp(x - lse) - tl.where(c == target, 1.0, 0.0))
                tl.store(g_row + c, g.to(GRAD.dtype.element_ty), mask=mask)


@triton.jit
def ce_coop(LOSS, GRAD, LOGITS, TARGET, STATS, COUNT, TICKET, SCALES, n_rows, n_cols,
            stride_grad, stride_logits, WITH_GRAD: tl.constexpr, SLICES_P2: tl.constexpr,
            BLOCK_V: tl.constexpr, TICKETS: tl.constexpr, SYNC: tl.constexpr):
    # A row is cdiv(n_cols, BLOCK_V) = SLICES <= SLICES_P2 programs of one BLOCK_V tile each; a program keeps its tile in registers
    # while the row's programs exchange their (max, sum, x_target) through STATS and wait for
    # each other (spinning on COUNT), then writes its tile's gradient without reading again.
    SLICES = tl.cdiv(n_cols, BLOCK_V)
    if TICKETS:
        # Virtual program ids in the order programs start: every row's earlier slices have
        # started, so the wait below cannot deadlock whatever order the hardware picks.
        vid = tl.atomic_add(TICKET, 1)
        if vid == n_rows * SLICES - 1:
            tl.store(TICKET, 0)
    else:
        vid = tl.program_id(0)
    row = (vid // SLICES).to(tl.int64)
    part = vid % SLICES
    x_row = LOGITS + row * stride_logits
    c = part * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = c < n_cols
    target = tl.load(TARGET + row)
    x = tl.load(x_row + c, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    d = tl.sum(tl.exp(x - m), axis=0)
    x_t = tl.sum(tl.where(c == target, x, 0.0), axis=0)
    stats = STATS + row * (4 * SLICES_P2)
    tl.store(stats + part, m)
    tl.store(stats + SLICES_P2 + part, d)
    tl.store(stats + 2 * SLICES_P2 + part, x_t)
    tl.debug_barrier()
    count = COUNT + row
    # SYNC (diagnostic, wrong results below 2): 0 no atomics, 1 no waiting, 2 the real thing
    if SYNC >= 1:
        arrived = tl.atomic_add(count, 1, sem="acq_rel") + 1
        if SYNC >= 2:
            while arrived < SLICES:
                arrived = tl.atomic_add(count, 0, sem="acquire")
    tl.debug_barrier()
    k = tl.arange(0, SLICES_P2)
    ms = tl.load(stats + k, mask=k < SLICES, other=float("-inf"), cache_modifier=".cg")
    big = tl.max(ms, axis=0)
    ds = tl.load(stats + SLICES_P2 + k, mask=k < SLICES, other=0.0, cache_modifier=".cg")
    lse = big + tl.log(tl.sum(tl.where(k < SLICES, ds * tl.exp(ms - big), 0.0), axis=0))
    # the last of the row to leave resets its counter for the next call
    if SYNC >= 1:
        if tl.atomic_add(count, 1, sem="relaxed") == 2 * SLICES - 1:
            tl.store(count, 0)
    if part == 0:
        x_t_row = tl.sum(tl.load(stats + 2 * SLICES_P2 + k, mask=k < SLICES, other=0.0,
                                 cache_modifier=".cg"), axis=0)
        tl.store(LOSS + row, lse - x_t_row)
    if WITH_GRAD:
        g = tl.load(SCALES) * (tl.exp(x - lse) - tl.where(c == target, 1.0, 0.0))
        tl.store(GRAD + row * stride_grad + c, g.to(GRAD.dtype.element_ty), mask=mask)


def coop_call(loss, grad, logits, target, scales, with_grad, stats, count, block_v, warps,
              tickets, sync=2):
    n_rows, n_cols = logits.shape
    slices = triton.cdiv(n_cols, block_v)
    ce_coop[(n_rows * slices,)](loss, grad, logits, target, stats, count, count[n_rows:],
                                scales, n_rows, n_cols, grad.stride(0), logits.stride(0),
                                WITH_GRAD=with_grad, SLICES_P2=triton.next_power_of_2(slices),
                                BLOCK_V=block_v,
                                TICKETS=tickets, SYNC=sync, num_warps=warps)


@triton.jit
def ce_banded(LOSS, LSE, GRAD, LOGITS, TARGET, STATS, COUNT, FALLBACKS, SCALES, n_rows, n_cols,
              stride_grad, stride_logits, WITH_GRAD: tl.constexpr, BAND_ROWS: tl.constexpr,
              SLICES: tl.constexpr, SLICE_V: tl.constexpr, BLOCK_V: tl.constexpr,
              STAGES: tl.constexpr, MAX_SPIN: tl.constexpr):
    # Program ids run band by band (BAND_ROWS rows): first the band's SLICES programs a row
    # of pass 1 (statistics of a slice; the row's last to arrive combines them, stores the
    # loss and the row's lse, then bumps the row's counter past SLICES), then its SLICES
    # programs a row of pass 2 (the gradient of a slice), which wait for that counter: the
    # band was just read, so pass 2 should find it in L2. Pass 2 waits only for programs
    # with lower ids, and at most MAX_SPIN polls: past that it computes the row's lse itself
    # (counted in FALLBACKS), so no scheduling order can deadlock it. COUNT: zeroed per call.
    per_band: tl.constexpr = BAND_ROWS * SLICES
    pid = tl.program_id(0)
    band = pid // (2 * per_band)
    k = pid % (2 * per_band)
    second = k >= per_band
    k = k % per_band
    row = (band * BAND_ROWS + k // SLICES).to(tl.int64)
    part = k % SLICES
    if row < n_rows:
        x_row = LOGITS + row * stride_logits
        lo = part * SLICE_V
        hi = tl.minimum(lo + SLICE_V, n_cols)
        count = COUNT + row
        if not second:
            m, d = _row_slice_stats(x_row, lo, hi, BLOCK_V, STAGES, "evict_last")
            stats = STATS + row * (2 * SLICES)
            tl.store(stats + part, m)
            tl.store(stats + SLICES + part, d)
            tl.debug_barrier()
            if tl.atomic_add(count, 1, sem="acq_rel") == SLICES - 1:
                j = tl.arange(0, SLICES)
                ms = tl.load(stats + j, cache_modifier=".cg")
                big = tl.max(ms, axis=0)
                lse = big + tl.log(tl.sum(tl.load(stats + SLICES + j, cache_modifier=".cg")
                                          * tl.exp(ms - big), axis=0))
                x_t = tl.load(x_row + tl.load(TARGET + row)).to(tl.float32)
                tl.store(LOSS + row, lse - x_t)
                tl.store(LSE + row, lse)
                tl.debug_barrier()
                tl.atomic_add(count, 1, sem="release")
        elif WITH_GRAD:
            seen = tl.atomic_add(count, 0, sem="acquire")
            polls = tl.full([], 0, tl.int32)
            while (seen <= SLICES) & (polls < MAX_SPIN):
                seen = tl.atomic_add(count, 0, sem="acquire")
                polls += 1
            tl.debug_barrier()
            if seen > SLICES:
                lse = tl.load(LSE + row, cache_modifier=".cg")
            else:
                tl.atomic_add(FALLBACKS, 1, sem="relaxed")
                m, d = _row_slice_stats(x_row, 0, n_cols, BLOCK_V, STAGES, "")
                lse = m + tl.log(d)
            target = tl.load(TARGET + row)
            scale = tl.load(SCALES)
            g_row = GRAD + row * stride_grad
            cols = tl.arange(0, BLOCK_V)
            for start in tl.range(lo, hi, BLOCK_V, num_stages=STAGES):
                c = start + cols
                mask = c < hi
                x = tl.load(x_row + c, mask=mask, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
                g = scale * (tl.exp(x - lse) - tl.where(c == target, 1.0, 0.0))
                tl.store(g_row + c, g.to(GRAD.dtype.element_ty), mask=mask)


def banded_call(loss, grad, logits, target, scales, with_grad, stats, count, band, slices,
                block_v, warps, stages=3, max_spin=4096):
    n_rows, n_cols = logits.shape
    slice_v = triton.cdiv(triton.cdiv(n_cols, slices), block_v) * block_v
    count[:n_rows + 1].zero_()  # the rows' counters and the fallback count
    ce_banded[(triton.cdiv(n_rows, band) * 2 * band * slices,)](
        loss, stats[n_rows * 2 * slices:], grad, logits, target, stats, count, count[n_rows:],
        scales, n_rows, n_cols, grad.stride(0), logits.stride(0), WITH_GRAD=with_grad,
        BAND_ROWS=band, SLICES=slices, SLICE_V=slice_v, BLOCK_V=block_v, STAGES=stages,
        MAX_SPIN=max_spin, num_warps=warps)


def split_call(loss, grad, logits, target, scales, with_grad, stats, count, slices, block_v,
               warps, stages, hints):
    # hints 1: pass 1 keeps its lines in L2 (evict_last), pass 2 drops them (evict_first)
    ev1, ev2 = (("", ""), ("evict_last", "evict_first"))[hints]
    n_rows, n_cols = logits.shape
    slice_v = triton.cdiv(triton.cdiv(n_cols, slices), block_v) * block_v
    ce_split[(n_rows * slices,)](loss, grad, logits, target, stats, count, scales, n_cols,
                                 grad.stride(0), logits.stride(0), WITH_GRAD=with_grad,
                                 SLICES=slices, SLICE_V=slice_v, BLOCK_V=block_v,
                                 STAGES=stages, EV1=ev1, EV2=ev2, num_warps=warps)


def variants(smoke, kernel, configs):
    yield "library", dict(block_v=2048, warps=4)
    if kernel == "banded":
        if smoke:
            for band, slices in ((2, 1), (2, 2), (3, 4)):
                yield "banded", dict(band=band, slices=slices, block_v=128, warps=1, stages=1)
            return
        for item in (configs or "64,8,2048,4;32,8,2048,4;128,8,2048,4;64,4,2048,4;"
                     "64,8,4096,8;64,16,2048,4;16,8,2048,4").split(";"):
            band, slices, block_v, warps = map(int, item.split(","))
            yield "banded", dict(band=band, slices=slices, block_v=block_v, warps=warps)
        return
    if kernel == "coop":  # configs "block_v,warps,tickets,sync;..."
        if smoke:
            # one slice a row only: the interpreter runs programs one after the other, so a
            # row of several would wait forever for its second program
            yield "coop", dict(block_v=1024, warps=1, tickets=1)
            return
        default = ";".join(f"{b},{w},{t},2" for b, w in ((4096, 4), (4096, 8), (8192, 8),
                                                         (8192, 16), (16384, 16), (16384, 32))
                           for t in (0, 1))
        for item in (configs or default).split(";"):
            b, w, t, sync = map(int, item.split(","))
            yield "coop", dict(block_v=b, warps=w, tickets=t, sync=sync)
        return
    if smoke:
        for slices in (1, 2, 4):  # powers of two (tl.arange)
            yield "split", dict(slices=slices, block_v=128, warps=1, stages=1, hints=1)
        return
    for slices in (1, 2, 4, 8, 16, 32):
        for block_v, warps in ((2048, 4), (4096, 8), (8192, 16)):
            for hints in (0, 1):
                yield "split", dict(slices=slices, block_v=block_v, warps=warps, stages=3,
                                    hints=hints)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--out", help="folder for ce_split_rows_<vocab>.csv")
    p.add_argument("--kernel", choices=("split", "coop", "banded"), default="banded",
                   help="split: the last arriver does pass 2 (run 1); coop: one tile a "
                   "program, the row's programs wait for each other (runs 2-3); banded: "
                   "pass 1 and pass 2 programs band by band")
    p.add_argument("--configs", help="coop: 'block_v,warps,tickets,sync;...' (sync 0 and 1: "
                   "timing diagnostics without the wait, results not checked); banded: "
                   "'band_rows,slices,block_v,warps;...'")
    p.add_argument("--once", action="store_true",
                   help="run and check each variant once, no timings (for ncu)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU, Triton's interpreter, tiny shapes: checks only, no timings")
    args = p.parse_args()
    torch.manual_seed(0)
    device = "cpu" if args.smoke else "cuda"
    n_rows, vocab = (5, 1000) if args.smoke else (args.rows, args.vocab)
    logits, target, error, scales, loss, grad, work = cross_entropy_buffers(n_rows, vocab,
                                                                           device)
    stats = torch.empty(n_rows * 4 * 128, device=device)  # banded: the rows' lse at the end
    count = torch.zeros(n_rows + 1, dtype=torch.int32, device=device)  # rows', then the ticket
    copy_tbps = float("nan") if args.smoke or args.once else copy_bandwidth() / 1e12
    floor_ms = 2 * logits.numel() * logits.element_size() / copy_tbps / 1e9
    print(f"{n_rows} x {vocab} bf16; copy {copy_tbps:.2f} TB/s; read once + write once "
          f"{floor_ms:.3f} ms, three passes {1.5 * floor_ms:.3f} ms")
    print(f"{'kernel':>8} {'config':<50} {'grad':>8} {'ms':>7} {'of floor':>8} {'err':>8}")
    rows = []
    for kind, cfg in variants(args.smoke, args.kernel, args.configs):
        for with_grad, in_place in ((False, False), (True, False), (True, True)):
            work.copy_(logits)
            out = work if in_place else grad
            loss.fill_(float("nan"))
            out.fill_(float("nan")) if not in_place else None

            def run():
                if kind == "library":
                    library_call(loss, out, work, target, scales, with_grad, **cfg)
                elif kind == "banded":
                    banded_call(loss, out, work, target, scales, with_grad, stats, count,
                                **cfg)
                elif kind == "coop":
                    coop_call(loss, out, work, target, scales, with_grad, stats, count, **cfg)
                else:
                    split_call(loss, out, work, target, scales, with_grad, stats, count, **cfg)
            run()
            err = error(loss, out if with_grad else None)
            # every last arriver must reset its counter (banded: zeroed per call; its slot
            # n_rows counts the pass-2 programs that stopped waiting)
            leftover = 0 if kind == "banded" else int(count.sum().item())
            fallbacks = int(count[n_rows].item()) if kind == "banded" else 0
            ms = float("nan") if args.smoke or args.once else triton.testing.do_bench(
                run, return_mode="median")
            if in_place:  # do_bench ran it again on its own gradient: results are moot
                work.copy_(logits)
            mode = ("in place" if in_place else "own buf") if with_grad else "loss"
            desc = " ".join(f"{k}={v}" for k, v in cfg.items())
            print(f"{kind:>8} {desc:<50} {mode:>8} {ms:7.3f} {floor_ms / ms:8.0%} {err:8.1e}"
                  + (f"  fallbacks {fallbacks}, last timed call "
                     f"{int(count[n_rows].item())}" if kind == "banded" else ""), flush=True)
            if kind == "coop" and cfg.get("sync", 2) < 2:
                count.zero_()
                err = float("nan")  # no exchange: wrong by design
            elif err > 2e-2 or leftover or err != err:
                print(f"  ^ WRONG RESULT (counters left: {leftover})", flush=True)
                if args.smoke:
                    sys.exit(1)
            rows.append(dict(kernel=kind, config=desc, grad=mode, ms=ms, err=err))
    if args.out:
        write_rows(args.out, f"ce_{args.kernel}_rows_{vocab}.csv", rows)


if __name__ == "__main__":
    main()
