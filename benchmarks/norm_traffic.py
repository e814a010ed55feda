"""Run each norm kernel once on its sm90 table config, for a profiler to count its DRAM bytes.

Meant to run under Nsight Compute, which counts the bytes each kernel launch moved to and
from DRAM; the floor is what the suite counts (forward: read x, write y; backward: read x and
dy, write dx; fused add: also the residual in and the sum out), so the ratio says how many
times a kernel really reads its rows from DRAM. Each case is launched twice, as `liger-aot
tune` launches it (once checked against the reference, once "timed" by a single call), on the
shipped kernels through Triton's JIT.

  ncu --clock-control none --csv --metrics dram__bytes_read.sum,dram__bytes_write.sum,\\
      gpu__time_duration.sum -k regex:"rms_norm|layer_norm" \\
      python benchmarks/norm_traffic.py [--specs rms_norm_fwd,...] [--ns 8192,...]

Without a profiler it runs the same launches and prints each case's config and floor (a
CUDA GPU either way).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from build_tools import tune  # noqa: E402
from kernel_src import tuning  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--specs", default="rms_norm_fwd,layer_norm_fwd,rms_norm_bwd,layer_norm_bwd",
                   help="comma-separated norm specs of `liger-aot tune`")
    p.add_argument("--ns", default="8192,16384,32768,65536", help="row lengths (tuned shapes)")
    p.add_argument("--flags", action="store_true", help="also the flagged shapes (fused add)")
    args = p.parse_args()
    ns = {int(n) for n in args.ns.split(",")}
    for name in args.specs.split(","):
        case = tune.CASES[name]
        table = tuning.tuned_configs(case.spec, "sm90")
        for shape in case.shapes:
            if shape[1] not in ns or (tune._flag(shape) and not args.flags):
                continue
            key = tuning.bucket_key(case.spec, shape[1:])
            config = table[key]
            floor = case.passes[tune._flag(shape)] * shape[0] * shape[1] * 2
            (_, _, why), = tune.measure(case, shape, [config], "cuda",
                                        lambda run, config: run() or 0.0, torch.bfloat16)
            print(f"{name} {shape[0]}x{shape[1]}{' flag' if tune._flag(shape) else ''}: "
                  f"floor {floor / 1e6:.1f} MB, {config.tag}" + (f" FAILED {why}" if why else ""),
                  flush=True)


if __name__ == "__main__":
    main()
