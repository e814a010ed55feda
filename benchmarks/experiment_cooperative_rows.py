"""Experiment (session 5): keep each row on chip by splitting it across a group of co-resident
programs that exchange per-row partial sums through global memory, so every element is read
once and written once.

Cross-entropy loss + gradient at 8192 x 128256 reads the logits twice in the row kernel (the
three-pass floor, 1.49 ms); the looped RMSNorm forward (32K, 64K) and backward (16K+) read x
(and dy) twice as well. Here a group of G = cdiv(N, BLOCK) programs owns BLOCK_M rows at a
time, program j holding columns [j*BLOCK, (j+1)*BLOCK) in registers. The grid never exceeds
what the driver says fits on the GPU at once (cuOccupancyMaxActiveBlocksPerMultiprocessor),
so every group's programs run together. The exchange (_exchange) publishes each partial as a
64-bit word whose high half is the round's tag (relaxed atomics, no fences: a word is valid
on its own) and polls the group's words until all carry the tag. PREFETCH issues the next
rows' loads before waiting. The spin is capped per program (a stuck run sets a flag and ends
instead of hanging this script). Outcome: docs/perf-notes.md, "Rows split across programs".

JIT (an experiment, not the library's path); needs a CUDA GPU.

  python benchmarks/experiment_cooperative_rows.py [--out DIR] [--only ce|rms|barrier]
"""
import argparse
import csv
import ctypes
import os

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from _gpu import copy_bandwidth, cross_entropy_case, rms_norm_backward_case

SPIN_CAP = tl.constexpr(1 << 20)  # polls per program in all: a stuck run ends


