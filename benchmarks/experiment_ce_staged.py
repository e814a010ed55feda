"""Experiment (session 13): cross-entropy loss + gradient with each row read once, its slices
held in shared memory by the programs of a group that exchange their partial statistics.

The two-pass kernel (cross_entropy_fwd) reads every 8192 x 128256 bf16 row twice from HBM
(pass 1: max and sum; pass 2: gradient) and writes the gradient: three passes, 1.48 ms at
copy speed; it runs 1.41 ms here (1.54-1.72 in earlier sessions' suites) against the issue's
1.1 ms (read once + write once: 0.99 ms). Five layouts in sessions 2, 8 and 10 tried to serve
pass 2 from L2 and lost. A 256 KB row does not fit one SM's shared memory, but a slice of it
does, and Gluon (Triton 3.6) can hold it there: the staged kernel
(kernel_src/cross_entropy/kernels.py, cross_entropy_fwd_staged; its comment says how a group
of persistent programs shares a row). This script sweeps its configs:

  BLOCK_N,CHUNKS,SLOTS,warps,per_sm,maxnreg   chunk columns, chunks a slice, ring slots,
                                               warps, programs an SM (the grid), ptxas's
                                               register cap (0: none)

Prediction: two passes of HBM traffic at the ~80% of copy the staged norm forward holds at
64K columns: ~1.2 ms. Outcome (H200, docs/perf-notes.md "Session 13"): the first versions
(8-32 warps, 1-2 programs an SM) ran 1.7-3.0 ms: Gluon puts a CTA barrier at every chunk of
the ring, so a program's warps wait in lock step and only other programs fill the SM, and the
plain exp lowering cost six instructions an exp. With one-MUFU exps, masks only where a chunk
needs one, and 4-warp programs 8-12 an SM: 1.20-1.26 ms (82% of 1R+1W), 2.47 at 256000
columns, both in place too; the library took 1024 x 8 columns, 11 slots, 9 an SM, 56
registers. Two other layouts, not kept (session 13 raw results): the next row's pass 1
before this row's wait (LAG) and each slice as one [CHUNKS, ROWS, 8] tensor (fewer
barriers): neither helped at 1-2 programs an SM. Session 14: the group's arrival counter
(release / acquire) replaced by tagged words (relaxed, no fence): 1.284 -> 1.188 ms with no
ignored row, 2.614 -> 2.421 at 256000 columns (--ignore-every 0; the commit before that
change has the choice, docs/results/2026-12-01-ce-staged-exchange-session14-h200.txt).
Session 19: the kernel's chunks cut from ~190 to ~105 issued instructions (two passes, 8
columns a thread): the ring one slice (SLOTS = CHUNKS), one masked copy a chunk, bf16
widened by shift and mask, the n_cols mask only in its chunk: 1.180 -> 1.082-1.092 ms at
128256 (91% of 1R+1W), 2.40 -> 2.18 at 256000; 9-12 programs an SM alike, two slices of
ring at 6 an SM 8% slower (docs/results/2026-12-02-ce-staged-session19-h200.txt).
Session 22: 2-warp programs 12 an SM (64 registers) 1.070-1.074 ms at 128256 against
1.085-1.090, level at 256000; the library took them.

Prints ms and the share of the 1R+1W floor for the two-pass kernel (JIT, as shipped), the
op's own launch (op_launch: the AOT build where there is one) and each staged config,
gradient to its own buffer and in place; each result is checked against torch in fp32 first
(loss per row and the gradient of four rows, a seventh of the rows ignored unless
--ignore-every says otherwise). JIT; needs a CUDA GPU (--compile-only: sm90 ptxas here,
registers, spills and shared memory of each config).

  python benchmarks/experiment_ce_staged.py [--vocab 128256 256000] [--configs ...] [--out DIR]
  python benchmarks/experiment_ce_staged.py --compile-only [--configs ...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from kernel_src.cross_entropy import spec  # noqa: E402
from kernel_src.cross_entropy.kernels import cross_entropy_fwd_staged  # noqa: E402
from kernel_src.spec import Config  # noqa: E402

# BLOCK_N,CHUNKS,SLOTS,warps,per_sm,maxnreg (SLOTS a multiple of CHUNKS: the ring holds
# whole slices): the library's config first, its session-22 neighbour, then the session-19 sweep
CONFIGS = (
    (1024, 8, 8, 2, 12, 64),
    (1024, 8, 8, 2, 12, 80),
    (1024, 8, 8, 4, 10, 48),
    (1024, 8, 8, 4, 12, 40),
    (1024, 8, 8, 4, 9, 56),
    (1024, 8, 16, 4, 6, 80),
    (2048, 4, 4, 4, 9, 56),
    (2048, 4, 4, 4, 8, 64),
    (2048, 4, 8, 4, 6, 80),
    (4096, 2, 4, 4, 6, 80),
)


def parse_configs(text):
    """'BLOCK_N,CHUNKS,SLOTS,warps,per_sm,maxnreg;...' (or CONFIGS) as Configs of the spec."""
    items = [tuple(map(int, item.split(","))) for item in text.split(";")] if text else CONFIGS
    return [Config({"BLOCK_N": block_n, "CHUNKS": chunks, "SLOTS": slots,
                    "PROGRAMS_PER_SM": per_sm}, num_warps=warps, maxnreg=maxnreg)
            for block_n, chunks, slots, warps, per_sm, maxnreg in items]


def staged_call(loss, grad, logits, target, scales, config, sms, smoothing=0.0):
    """The staged kernel on one config through Gluon's JIT: reduction "mean", gradient."""
    n_rows, n_cols = logits.shape
    split, programs = spec.staged_grid(n_rows, n_cols, sms, config)
    if split > spec.MAX_STAGED_SPLIT:
        raise ValueError(f"{n_cols} columns need {split} programs a row, more than "
                         f"{spec.MAX_STAGED_SPLIT}")
    stats = torch.zeros(n_rows * split * 2, device=logits.device, dtype=torch.int64)
    cross_entropy_fwd_staged[(programs,)](
        loss, loss, grad, logits, target, scales, scales, stats, n_rows, n_cols,
        grad.stride(0), logits.stride(0), -100, smoothing, 0.0,
        spec.FLAG_GRAD | spec.FLAG_MEAN, **config.constexprs, **config.compile_options())


