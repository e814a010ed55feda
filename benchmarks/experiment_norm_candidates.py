"""Experiment (session 8): every candidate config of the norm kernels at some row lengths,
checked and timed as `liger-aot tune` checks and times them (build_tools/tune.py: JIT of the
shipped kernels, do_bench median, bf16), best first, with the rejected ones and why. Used to
measure whole-row 16K backwards that read x and dy twice (kernel_src/rms_norm/kernels.py,
REREAD) before re-tuning, and looped kernels whose pass 2 walks the row backwards. Needs a
CUDA GPU.

  python benchmarks/experiment_norm_candidates.py [--specs rms_norm_bwd,...] [--ns 8192,16384]
                                                 [--flags] [--top 8]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from build_tools import tune  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", default="8192,16384", help="row lengths (the tuner's shapes)")
    p.add_argument("--specs", default="rms_norm_bwd,layer_norm_bwd")
    p.add_argument("--flags", action="store_true",
                   help="also the flagged shapes (fused residual / dres)")
    p.add_argument("--top", type=int, default=8, help="fastest configs shown per shape")
    args = p.parse_args()
    ns = {int(n) for n in args.ns.split(",")}
    for name in args.specs.split(","):
        case = tune.CASES[name]
        for shape in [s for s in case.shapes if s[1] in ns and (args.flags or not tune._flag(s))]:
            configs = tune.candidates_of(case, shape)
            for s in tune.timed_shapes(case, shape):
                results = tune.measure(case, s, configs, "cuda", tune.do_bench_median,
                                       torch.bfloat16)
                ok = sorted([r for r in results if r[1] is not None], key=lambda r: r[1])
                moved = case.passes[tune._flag(s)] * s[0] * s[1] * 2  # bf16 bytes counted
                flag = " (flag)" if tune._flag(s) else ""
                print(f"{name} {s[0]}x{s[1]}{flag}: {len(ok)} ok, {len(results) - len(ok)} rejected",
                      flush=True)
                for config, ms, _ in ok[:args.top]:
                    print(f"   {ms:.4f} ms {moved / ms / 1e6:7.0f} GB/s  {config.tag}", flush=True)
                for config, _, why in results:
                    if why:
                        print(f"   rejected {config.tag}: {why}")


if __name__ == "__main__":
    main()
