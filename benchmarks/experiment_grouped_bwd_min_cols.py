"""Experiment (session 32): the norm backwards at rows of 8K-16K columns on the plain kernels
(the tuned 16K bucket's config) against the grouped ones (rows split over programs, each row
read once), which the ops took only from 16384 columns (GROUPED_MIN_COLS; over 8192 since
this ran). On an H100 the plain backwards read 12288 columns at 75-79% of copy, the grouped
ones 24576 at 88-92%, and `liger-aot tune --inexact-only` found no plain candidate faster at
12288 (docs/perf-notes.md, session 32). Each op, length and path (the module's
GROUPED_MIN_COLS set for the call): both paths' gradients compared first, then CUDA-graph
replays (do_bench medians, as the suite's --graphs) of the forward recording autograd and of
forward+backward, at 2^26 elements, bf16; bwd = fwd+bwd - fwd, read against the suite's copy.
The fused add's leaves x and residual get one gradient, which autograd copies for the
second: its f+b holds that copy on either path. Needs an sm90 GPU (the grouped kernels'
arch); the ops run from the JIT, no build needed.

  python benchmarks/experiment_grouped_bwd_min_cols.py [--ns 10240,12288,14336,16384]
                                                      [--ops rms_norm,...] [--out CSV]
"""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from _gpu import copy_bandwidth  # noqa: E402
from liger_aot.build_tools.tune import graph_ms  # noqa: E402
from liger_aot.kernel_src.layer_norm import spec as ln_spec  # noqa: E402
from liger_aot.kernel_src.rms_norm import spec as rms_spec  # noqa: E402
from liger_aot.ops.layer_norm import layer_norm  # noqa: E402
from liger_aot.ops.rms_norm import fused_add_rms_norm, rms_norm  # noqa: E402

ELEMENTS = 2**26
OPS = {  # name: (spec module whose GROUPED_MIN_COLS the op reads, row tensors, call)
    "rms_norm": (rms_spec, 1, lambda xs, w, b: rms_norm(xs[0], w, 1e-6, in_place=False)),
    "layer_norm": (ln_spec, 1, lambda xs, w, b: layer_norm(xs[0], w, b, 1e-6)),
    "fused_add_rms_norm": (rms_spec, 2, lambda xs, w, b: fused_add_rms_norm(
        xs[0], xs[1], w, 1e-6)),
}


def run_case(name: str, n: int, grouped: bool):
    """(gradients, fwd ms, fwd+bwd ms) of op `name` on ELEMENTS // n rows of n, on the
    grouped backward or not."""
    module, count, call = OPS[name]
    default = module.GROUPED_MIN_COLS
    module.GROUPED_MIN_COLS = min(n, default) if grouped else n + 1
    try:
        torch.manual_seed(0)
        rows = ELEMENTS // n
        xs = [torch.randn(rows, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for _ in range(count)]
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        gs = [torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(count)]
        leaves = xs + [w] + ([b] if name == "layer_norm" else [])

        def outputs():
            out = call(xs, w, b)
            return out if isinstance(out, tuple) else (out,)

        def step():
            for t in leaves:
                t.grad = None
            torch.autograd.backward(outputs(), gs)

        step()
        grads = [t.grad.float().clone() for t in leaves]
        return grads, graph_ms(outputs), graph_ms(step)
    finally:
        module.GROUPED_MIN_COLS = default


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", default="10240,12288,14336,16384",
                   help="row lengths, multiples of the grouped slice (2048)")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--out", help="CSV of the table")
    args = p.parse_args()
    ns = [int(n) for n in args.ns.split(",")]
    ops = args.ops.split(",")
    bad = [n for n in ns if n % rms_spec.GROUPED_BLOCK_N or n % ln_spec.GROUPED_BLOCK_N]
    unknown = [op for op in ops if op not in OPS]
    if bad or unknown:
        p.error(f"lengths not a multiple of 2048: {bad}; unknown ops: {unknown}")
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (sm90: the grouped kernels' arch)")
    copy = copy_bandwidth() / 1e12  # the suite's: 2 GiB, bytes read + written
    print(f"{torch.cuda.get_device_name()}: copy {copy:.2f} TB/s; 2^26 elements, bf16")
    print(f"{'op':<20} {'N':>6} {'path':<8} {'fwd ms':>8} {'f+b ms':>8} {'bwd ms':>8} "
          f"{'bwd %cp':>7} {'max rel diff':>12}")
    rows = []
    for name in ops:
        count = OPS[name][1]
        for n in ns:
            results = {path: run_case(name, n, path == "grouped") for path in ("plain", "grouped")}
            plain_grads = results["plain"][0]
            for path, (grads, fwd, fwdbwd) in results.items():
                diff = max(((g - r).abs().max() / r.abs().max()).item()
                           for g, r in zip(grads, plain_grads))
                bwd = fwdbwd - fwd
                # the suite's bytes: x, dy read, dx written; the fused add also reads ds
                moved = (3 + count - 1) * ELEMENTS * 2
                pct = 100 * moved / (bwd * 1e-3) / (copy * 1e12)
                print(f"{name:<20} {n:>6} {path:<8} {fwd:8.4f} {fwdbwd:8.4f} {bwd:8.4f} "
                      f"{pct:7.1f} {diff:12.2e}", flush=True)
                rows.append({"op": name, "n": n, "path": path, "fwd_ms": fwd,
                             "fwdbwd_ms": fwdbwd, "bwd_ms": bwd, "bwd_pct_copy": pct,
                             "max_rel_diff_vs_plain": diff})
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
