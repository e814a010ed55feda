"""Experiment (session 8 wrote the split pair, session 9 ran it on an H200 and added the
interleaved and chained layouts): the RMSNorm backward of long rows (16K-64K columns)
without the library's persistent looped layout, which moves ~14 bytes a column against the
floor's 6 (x and dy read in pass 1 and again in pass 2, dx written, the fp32 dw partial row
read and written per step of two rows) and read 40-44% of copy at 32K-64K.

  split        row_dot (one program per row: k = rstd^3 * sum(dy * w * x) / n; x, dy: 4 B),
               then split_dx_dw over a 2-D grid of column blocks x row groups (dx, and dw in
               registers per column block; x, dy, dx: 6 B). 10 bytes a column.
  interleaved  one launch in chunks of CHUNK rows: the chunk's row programs (pass 1 the dot,
               pass 2 dx) and then its column programs (dw over the chunk's rows, added into
               one fp32 row), which find the chunk's x and dy in L2. ~6 bytes from DRAM.
  chained      as interleaved, but row programs only read (publish k) and column programs
               write dx as well as dw, waiting for their chunk's k; deadlock-free through a
               ticket counter (a program waits only on lower tickets, already running).

Outcome, H200 (docs/results/2026-12-01-norm-bwd-interleaved-session9-h200.txt; % of copy
counting 6 bytes a column):
  library (persistent looped)  32K 0.2136 ms 44%, 64K 0.2349 ms 40% (16K whole rows 0.138)
  split, best                  32K 0.1945 ms 48%, 64K 0.2108 ms 45%
  interleaved, best            32K 0.1538 ms 61%, 64K 0.1701 ms 55% (8 warps, 8192-column
                               row blocks, 3 stages, 64-row chunks); 16K 0.160 (not better)
  chained, best                32K 0.1648 ms 58%, 64K 0.1724 ms 55%
  diagnostics (16 warps, 1 stage): row programs alone 0.135 ms at 32K (70%), column
  programs alone 0.107 ms (their own floor, 4 bytes, 0.063 ms): together 0.17, less than
  the sum, so the column programs do find much of the chunk in L2.
The interleaved layout went into both norm families' kernels (CHUNK_ROWS); the split pair
and the chained variant were not adopted.

Prints, per shape, the library's backward as `liger-aot tune` times it (JIT of the shipped
kernel, the sm90 table's config) and each layout over its variants, each checked against
fp32 torch first (dx and dw), with % of copy counting 6 bytes a column. JIT; needs a CUDA
GPU (--smoke: tiny shapes in Triton's interpreter, checks only).

  python benchmarks/experiment_norm_bwd_split.py [--ns 32768,65536] [--kernels chained]
                                                 [--out DIR]
  python benchmarks/experiment_norm_bwd_split.py --smoke
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

from _gpu import library_ms, rms_norm_backward_case, row_length_sweep, write_rows  # noqa: E402


@triton.jit
def row_dot(K, X, DY, W, RSTD, n_cols, stride, BLOCK_N: tl.constexpr):
    """K[row] = rstd^3 * sum(dy * w * x) / n_cols, one program per row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N):
        c = start + cols
        m = c < n_cols
        x = tl.load(X + row * stride + c, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride + c, mask=m, other=0.0).to(tl.float32)
        w = tl.load(W + c, mask=m, other=0.0).to(tl.float32)
        acc += dy * w * x
    rstd = tl.load(RSTD + row)
    tl.store(K + row, rstd * rstd * rstd * tl.sum(acc, axis=0) / n_cols)


