"""The GPU kernels of liger-aot's cross-entropy in a training step, and the step's time.

One step is the op's forward (loss + gradient, reduction "mean") and its backward
(torch.autograd.grad with a cotangent of 1, as loss.backward() passes), on bf16 logits that
need a gradient, as benchmarks/suite.py times it. Prints each kernel's time a step
(torch.profiler over --steps steps; the op's own kernel next to the small torch kernels
around it: the mean's divisors, the loss's sum, the backward's scale), then the median of
the whole step replayed from a CUDA graph (do_bench, L2 flushed), with no target ignored and
then with every --ignore-every-th one ignored. Needs a CUDA GPU; set LIGER_AOT_ARTIFACT_DIR
(and LIGER_AOT_STRICT=1) to time a build.

  python benchmarks/profile_cross_entropy.py [--rows 8192] [--vocab 128256] [--steps 10]
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--steps", type=int, default=10, help="profiled steps (default 10)")
    parser.add_argument("--ignore-every", type=int, default=7,
                        help="the second timing ignores every k-th target (default 7)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    from torch.profiler import ProfilerActivity, profile
    from triton.testing import do_bench

    from _gpu import capture_graph
    from liger_aot.ops.cross_entropy import cross_entropy

    x = torch.randn(args.rows, args.vocab, device="cuda", dtype=torch.bfloat16)
    x.requires_grad_()
    target = torch.randint(0, args.vocab, (args.rows,), device="cuda")
    one = torch.ones((), device="cuda")

    def step():
        return torch.autograd.grad(cross_entropy(x, target), [x], one)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    kernels = collections.defaultdict(lambda: [0, 0.0])  # name -> [launches, us]
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name][0] += 1
            kernels[event.name][1] += event.device_time_total
    print(f"{args.rows} x {args.vocab} bf16, kernels a step (torch.profiler, {args.steps} steps)")
    for name, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
        print(f"{us / args.steps:9.1f} us  {n / args.steps:4.1f}x  {name[:100]}")
    graph = capture_graph(step)
    ms = do_bench(graph.replay, warmup=50, rep=300, return_mode="median")
    print(f"step from a CUDA graph: {ms:.3f} ms")
    if args.ignore_every:
        target[::args.ignore_every] = -100  # the graph reads target in place
        ms = do_bench(graph.replay, warmup=50, rep=300, return_mode="median")
        print(f"step from a CUDA graph, every {args.ignore_every}th target ignored: {ms:.3f} ms")


if __name__ == "__main__":
    main()
