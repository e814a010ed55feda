"""RMSNorm backward sweep on a GPU: programs per SM x config, kernel plus the dW reduction.

  python benchmarks/sweep_norm_backward.py [--out DIR]

The backward is a persistent grid (ops/_common.persistent_grid: PER_SM programs per SM), each
program walking its rows and writing an fp32 dW partial that torch sums afterwards. `liger-aot
tune` chooses the config at the default PER_SM; this sweep also moves PER_SM, which trades
bytes in flight against the size of the partials. Rate: 3*M*N*2 bytes (read x and dy, write
dx) over kernel + partial-sum time, against the measured copy.
"""
import argparse
import csv
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gpu import copy_bandwidth, rms_norm_backward_case  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.testing import do_bench

    from liger_aot.kernel_src import triton_function
    from liger_aot.kernel_src.rms_norm import spec
    from liger_aot.ops._common import persistent_grid

    fn = triton_function(spec.BWD)
    copy_bw = copy_bandwidth()
    rows_out = []
    for M, N in ((16384, 4096), (65536, 1024), (8192, 8192), (4096, 16384), (1024, 65536)):
        x, dy, w, rstd, error = rms_norm_backward_case(M, N)
        dx = torch.empty_like(x)
        whole = [(m, bn, False, wa) for m in (1, 2, 4) for bn in (N,) if bn <= 16384
                 for wa in (4, 8, 16)]
        looped = [(1, bn, True, wa) for bn in (4096, 8192, 16384) if bn < N for wa in (8, 16)]
        for per_sm in (2, 4, 8, 16):
            programs, rpp = persistent_grid(M, 0, per_sm)
            partial = torch.empty(programs, N, device="cuda", dtype=torch.float32)
            for block_m, block_n, loop, warps in whole + looped:
                def run():
                    fn[(programs,)](dx, partial, dy, x, w, rstd, M, N, N, N, N, 0.0, rpp,
                                    dy, N, 0, CASTING=0, BLOCK_M=block_m, BLOCK_N=block_n,
                                    LOOP=loop, num_warps=warps)
                    return partial.sum(0)
                try:
                    err = error(dx, run())
                    if not err < 2e-2:
                        raise AssertionError(f"rel err {err:.1e}")
                    ms = do_bench(run, return_mode="median")
                    note = ""
                except Exception as e:
                    ms, note = float("nan"), f"{type(e).__name__}: {str(e)[:60]}"
                rate = 3 * M * N * 2 / (ms * 1e-3) / copy_bw
                rows_out.append((M, N, per_sm, block_m, block_n, loop, warps, ms, rate, note))
            best = min((r for r in rows_out if r[:3] == (M, N, per_sm) and r[7] == r[7]),
                       key=lambda r: r[7], default=None)
            if best:
                print(f"{M}x{N} per_sm={per_sm:<2} best BLOCK_M={best[3]} BLOCK_N={best[4]} "
                      f"loop={best[5]} w{best[6]}: {best[7]:.4f} ms {best[8]:.0%}", flush=True)
        del x, dy, dx
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "sweep_norm_backward.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["M", "N", "per_sm", "block_m", "block_n", "loop", "warps", "ms", "of_copy",
                    "note"])
        w.writerows(rows_out)


if __name__ == "__main__":
    main()