@triton.jit
def split_dx_dw(DX, DW_PARTIAL, X, DY, W, RSTD, K, n_rows, n_cols, stride, rows_per_group,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    """Program (j, g): columns [j BLOCK_N, (j + 1) BLOCK_N) of rows [g R, (g + 1) R), R =
    rows_per_group, BLOCK_M rows a step; writes dx there and its dw partial to row g of
    DW_PARTIAL (llama casting: xhat rounded to x's dtype)."""
    j = tl.program_id(0)
    g = tl.program_id(1)
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    first = g.to(tl.int64) * rows_per_group
    last = tl.minimum(first + rows_per_group, n_rows)
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in tl.range(0, rows_per_group, BLOCK_M, num_stages=STAGES):
        rows = first + step + tl.arange(0, BLOCK_M)
        live = rows < last
        mask = live[:, None] & col_ok[None, :]
        offs = rows[:, None] * stride + cols[None, :]
        x = tl.load(X + offs, mask=mask, other=0.0)
        xf = x.to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
        k = tl.load(K + rows, mask=live, other=0.0)[:, None]
        tl.store(DX + offs, (rstd * dy * w - k * xf).to(DX.dtype.element_ty), mask=mask)
        dw += dy * (xf * rstd).to(x.dtype).to(tl.float32)
    tl.store(DW_PARTIAL + g.to(tl.int64) * n_cols + cols, tl.sum(dw, axis=0), mask=col_ok)


@triton.jit
def _row_dots(X, DY, W, base, live, n_cols, ROW_N: tl.constexpr, STAGES: tl.constexpr):
    """sum(dy * w * x) of each row of a [ROW_M, 1] block (base: the rows' offsets), ROW_N
    columns a step, loads kept in L2 for the reads that follow (evict_last)."""
    acc = tl.zeros([base.shape[0], ROW_N], dtype=tl.float32)
    for start in tl.range(0, n_cols, ROW_N, num_stages=STAGES):
        c = start + tl.arange(0, ROW_N)
        m = live[:, None] & (c < n_cols)[None, :]
        x = tl.load(X + base + c[None, :], mask=m, other=0.0,
                    eviction_policy="evict_last").to(tl.float32)
        dy = tl.load(DY + base + c[None, :], mask=m, other=0.0,
                     eviction_policy="evict_last").to(tl.float32)
        w = tl.load(W + c, mask=c < n_cols, other=0.0).to(tl.float32)[None, :]
        acc += dy * w * x
    return tl.sum(acc, axis=1)


@triton.jit
def interleaved_bwd(DX, DW_ACC, X, DY, W, RSTD, n_rows, n_cols, stride, n_chunks,
                    CHUNK: tl.constexpr, LAG: tl.constexpr, ROW_M: tl.constexpr,
                    ROW_N: tl.constexpr, COL_M: tl.constexpr, COL_N: tl.constexpr,
                    STAGES: tl.constexpr, PARTS: tl.constexpr = 3):
    """One launch, two kinds of program, in slots of CHUNK rows. Slot s holds the row
    programs of chunk s (pass 1: k = rstd^3 sum(dy w x) / n; pass 2, column blocks walked
    backwards: dx = rstd dy w - k x; ROW_M rows each) and then the column programs of chunk
    s - LAG (COL_N columns each: dw += dy xhat over the chunk's rows, COL_M a step, added to
    the fp32 row DW_ACC). Programs start roughly in grid order, so a chunk's x and dy are read
    from DRAM by its row programs and again, from L2, by its row programs' pass 2 and by its
    column programs: about 6 bytes a column from DRAM, and no program holds a dw row.
    PARTS (diagnostic): 1 runs only the row programs, 2 only the column programs."""
    pid = tl.program_id(0)
    row_tasks: tl.constexpr = CHUNK // ROW_M
    col_tasks = tl.cdiv(n_cols, COL_N)
    per_slot = row_tasks + col_tasks
    slot = pid // per_slot
    t = pid % per_slot
    if t < row_tasks:
        if (slot < n_chunks) & (PARTS % 2 == 1):
            rows = slot.to(tl.int64) * CHUNK + t * ROW_M + tl.arange(0, ROW_M)
            live = rows < n_rows
            rstd = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
            base = rows[:, None] * stride
            dots = _row_dots(X, DY, W, base, live, n_cols, ROW_N, STAGES)
            k = rstd * rstd * rstd * (dots[:, None] / n_cols)
            n_blocks = tl.cdiv(n_cols, ROW_N)
            for b in tl.range(0, n_blocks, num_stages=STAGES):
                c = (n_blocks - 1 - b) * ROW_N + tl.arange(0, ROW_N)
                m = live[:, None] & (c < n_cols)[None, :]
                x = tl.load(X + base + c[None, :], mask=m, other=0.0).to(tl.float32)
                dy = tl.load(DY + base + c[None, :], mask=m, other=0.0).to(tl.float32)
                w = tl.load(W + c, mask=c < n_cols, other=0.0).to(tl.float32)[None, :]
                tl.store(DX + base + c[None, :], (rstd * dy * w - k * x).to(DX.dtype.element_ty),
                         mask=m)
    else:
        chunk = slot - LAG
        if (chunk >= 0) & (chunk < n_chunks) & (PARTS >= 2):
            cols = (t - row_tasks) * COL_N + tl.arange(0, COL_N)
            col_ok = cols < n_cols
            dw = tl.zeros([COL_M, COL_N], dtype=tl.float32)
            for step in tl.range(0, CHUNK, COL_M, num_stages=STAGES):
                rows = chunk.to(tl.int64) * CHUNK + step + tl.arange(0, COL_M)
                live = rows < n_rows
                m = live[:, None] & col_ok[None, :]
                offs = rows[:, None] * stride + cols[None, :]
                x = tl.load(X + offs, mask=m, other=0.0, eviction_policy="evict_first")
                dy = tl.load(DY + offs, mask=m, other=0.0,
                             eviction_policy="evict_first").to(tl.float32)
                rstd = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
                dw += dy * (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
            tl.atomic_add(DW_ACC + cols, tl.sum(dw, axis=0), mask=col_ok, sem="relaxed")


def interleaved_backward(x, dy, w, rstd, chunk, lag, row_m, row_n, col_m, col_n, warps,
                         stages, parts=3):
    """Launches interleaved_bwd (after zeroing the fp32 dw row); returns (dx, dw) and a
    function that runs it again (zeroing and the dw cast included)."""
    n_rows, n_cols = x.shape
    dx = torch.empty_like(x)
    dw_acc = torch.empty(n_cols, dtype=torch.float32, device=x.device)
    n_chunks = -(-n_rows // chunk)
    per_slot = chunk // row_m + -(-n_cols // col_n)

    def run():
        dw_acc.zero_()
        interleaved_bwd[((n_chunks + lag) * per_slot,)](
            dx, dw_acc, x, dy, w, rstd, n_rows, n_cols, x.stride(0), n_chunks, CHUNK=chunk,
            LAG=lag, ROW_M=row_m, ROW_N=row_n, COL_M=col_m, COL_N=col_n, STAGES=stages,
            PARTS=parts, num_warps=warps)
        return dw_acc.to(w.dtype)
    dw = run()
    return dx, dw, run


@triton.jit
def chained_bwd(DX, DW_ACC, K, COUNTERS, X, DY, W, RSTD, n_rows, n_cols, stride, n_chunks,
                CHUNK: tl.constexpr, LAG: tl.constexpr, ROW_M: tl.constexpr,
                ROW_N: tl.constexpr, COL_M: tl.constexpr, COL_N: tl.constexpr,
                STAGES: tl.constexpr):
    """As interleaved_bwd, but the row programs only read (pass 1: K[row] = rstd^3 sum(dy w
    x) / n) and the column programs write dx as well as dw, from the chunk's x and dy read
    again at L2: every byte crosses DRAM once, reads and writes are each in their own
    streaming loop. A column program of chunk c waits for chunk c's row programs to publish
    K. Deadlock-free: programs take their place in the slot order from a ticket counter
    (COUNTERS[0]) when they start, so every program waited on holds a lower ticket and is
    already running; row programs never wait. COUNTERS[1 + c] counts chunk c's finished row
    programs. COUNTERS must be zero at launch."""
    tid = tl.atomic_add(COUNTERS, 1, sem="relaxed")
    row_tasks: tl.constexpr = CHUNK // ROW_M
    col_tasks = tl.cdiv(n_cols, COL_N)
    per_slot = row_tasks + col_tasks
    slot = tid // per_slot
    t = tid % per_slot
    if t < row_tasks:
        if slot < n_chunks:
            rows = slot.to(tl.int64) * CHUNK + t * ROW_M + tl.arange(0, ROW_M)
            live = rows < n_rows
            base = rows[:, None] * stride
            dots = _row_dots(X, DY, W, base, live, n_cols, ROW_N, STAGES)
            rstd = tl.load(RSTD + rows, mask=live, other=0.0)
            tl.store(K + rows, rstd * rstd * rstd * (dots / n_cols), mask=live)
            tl.debug_barrier()  # every thread's K stores come before the release below
            tl.atomic_add(COUNTERS + 1 + slot, 1, sem="release")
    else:
        chunk = slot - LAG
        if (chunk >= 0) & (chunk < n_chunks):
            done = tl.atomic_add(COUNTERS + 1 + chunk, 0, sem="acquire")
            while done < row_tasks:
                done = tl.atomic_add(COUNTERS + 1 + chunk, 0, sem="acquire")
            cols = (t - row_tasks) * COL_N + tl.arange(0, COL_N)
            col_ok = cols < n_cols
            w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            dw = tl.zeros([COL_M, COL_N], dtype=tl.float32)
            for step in tl.range(0, CHUNK, COL_M, num_stages=STAGES):
                rows = chunk.to(tl.int64) * CHUNK + step + tl.arange(0, COL_M)
                live = rows < n_rows
                m = live[:, None] & col_ok[None, :]
                offs = rows[:, None] * stride + cols[None, :]
                x = tl.load(X + offs, mask=m, other=0.0, eviction_policy="evict_first")
                xf = x.to(tl.float32)
                dy = tl.load(DY + offs, mask=m, other=0.0,
                             eviction_policy="evict_first").to(tl.float32)
                rstd = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
                # .cg: K was written by other programs, read it at L2
                k = tl.load(K + rows, mask=live, other=0.0, cache_modifier=".cg")[:, None]
                tl.store(DX + offs, (rstd * dy * w - k * xf).to(DX.dtype.element_ty), mask=m)
                dw += dy * (xf * rstd).to(x.dtype).to(tl.float32)
            tl.atomic_add(DW_ACC + cols, tl.sum(dw, axis=0), mask=col_ok, sem="relaxed")


def chained_backward(x, dy, w, rstd, chunk, lag, row_m, row_n, col_m, col_n, warps, stages):
    """Launches chained_bwd (after zeroing its counters and the fp32 dw row); returns (dx,
    dw) and a function that runs it again (the zeroing and the dw cast included)."""
    n_rows, n_cols = x.shape
    dx = torch.empty_like(x)
    n_chunks = -(-n_rows // chunk)
    # one fp32 buffer: the dw row, K, then the int32 counters (one memset)
    scratch = torch.empty(n_cols + n_rows + 1 + n_chunks, dtype=torch.float32, device=x.device)
    dw_acc, k = scratch[:n_cols], scratch[n_cols:n_cols + n_rows]
    counters = scratch[n_cols + n_rows:].view(torch.int32)
    per_slot = chunk // row_m + -(-n_cols // col_n)

    def run():
        scratch.zero_()
        chained_bwd[((n_chunks + lag) * per_slot,)](
            dx, dw_acc, k, counters, x, dy, w, rstd, n_rows, n_cols, x.stride(0), n_chunks,
            CHUNK=chunk, LAG=lag, ROW_M=row_m, ROW_N=row_n, COL_M=col_m, COL_N=col_n,
            STAGES=stages, num_warps=warps)
        return dw_acc.to(w.dtype)
    dw = run()
    return dx, dw, run


def chained_variants(smoke, sms, n_cols):
    if smoke:
        for lag, stages in ((0, 1), (1, 3)):
            yield dict(chunk=4, lag=lag, row_m=1, row_n=64, col_m=2, col_n=32, warps=1,
                       stages=stages)
            yield dict(chunk=4, lag=lag, row_m=2, row_n=128, col_m=4, col_n=64, warps=2,
                       stages=stages)
        return
    for warps in (8, 16):
        for row_n in (4096, 8192):
            for stages in (1, 3):
                for chunk, lag in ((64, 1), (64, 2), (128, 1), (32, 2)):
                    yield dict(chunk=chunk, lag=lag, row_m=1, row_n=row_n, col_m=4,
                               col_n=1024, warps=warps, stages=stages)
    for warps in (8, 16):
        yield dict(chunk=64, lag=1, row_m=1, row_n=4096, col_m=2, col_n=2048, warps=warps,
                   stages=3)
        yield dict(chunk=64, lag=1, row_m=1, row_n=4096, col_m=8, col_n=512, warps=warps,
                   stages=3)
        yield dict(chunk=64, lag=1, row_m=2, row_n=4096, col_m=4, col_n=1024, warps=warps,
                   stages=3)


def split_backward(x, dy, w, rstd, dot_block, block_m, block_n, warps, groups, stages):
    """Launches the pair; returns (dx, dw) and a function that runs it again."""
    n_rows, n_cols = x.shape
    k = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    dx = torch.empty_like(x)
    rows_per_group = -(-n_rows // groups)
    groups = -(-n_rows // rows_per_group)
    partial = torch.empty(groups, n_cols, dtype=torch.float32, device=x.device)
    dot_warps = max(1, min(32, dot_block // 256))

    def run():
        row_dot[(n_rows,)](k, x, dy, w, rstd, n_cols, x.stride(0), BLOCK_N=dot_block,
                           num_warps=dot_warps)
        split_dx_dw[(triton.cdiv(n_cols, block_n), groups)](
            dx, partial, x, dy, w, rstd, k, n_rows, n_cols, x.stride(0), rows_per_group,
            BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, num_warps=warps)
        return partial.sum(0)
    dw = run()
    return dx, dw, run


def split_variants(smoke, sms, n_cols):
    if smoke:
        yield dict(dot_block=64, block_m=1, block_n=32, warps=1, groups=3, stages=1)
        yield dict(dot_block=64, block_m=2, block_n=64, warps=2, groups=2, stages=3)
        return
    for block_m, block_n, warps in ((1, 2048, 8), (2, 2048, 16), (4, 1024, 16)):
        for per_sm in (2, 4):
            for stages in (1, 3):
                yield dict(dot_block=8192, block_m=block_m, block_n=block_n, warps=warps,
                           groups=per_sm * sms, stages=stages)


def interleaved_variants(smoke, sms, n_cols):
    if smoke:
        for lag, stages in ((0, 1), (1, 3)):
            yield dict(chunk=4, lag=lag, row_m=1, row_n=64, col_m=2, col_n=32, warps=1,
                       stages=stages)
            yield dict(chunk=4, lag=lag, row_m=2, row_n=128, col_m=4, col_n=64, warps=2,
                       stages=stages)
        return
    # session 9's first H200 run: lag 0 and chunks of 64-128 rows on 16 warps were best
    # (32 warps and chunks of 32 lost everywhere); this sweep adds 8 warps and pipelining
    for warps in (8, 16):
        for row_n in (4096, 8192):
            for stages in (1, 2, 3):
                for chunk in (64, 128):
                    yield dict(chunk=chunk, lag=0, row_m=1, row_n=row_n, col_m=4, col_n=1024,
                               warps=warps, stages=stages)
    for warps in (8, 16):
        for stages in (1, 3):
            yield dict(chunk=64, lag=0, row_m=1, row_n=8192, col_m=2, col_n=2048, warps=warps,
                       stages=stages)
            yield dict(chunk=64, lag=0, row_m=2, row_n=4096, col_m=4, col_n=1024, warps=warps,
                       stages=stages)
    # where the time goes: the first run's best with only its row or only its column programs
    for parts in (1, 2):
        yield dict(chunk=64, lag=0, row_m=1, row_n=8192, col_m=4, col_n=1024, warps=16,
                   stages=1, parts=parts)


KINDS = {"split": (split_backward, split_variants),
         "interleaved": (interleaved_backward, interleaved_variants),
         "chained": (chained_backward, chained_variants)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", default="16384,32768,65536", help="row lengths; rows = 2^26 / n")
    p.add_argument("--kernels", default="interleaved,split",
                   help=f"which of {','.join(KINDS)} to time, in this order")
    p.add_argument("--out", help="folder for norm_bwd_split.csv")
    p.add_argument("--smoke", action="store_true",
                   help="CPU, Triton's interpreter, tiny shapes: checks only, no timings")
    args = p.parse_args()
    torch.manual_seed(0)
    device, shapes, copy_tbps = row_length_sweep(args.smoke, args.ns)
    sms = 0 if args.smoke else torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy {copy_tbps:.2f} TB/s; % of copy counts 6 bytes a column (x, dy read, dx written)")
    rows = []
    for n_rows, n_cols in shapes:
        x, dy, w, rstd, error = rms_norm_backward_case(n_rows, n_cols, device)
        floor_ms = 6 * n_rows * n_cols / copy_tbps / 1e9
        if not args.smoke:
            ms, tag, why = library_ms("rms_norm_bwd", n_cols, f"n_cols={n_cols},dres=False")
            print(f"{n_rows}x{n_cols} library {tag}: "
                  + (f"{ms:.4f} ms {floor_ms / ms:.0%}" if ms else f"failed: {why}"), flush=True)
            rows.append(dict(shape=f"{n_rows}x{n_cols}", kernel="library", config=tag, ms=ms,
                             err=""))
        for kind in args.kernels.split(","):
            launch, variants = KINDS[kind]
            for cfg in variants(args.smoke, sms, n_cols):
                dx, dw, run = launch(x, dy, w, rstd, **cfg)
                # a diagnostic run of part of a kernel computes part of the result: unchecked
                err = error(dx, dw) if cfg.get("parts", 3) == 3 else 0.0
                ms = float("nan") if args.smoke or err > 2e-2 else \
                    triton.testing.do_bench(run, return_mode="median")
                desc = " ".join(f"{k}={v}" for k, v in cfg.items())
                print(f"{n_rows}x{n_cols} {kind} {desc:<66} {ms:7.4f} ms {floor_ms / ms:5.0%} "
                      f"err {err:.1e}" + ("  WRONG" if err > 2e-2 else ""), flush=True)
                rows.append(dict(shape=f"{n_rows}x{n_cols}", kernel=kind, config=desc, ms=ms,
                                 err=err))
    if args.out:
        write_rows(args.out, "norm_bwd_split.csv", rows)


if __name__ == "__main__":
    main()
