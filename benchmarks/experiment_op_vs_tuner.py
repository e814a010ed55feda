"""The fused add + RMSNorm backward as the op runs it against the same config as
`liger-aot tune` times it (session 6: 65536x1024, 16384x1024 and 32768x2048, the default;
session 33: the 8K bucket's other lengths, 13107x5120,10922x6144,9362x7168).

  LIGER_AOT_ARTIFACT_DIR=<sm90 build> LIGER_AOT_STRICT=1 python benchmarks/experiment_op_vs_tuner.py
      [--shapes RxN,...]

Per shape: the op's backward (torch.autograd.grad of both outputs, do_bench median), a
profile of five of them (each kernel's own time), then the tuner's measurement
(build_tools/tune.py measure, do_bench and graph replays) of the config the tuned table
serves at that length and of the rule's one whole row a step on 4 programs an SM. Before
kernel_src.jit_function the tuner's kernels had the flags equal to 1 (has_dres, atomic_dw)
compiled in as constants, and the two disagreed at 1K columns (docs/perf-notes.md,
session 6).
"""
import argparse
import os
import sys

import torch
import triton
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from liger_aot.build_tools import tune  # noqa: E402
from liger_aot.kernel_src import tuning  # noqa: E402
from liger_aot.kernel_src.rms_norm import spec  # noqa: E402
from liger_aot.kernel_src.spec import Config  # noqa: E402
from liger_aot.ops.rms_norm import fused_add_rms_norm  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="65536x1024,16384x1024,32768x2048",
                   help="comma-separated ROWSxCOLS (default: session 6's three)")
    shapes = [tuple(map(int, s.split("x"))) for s in p.parse_args(argv).shapes.split(",")]
    torch.manual_seed(0)
    dev = "cuda"
    for M, N in shapes:
        x = torch.randn(M, N, device=dev, dtype=torch.bfloat16, requires_grad=True)
        r = torch.randn(M, N, device=dev, dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(N, device=dev, dtype=torch.bfloat16) * 0.1 + 1).requires_grad_()
        dy = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
        ds = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
        y, s = fused_add_rms_norm(x, r, w, 1e-6)

        def bwd():
            torch.autograd.grad((y, s), (x, r, w), (dy, ds), retain_graph=True)

        ms = do_bench(bwd, return_mode="median")
        print(f"{M}x{N} op backward (autograd.grad, retain_graph): {ms:.4f} ms", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                bwd()
            torch.cuda.synchronize()
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=8))
        case = tune.CASES["rms_norm_bwd"]
        table_config = tuning.select(spec.BWD, "sm90", (N, True), 2)
        rule_config = Config({"BLOCK_M": 1, "BLOCK_N": triton.next_power_of_2(N),
                              "CHUNK_ROWS": 0, "LOOP": False, "PROGRAMS_PER_SM": 4,
                              "STAGES": 3}, num_warps=4)
        for name, timer in (("do_bench", tune.do_bench_median), ("graphs", tune.graph_median)):
            results = tune.measure(case, (M, N, True), [table_config, rule_config], dev,
                                   timer, torch.bfloat16)
            for config, t, why in results:
                print(f"  tuner ({name})", config.tag, t, why, flush=True)


if __name__ == "__main__":
    main()