@triton.jit
def _exchange(SLOTS, STUCK, group, member, n_groups, phase, vals, spins,
              GROUP: tl.constexpr, GROUP_P2: tl.constexpr, BLOCK_M: tl.constexpr,
              NV: tl.constexpr):
    """Publish this member's [BLOCK_M, NV] fp32 partials and return every member's as
    [BLOCK_M, GROUP_P2, NV] (members >= GROUP read 0). Each 64-bit word carries its round's
    tag in the high half, so a word is valid on its own: relaxed atomics, no fences. Two
    slots by round parity: a member can be at most one round ahead of any other."""
    tag = (phase + 1).to(tl.int64)
    base = SLOTS + ((phase % 2) * n_groups + group).to(tl.int64) * (BLOCK_M * GROUP_P2 * NV)
    mm = tl.arange(0, BLOCK_M)[:, None]
    kk = tl.arange(0, NV)[None, :]
    word = (vals.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (tag << 32)
    tl.atomic_xchg(base + (mm * GROUP_P2 + member) * NV + kk, word, sem="relaxed", scope="gpu")
    m3 = tl.arange(0, BLOCK_M)[:, None, None]
    j3 = tl.arange(0, GROUP_P2)[None, :, None]
    k3 = tl.arange(0, NV)[None, None, :]
    ptrs = base + (m3 * GROUP_P2 + j3) * NV + k3
    live = (j3 < GROUP) & (m3 >= 0) & (k3 >= 0)
    ready = 0
    while (ready == 0) & (spins < SPIN_CAP):
        polled = tl.load(ptrs, mask=live, other=tag << 32, volatile=True)
        ready = tl.min(((polled >> 32) == tag).to(tl.int32))
        spins += 1
    if spins >= SPIN_CAP:
        tl.store(STUCK, 1)
    # Every warp polls on its own, and only one thread publishes: without this barrier a
    # lagging warp could still be polling this round's slots after the publishing warp has
    # gone on two rounds and overwritten them. After it, the slots are stable until this
    # program publishes again, so one fresh load gives the values (the compiler may read
    # the polled words more than once, in different layouts, so they are not used).
    tl.debug_barrier()
    words = tl.load(ptrs, mask=live, other=tag << 32, volatile=True)
    return (words & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True), spins


@triton.jit
def _member(GROUP: tl.constexpr):
    """(group, member, n_groups) of this program: groups of GROUP consecutive programs."""
    pid = tl.program_id(0)
    return pid // GROUP, pid % GROUP, tl.num_programs(0) // GROUP


@triton.jit
def _columns(member, n_cols, BLOCK: tl.constexpr):
    """The member's columns of a row and their mask."""
    cols = member * BLOCK + tl.arange(0, BLOCK)
    return cols, cols < n_cols


@triton.jit
def barrier_only(SLOTS, STUCK, rounds, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
                 BLOCK_M: tl.constexpr):
    group, member, n_groups = _member(GROUP)
    acc = tl.zeros([BLOCK_M, 1], dtype=tl.float32)
    spins = 0
    for phase in range(0, rounds):
        allv, spins = _exchange(SLOTS, STUCK, group, member, n_groups, phase, acc + 1.0, spins,
                         GROUP, GROUP_P2, BLOCK_M, 1)
        acc += tl.sum(allv, axis=1) - GROUP
    tl.store(STUCK + 1 + tl.program_id(0), tl.sum(tl.sum(acc, axis=1), axis=0).to(tl.int32))


@triton.jit
def ce_tag(LOSS, GRAD, LOGITS, TARGET, SLOTS, STUCK, n_rows, n_cols, stride, scale,
           GROUP: tl.constexpr, GROUP_P2: tl.constexpr, BLOCK_M: tl.constexpr,
           BLOCK_V: tl.constexpr, PREFETCH: tl.constexpr):
    group, member, n_groups = _member(GROUP)
    cols, cmask = _columns(member, n_cols, BLOCK_V)
    mm = tl.arange(0, BLOCK_M)
    kk = tl.arange(0, 4)[None, :]
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    rows = group.to(tl.int64) * BLOCK_M + mm
    x = tl.load(LOGITS + rows[:, None] * stride + cols[None, :],
                mask=(rows < n_rows)[:, None] & cmask[None, :], other=float("-inf")).to(tl.float32)
    phase = 0
    spins = 0
    for rb in range(group, n_blocks, n_groups):
        rows = rb.to(tl.int64) * BLOCK_M + mm
        rmask = rows < n_rows
        offs = rows[:, None] * stride + cols[None, :]
        if not PREFETCH:
            x = tl.load(LOGITS + offs, mask=rmask[:, None] & cmask[None, :],
                        other=float("-inf")).to(tl.float32)
        target = tl.load(TARGET + rows, mask=rmask, other=0)
        hit = cols[None, :] == target[:, None]
        m_j = tl.max(x, axis=1)
        d_j = tl.sum(tl.exp(x - m_j[:, None]), axis=1)
        t_j = tl.sum(tl.where(hit, x, 0.0), axis=1)
        vals = tl.where(kk == 0, m_j[:, None], tl.where(kk == 1, d_j[:, None], t_j[:, None]))
        if PREFETCH:
            nxt = rows + n_groups * BLOCK_M
            x_next = tl.load(LOGITS + nxt[:, None] * stride + cols[None, :],
                             mask=(nxt < n_rows)[:, None] & cmask[None, :],
                             other=float("-inf")).to(tl.float32)
        allv, spins = _exchange(SLOTS, STUCK, group, member, n_groups, phase, vals, spins,
                                GROUP, GROUP_P2, BLOCK_M, 4)
        k3 = tl.arange(0, 4)[None, None, :]
        j2 = tl.arange(0, GROUP_P2)[None, :]
        pm = tl.where(j2 < GROUP, tl.sum(tl.where(k3 == 0, allv, 0.0), axis=2), float("-inf"))
        pd = tl.sum(tl.where(k3 == 1, allv, 0.0), axis=2)
        x_t = tl.sum(tl.sum(tl.where(k3 == 2, allv, 0.0), axis=2), axis=1)
        m = tl.max(pm, axis=1)
        lse = m + tl.log(tl.sum(pd * tl.exp(pm - m[:, None]), axis=1))
        if member == 0:
            tl.store(LOSS + rows, lse - x_t, mask=rmask)
        g = scale * (tl.exp(x - lse[:, None]) - tl.where(hit, 1.0, 0.0))
        tl.store(GRAD + offs, g.to(GRAD.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])
        if PREFETCH:
            x = x_next
        phase += 1


@triton.jit
def rms_tag_fwd(Y, X, W, RSTD, SLOTS, STUCK, n_rows, n_cols, eps,
                GROUP: tl.constexpr, GROUP_P2: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    group, member, n_groups = _member(GROUP)
    cols, cmask = _columns(member, n_cols, BLOCK_N)
    mm = tl.arange(0, BLOCK_M)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    rows = group.to(tl.int64) * BLOCK_M + mm
    x = tl.load(X + rows[:, None] * n_cols + cols[None, :],
                mask=(rows < n_rows)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    phase = 0
    spins = 0
    for rb in range(group, n_blocks, n_groups):
        rows = rb.to(tl.int64) * BLOCK_M + mm
        rmask = rows < n_rows
        offs = rows[:, None] * n_cols + cols[None, :]
        if not PREFETCH:
            x = tl.load(X + offs, mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        if PREFETCH:
            nxt = rows + n_groups * BLOCK_M
            x_next = tl.load(X + nxt[:, None] * n_cols + cols[None, :],
                             mask=(nxt < n_rows)[:, None] & cmask[None, :],
                             other=0.0).to(tl.float32)
        allv, spins = _exchange(SLOTS, STUCK, group, member, n_groups, phase,
                                tl.sum(x * x, axis=1)[:, None], spins, GROUP, GROUP_P2,
                                BLOCK_M, 1)
        ss = tl.sum(tl.sum(allv, axis=2), axis=1)
        rstd = 1.0 / tl.sqrt(ss / n_cols + eps)
        y = (x * rstd[:, None]).to(Y.dtype.element_ty).to(tl.float32) * w[None, :]
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])
        if member == 0:
            tl.store(RSTD + rows, rstd, mask=rmask)
        if PREFETCH:
            x = x_next
        phase += 1


@triton.jit
def rms_tag_bwd(DX, DWP, DY, X, W, RSTD, SLOTS, STUCK, n_rows, n_cols,
                GROUP: tl.constexpr, GROUP_P2: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    group, member, n_groups = _member(GROUP)
    cols, cmask = _columns(member, n_cols, BLOCK_N)
    mm = tl.arange(0, BLOCK_M)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    rows = group.to(tl.int64) * BLOCK_M + mm
    offs = rows[:, None] * n_cols + cols[None, :]
    ok = (rows < n_rows)[:, None] & cmask[None, :]
    x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)
    phase = 0
    spins = 0
    for rb in range(group, n_blocks, n_groups):
        rows = rb.to(tl.int64) * BLOCK_M + mm
        rmask = rows < n_rows
        offs = rows[:, None] * n_cols + cols[None, :]
        ok = rmask[:, None] & cmask[None, :]
        if not PREFETCH:
            x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
            dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        xh = x * rstd[:, None]
        gw = dy * w[None, :]
        if PREFETCH:
            nxt = offs + n_groups * BLOCK_M * n_cols
            ok_next = ((rows + n_groups * BLOCK_M) < n_rows)[:, None] & cmask[None, :]
            x_next = tl.load(X + nxt, mask=ok_next, other=0.0).to(tl.float32)
            dy_next = tl.load(DY + nxt, mask=ok_next, other=0.0).to(tl.float32)
        allv, spins = _exchange(SLOTS, STUCK, group, member, n_groups, phase,
                                tl.sum(gw * xh, axis=1)[:, None], spins, GROUP, GROUP_P2,
                                BLOCK_M, 1)
        c = tl.sum(tl.sum(allv, axis=2), axis=1) / n_cols
        tl.store(DX + offs, (rstd[:, None] * (gw - xh * c[:, None])).to(DX.dtype.element_ty),
                 mask=ok)
        dw += tl.sum(dy * xh, axis=0)
        if PREFETCH:
            x = x_next
            dy = dy_next
        phase += 1
    tl.store(DWP + group.to(tl.int64) * n_cols + cols, dw, mask=cmask)


_libcuda = None


def max_active_per_sm(compiled, threads: int) -> int:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor for a compiled Triton kernel."""
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_int()
    rc = _libcuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(n), ctypes.c_void_p(compiled.function), ctypes.c_int(threads),
        ctypes.c_size_t(compiled.metadata.shared))
    assert rc == 0, rc
    return n.value


def cooperative_launch(kernel, n_units, group, warps, per_sm, make_args, constexprs,
                       words_per_group):
    """Compile on one group, then launch the largest grid that fits (at most per_sm per SM):
    returns (run, programs, fits, regs, spills, stuck) or None when a group cannot fit."""
    dev = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    group_p2 = triton.next_power_of_2(group)
    stuck = torch.zeros(1 + 4 * sms * max(per_sm, 1), dtype=torch.int32, device="cuda")

    def slots(n_groups):
        return torch.zeros(2 * n_groups * words_per_group * group_p2, dtype=torch.int64,
                           device="cuda")
    compiled = kernel[(group,)](*make_args(slots(1), stuck, 1), GROUP=group,
                                GROUP_P2=group_p2, num_warps=warps, **constexprs)
    fits = max_active_per_sm(compiled, warps * 32)
    if fits * sms < group or per_sm > fits:
        return None
    n_groups = max(1, min(n_units, per_sm * sms // group))

    def run():
        kernel[(n_groups * group,)](*make_args(slots(n_groups), stuck, n_groups), GROUP=group,
                                    GROUP_P2=group_p2, num_warps=warps, **constexprs)
    return run, n_groups * group, fits, compiled.n_regs, compiled.n_spills, stuck


def report(rows_out, op, n, name, ms, floor_ms, err, got):
    run, programs, fits, regs, spills, stuck = got
    flag = " STUCK" if stuck[0].item() else ""
    print(f"  {op} {name}: {ms:.4f} ms ({floor_ms / ms:.0%} of floor) err {err:.1e} "
          f"programs {programs} regs {regs} spills {spills} fit/SM {fits}{flag}", flush=True)
    rows_out.append((op, n, name, programs, regs, ms, floor_ms / ms, err))
    stuck.zero_()


def bench_barrier(rows_out):
    print("\nbarrier only: us per round (1000 rounds)")
    for group in (2, 8, 32):
        for warps in (8, 4):
            for per_sm in (1, 2, 4):
                for block_m in (1, 4):
                    rounds = 1000

                    def make_args(slots, stuck, n_groups):
                        return (slots, stuck, rounds)
                    got = cooperative_launch(barrier_only, 1 << 20, group, warps, per_sm,
                                             make_args, dict(BLOCK_M=block_m), block_m)
                    if got is None:
                        continue
                    run = got[0]
                    run()
                    torch.cuda.synchronize()
                    ms = do_bench(run, warmup=5, rep=50)
                    bad = int(got[5][1:].abs().sum().item())
                    name = f"g{group} w{warps} pps{per_sm} m{block_m}"
                    print(f"  {name}: {ms * 1e3 / rounds:.2f} us/round "
                          f"{'STUCK' if got[5][0].item() else ''}{' WRONG' if bad else ''}",
                          flush=True)
                    rows_out.append(("barrier", group, name, got[1], got[3], ms, 0.0, bad))
                    got[5].zero_()


def bench_ce(copy, rows_out):
    from liger_aot.kernel_src.cross_entropy.kernels import cross_entropy_fwd
    n_rows, vocab = 8192, 128256
    logits, target, error = cross_entropy_case(n_rows, vocab)
    loss = torch.empty(n_rows, dtype=torch.float32, device="cuda")
    grad = torch.empty_like(logits)
    floor_ms = 2 * logits.numel() * 2 / copy * 1e3
    print(f"\ncross entropy {n_rows} x {vocab}: two-pass floor {floor_ms:.3f} ms")
    dummy = loss
    scales = torch.tensor([1.0 / n_rows, 1.0 / n_rows, 0.0], device="cuda")

    def row_kernel():
        cross_entropy_fwd[(n_rows,)](loss, dummy, dummy, grad, logits, target, dummy, scales,
                                     dummy, vocab, vocab, vocab, -100, 0.0, 0.0, 1.0, 3,
                                     FEATURES=0, BLOCK_V=2048, num_warps=4)
    row_kernel()
    err = error(loss, grad)
    ms = do_bench(row_kernel, warmup=25, rep=200)
    print(f"  row kernel BLOCK_V 2048 w4: {ms:.3f} ms ({floor_ms / ms:.0%}) err {err:.1e}")
    rows_out.append(("ce", vocab, "row 2048 w4", "", "", ms, floor_ms / ms, err))
    for block_m, block, warps in ((1, 4096, 4), (2, 2048, 4), (4, 1024, 4), (1, 8192, 8),
                                  (2, 4096, 8)):
        group = triton.cdiv(vocab, block)
        for per_sm in (1, 2, 3, 4, 6, 8):
            for prefetch in (True,):
                def make_args(slots, stuck, n_groups):
                    return (loss, grad, logits, target, slots, stuck, n_rows, vocab, vocab,
                            1.0 / n_rows)
                got = cooperative_launch(ce_tag, triton.cdiv(n_rows, block_m), group, warps,
                                         per_sm, make_args,
                                         dict(BLOCK_M=block_m, BLOCK_V=block, PREFETCH=prefetch),
                                         block_m * 4)
                if got is None:
                    continue
                loss.zero_()
                grad.zero_()
                got[0]()
                torch.cuda.synchronize()
                err = error(loss, grad)
                ms = do_bench(got[0], warmup=25, rep=100)
                name = (f"m{block_m} {block} w{warps} g{group} pps{per_sm}"
                        f"{' pf' if prefetch else ''}")
                report(rows_out, "ce", vocab, name, ms, floor_ms, err, got)


def bench_rms(copy, rows_out):
    for n_cols in (16384, 32768, 65536):
        n_rows = (1 << 26) // n_cols
        x, dy, w, rstd_ref, error = rms_norm_backward_case(n_rows, n_cols)
        y = torch.empty_like(x)
        rstd = torch.empty(n_rows, dtype=torch.float32, device="cuda")
        dx = torch.empty_like(x)
        floor_ms = 2 * x.numel() * 2 / copy * 1e3
        xf = x.float()
        y_ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(
            torch.bfloat16).float() * w.float()
        print(f"\nRMSNorm {n_rows} x {n_cols}: forward floor {floor_ms:.4f} ms, "
              f"backward floor {1.5 * floor_ms:.4f} ms")
        for block_m, block, warps in ((1, 4096, 4), (2, 2048, 4), (4, 1024, 4), (2, 4096, 8),
                                      (4, 2048, 8)):
            group = triton.cdiv(n_cols, block)
            for per_sm in (1, 2, 3, 4, 6, 8):
                prefetch = True
                name = f"m{block_m} {block} w{warps} g{group} pps{per_sm}"
                units = triton.cdiv(n_rows, block_m)

                def fwd_args(slots, stuck, n_groups):
                    return (y, x, w, rstd, slots, stuck, n_rows, n_cols, 1e-6)
                got = cooperative_launch(rms_tag_fwd, units, group, warps, per_sm, fwd_args,
                                         dict(BLOCK_M=block_m, BLOCK_N=block, PREFETCH=prefetch),
                                         block_m)
                if got is not None:
                    y.zero_()
                    got[0]()
                    torch.cuda.synchronize()
                    err = ((y.float() - y_ref).norm() / y_ref.norm()).item()
                    ms = do_bench(got[0], warmup=25, rep=100)
                    report(rows_out, "rms_fwd", n_cols, name, ms, floor_ms, err, got)
                holder = {}

                def bwd_args(slots, stuck, n_groups):
                    holder["dwp"] = torch.empty(n_groups, n_cols, dtype=torch.float32,
                                                device="cuda")
                    return (dx, holder["dwp"], dy, x, w, rstd_ref, slots, stuck, n_rows, n_cols)
                got = cooperative_launch(rms_tag_bwd, units, group, warps, per_sm, bwd_args,
                                         dict(BLOCK_M=block_m, BLOCK_N=block, PREFETCH=prefetch),
                                         block_m)
                if got is None:
                    continue

                def bwd(run=got[0]):
                    run()
                    return holder["dwp"].sum(0).to(torch.bfloat16)
                dx.zero_()
                dw = bwd()
                torch.cuda.synchronize()
                err = error(dx, dw)
                ms = do_bench(bwd, warmup=25, rep=100)
                report(rows_out, "rms_bwd", n_cols, name, ms, 1.5 * floor_ms, err, got)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="directory for the CSV")
    parser.add_argument("--only", choices=("barrier", "ce", "rms"), default=None)
    args = parser.parse_args()
    copy = copy_bandwidth()
    print(f"copy bandwidth {copy / 1e9:.0f} GB/s")
    rows = []
    if args.only in (None, "ce"):
        bench_ce(copy, rows)
    if args.only in (None, "rms"):
        bench_rms(copy, rows)
    if args.only in (None, "barrier"):
        bench_barrier(rows)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "experiment_cooperative_rows.csv"), "w",
                  newline="") as f:
            out = csv.writer(f)
            out.writerow(("op", "n", "variant", "programs", "regs", "ms", "of_floor", "err"))
            out.writerows(rows)


if __name__ == "__main__":
    main()
