"""Experiment (session 5): the norm backwards' weight-gradient sum, per-program partials
(a [programs, n] fp32 buffer, torch's reduction over it and a cast: three launches) against
atomic adds into one zeroed fp32 row with the last program casting (a memset and the
kernel). The op takes the atomic path unless torch's deterministic mode is on, so this times
the op's backward (liger_aot.ops' internal backward functions, the AOT kernels) in both modes,
from CUDA-graph replays (no host time), at M*N = 64M bf16, against the copy bandwidth
(floor: read x and dy, write dx).

  LIGER_AOT_ARTIFACT_DIR=<sm90 build> python benchmarks/experiment_norm_weight_grad.py [--out DIR]
"""
import argparse
import csv
import os
import sys

import torch

from _gpu import copy_bandwidth
from suite import Bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from liger_aot.ops import layer_norm as ln_mod  # noqa: E402
from liger_aot.ops import rms_norm as rms_mod  # noqa: E402


def graph_ms(fn) -> float:
    """Median of CUDA-graph replays of fn, suite.py's procedure (do_bench, 25 / 200 ms)."""
    return Bench("cuda", warmup_ms=25, rep_ms=200).time_graph(fn)


def cases(n_cols):
    rows = (1 << 26) // n_cols
    x = torch.randn(rows, n_cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    w = torch.randn(n_cols, device="cuda", dtype=torch.bfloat16)
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + 1e-6)
    mean = xf.mean(-1)
    ln_rstd = torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)
    dres = torch.randn_like(x)
    return {
        "rms_norm": lambda: rms_mod._backward(dy, x, w, rstd, 0.0, 0),
        "fused_add_rms_norm": lambda: rms_mod._backward(dy, x, w, rstd, 0.0, 0, dres=dres),
        "layer_norm": lambda: ln_mod.layer_norm_backward(dy, x, w, mean, ln_rstd),
    }, rows, {"rms_norm": 3, "fused_add_rms_norm": 4, "layer_norm": 3}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="directory for the CSV")
    args = parser.parse_args()
    # deterministic mode would also fill every torch.empty with NaN (extra memsets that the
    # op in normal training does not pay): only the choice of sum is compared here
    torch.utils.deterministic.fill_uninitialized_memory = False
    copy = copy_bandwidth()
    print(f"copy bandwidth {copy / 1e9:.0f} GB/s; backward times from graph replays, ms "
          "(% of copy)")
    print(f"{'op':<20} {'N':>6} {'partials':>16} {'atomic':>16} {'dw rel diff':>11}")
    out = []
    for n_cols in (1024, 2048, 4096, 8192, 16384):
        fns, rows, passes = cases(n_cols)
        for op, fn in fns.items():
            floor_ms = passes[op] * rows * n_cols * 2 / copy * 1e3
            cells, grads = [], []
            for deterministic in (True, False):
                torch.use_deterministic_algorithms(deterministic)
                try:
                    grads.append(fn()[1].float())
                    ms = graph_ms(fn)
                finally:
                    torch.use_deterministic_algorithms(False)
                cells.append(ms)
            diff = ((grads[0] - grads[1]).norm() / grads[0].norm()).item()
            print(f"{op:<20} {n_cols:>6} "
                  + " ".join(f"{ms:>9.4f} ({floor_ms / ms:>3.0%})" for ms in cells)
                  + f" {diff:>11.1e}", flush=True)
            out.append((op, rows, n_cols, *cells, floor_ms, diff))
        del fns
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "experiment_norm_weight_grad.csv"), "w",
                  newline="") as f:
            w = csv.writer(f)
            w.writerow(("op", "rows", "n", "partials_ms", "atomic_ms", "floor_ms",
                        "dw_rel_diff"))
            w.writerows(out)


if __name__ == "__main__":
    main()
