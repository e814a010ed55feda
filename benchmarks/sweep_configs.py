"""Config sweep for the kernels behind issue 5's open gaps, through Triton JIT of the same
sources (so candidates need no rebuild). A step toward `liger-aot tune`.

  python benchmarks/sweep_configs.py [--out DIR]

1. rms_norm_fwd at 16384 x N (bf16) for N in 1024..65536 over (BLOCK_M, BLOCK_N, num_warps)
   candidates; achieved bandwidth counts 2*M*N*2 bytes against the measured copy ceiling.
(Cross-entropy has its own sweep: benchmarks/sweep_cross_entropy.py.)
Writes sweep_configs.csv to --out.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.testing import do_bench

    from liger_aot.kernel_src import triton_function
    from liger_aot.kernel_src.rms_norm import spec as rms_spec

    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    copy_bw = 2 * x.numel() / (do_bench(lambda: x.clone(), return_mode="median") * 1e-3)
    del x
    rows = []
    fn = triton_function(rms_spec.FWD)
    M = 16384
    for N in (1024, 2048, 4096, 8192, 16384, 65536):
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        rstd = torch.empty(M, device="cuda", dtype=torch.float32)
        ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
               ).to(x.dtype) * w
        candidates = []
        for block_m in (1, 2, 4, 8):
            for block_n in (1024, 2048, 4096, 8192, 16384):
                if block_n < N and block_m > 1:
                    continue
                loop = block_n < N
                if not loop and block_n >= 2 * N and block_n > 1024:
                    continue
                for warps in (4, 8, 16):
                    candidates.append((block_m, block_n, loop, warps))
        chosen = rms_spec.select_config(N)
        for block_m, block_n, loop, warps in candidates:
            def run():
                fn[((M + block_m - 1) // block_m,)](
                    y, x, w, rstd, M, N, N, N, 1e-6, 0.0, y, x, N, N, 0,
                    CASTING=0, BLOCK_M=block_m, BLOCK_N=block_n, LOOP=loop, num_warps=warps)
            try:
                run()
                err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
                if not err < 2e-2:
                    raise AssertionError(f"rel err {err:.1e}")
                ms = do_bench(run, return_mode="median")
                note = ""
            except Exception as e:  # a candidate that does not compile or is wrong
                ms, note = float("nan"), f"{type(e).__name__}: {str(e)[:60]}"
            is_current = (chosen.constexprs == {"BLOCK_M": block_m, "BLOCK_N": block_n,
                                                "LOOP": loop} and chosen.num_warps == warps)
            rows.append(("rms_norm_fwd", N, block_m, block_n, loop, warps, ms,
                         2 * M * N * 2 / (ms * 1e-3) / copy_bw, "current" if is_current else note))
        best = min((r for r in rows if r[1] == N and r[6] == r[6]), key=lambda r: r[6])
        cur = next((r for r in rows if r[1] == N and r[8] == "current"), None)
        print(f"rms_norm_fwd N={N}: best BLOCK_M={best[2]} BLOCK_N={best[3]} loop={best[4]} "
              f"warps={best[5]} {best[6]:.3f} ms ({best[7]:.0%} of copy); current "
              f"{cur[6]:.3f} ms ({cur[7]:.0%})" if cur else "current config not in sweep")
        del x, y

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sweep_configs.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "n", "block_m", "block_n", "loop", "warps", "ms", "of_copy", "note"])
        w.writerows(rows)


if __name__ == "__main__":
    main()