def op_launch(loss, grad, logits, target, scales, smoothing=0.0):
    """The op's own launch (liger_aot.ops.cross_entropy.launch_rows): the staged kernel where
    the op takes it, from the AOT build when one is installed or LIGER_AOT_ARTIFACT_DIR names
    one (with LIGER_AOT_STRICT=1 nothing else)."""
    from liger_aot.ops.cross_entropy import launch_rows

    launch_rows(loss, None, None, grad, logits, target, None, scales, None, -100, smoothing,
                0.0, 0.0, spec.FLAG_GRAD | spec.FLAG_MEAN)


def compile_only(configs):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from _sm90 import compile_sm90, programs_fit

    for config in configs:
        k = compile_sm90(spec.STAGED, [], config)
        per_sm = config.constexprs["PROGRAMS_PER_SM"]
        print(f"{config.tag}: regs {k['regs']}, local {k['local']} B, stack {k['stack']} B, "
              f"shared {k['shared']} B, "
              f"{per_sm} an SM {'fit' if programs_fit(k, config, per_sm) else 'DO NOT FIT'}",
              flush=True)


def time_placements(count, vocab, floor_ms, logits, target, scales, eps, check, loss,
                    do_bench):
    """The op's launch into `count` gradient buffers that are all alive at once (so each lies
    elsewhere in memory), round 1 then round 2 in the same order, and torch's copy of the
    logits into each: a buffer slower in both rounds than the others says the place, not the
    moment, sets the time, and a copy slower into the same buffers says it is the memory's,
    not the kernel's."""
    buffers = [torch.empty_like(logits) for _ in range(count)]
    rows = []
    for round_ in (1, 2):
        for i, buf in enumerate(buffers):
            op_launch(loss, buf, logits, target, scales, eps)
            err = check(buf)
            ms = do_bench(lambda: op_launch(loss, buf, logits, target, scales, eps), warmup=25,
                          rep=150, return_mode="median")
            copy_ms = do_bench(lambda: buf.copy_(logits), warmup=25, rep=150,
                               return_mode="median")
            rows.append({"vocab": vocab, "kernel": "placement", "config": f"buffer {i}",
                         "in_place": False, "ms": ms, "pct_floor": 100 * floor_ms / ms,
                         "rel_err": err, "status": f"round {round_}, grad at "
                                                   f"{buf.data_ptr():#x}, copy {copy_ms:.4f} ms"})
            print(f"V {vocab:6d} round {round_} buffer {i} at {buf.data_ptr():#014x} "
                  f"(logits {logits.data_ptr():#014x}): {ms:7.3f} ms  "
                  f"{100 * floor_ms / ms:5.1f}% of 1R+1W  err {err:.1e}; torch copy into it "
                  f"{copy_ms:.4f} ms ({100 * floor_ms / copy_ms:5.1f}%)", flush=True)
    del buffers
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[128256])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--configs", default="",
                        help="'BLOCK_N,CHUNKS,SLOTS,warps,per_sm,maxnreg;...' (default: the "
                             "library's config and four neighbours)")
    parser.add_argument("--ignore-every", type=int, default=7,
                        help="every k-th target is ignore_index (default 7; 0: none)")
    parser.add_argument("--smoothing", type=float, default=0.0, help="label smoothing")
    parser.add_argument("--out", default=None, help="folder for a CSV of the results")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile each config for sm90 here (no GPU) and print resources")
    parser.add_argument("--buffers", type=int, default=0,
                        help="also time the op's launch into this many gradient buffers, "
                             "allocated side by side, in two rounds: does the buffer's place "
                             "in memory move the time? (default 0: no)")
    args = parser.parse_args()
    if args.buffers < 0:
        parser.error("--buffers must be >= 0")
    configs = parse_configs(args.configs)
    if args.compile_only:
        compile_only(configs)
        return
    from triton.testing import do_bench

    from _gpu import copy_bandwidth, cross_entropy_buffers, write_rows
    from experiment_ce_resident import library_call

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    print(f"copy {bw / 1e12:.2f} TB/s, {sms} SMs", flush=True)
    rows = []
    for vocab in args.vocab:
        logits, target, _, scales, loss, grad, work = cross_entropy_buffers(args.rows, vocab)
        floor_ms = 2 * logits.numel() * 2 / bw * 1e3
        if args.ignore_every:
            target[::args.ignore_every] = -100  # some ignored rows
        eps = args.smoothing
        ref_loss_rows = torch.nn.functional.cross_entropy(logits.float(), target,
                                                          reduction="none",
                                                          label_smoothing=eps)
        check_rows = torch.tensor([0, 7, args.rows // 2, args.rows - 1], device="cuda")
        lf = logits[check_rows].float().requires_grad_()
        n_valid = (target != -100).sum()
        torch.nn.functional.cross_entropy(lf, target[check_rows], reduction="sum",
                                          label_smoothing=eps).backward()
        ref_mean_grad_rows = lf.grad / n_valid
        scales = torch.tensor([1.0 / n_valid.item(), 1.0 / n_valid.item(), 0.0], device="cuda")

        def check(out_grad):
            err_l = ((loss - ref_loss_rows).abs().max() / ref_loss_rows.abs().max()).item()
            g = out_grad[check_rows].float()
            err_g = ((g - ref_mean_grad_rows).norm() / ref_mean_grad_rows.norm()).item()
            return max(err_l, err_g)

        kernels = [("two-pass", None)] * (eps == 0.0) + [("library", "op")] + [
            ("staged", c) for c in configs]
        for name, cfg in kernels:
            for in_place in (False, True):
                def call(gbuf):
                    src = work if in_place else logits
                    if cfg is None:
                        library_call(loss, gbuf, src, target, scales, True, 2048, 4)
                    elif cfg == "op":
                        op_launch(loss, gbuf, src, target, scales, eps)
                    else:
                        staged_call(loss, gbuf, src, target, scales, cfg, sms, eps)
                try:
                    loss.fill_(float("nan"))
                    out = work if in_place else grad
                    if in_place:
                        work.copy_(logits)
                    else:
                        grad.fill_(float("nan"))  # every element must be written
                    call(out)
                    err = check(out)
                    torch.cuda.synchronize()
                    if not err < 2e-2:
                        raise RuntimeError(f"wrong result: rel. error {err:.2e}")
                    ms = do_bench(lambda: call(out), warmup=50, rep=300, return_mode="median")
                    status = "ok"
                except Exception as e:  # noqa: BLE001 - keep the other configs' numbers
                    err, ms, status = float("nan"), float("nan"), f"{type(e).__name__}: {e}"
                    torch.cuda.synchronize()
                row = {"vocab": vocab, "kernel": name, "ignore_every": args.ignore_every,
                       "smoothing": eps, "config": "-" if cfg is None else
                       "the op's" if cfg == "op" else cfg.tag, "in_place": in_place, "ms": ms,
                       "pct_floor": 100 * floor_ms / ms, "rel_err": err, "status": status[:200]}
                rows.append(row)
                print(f"V {vocab:6d} {name:8s} {row['config']:40s} in_place {int(in_place)} "
                      f"{ms:7.3f} ms  {row['pct_floor']:5.1f}% of 1R+1W  err {err:.1e} "
                      f"{status[:120]}", flush=True)
        if args.buffers:
            rows += time_placements(args.buffers, vocab, floor_ms, logits, target, scales, eps,
                                    check, loss, do_bench)
    if args.out:
        print("wrote", write_rows(args.out, "ce_staged.csv", rows))


if __name__ == "__main__":
    main()
