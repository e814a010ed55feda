"""A norm spec's tuned config of each unflagged bucket against the same config with some
constexprs set otherwise (e.g. a compile-time variant of the kernel under trial), at the
suite's shapes (2^26 elements, rows of exactly the bucket's length), timed from CUDA graphs
as the suite times, the two alternating over rounds.

  python benchmarks/experiment_config_constexpr.py --spec layer_norm_fwd --set EXACT_N=0 \
      [--ns 8192,16384,32768] [--rounds 3]

(that one: the table's exact-length configs against their twins). Session 21 ran it with
trial constexprs for the row length compiled in, the fused residual compiled out and a
LayerNorm pass 1 without its select (docs/perf-notes.md, "Session 21").

JIT of the working tree's kernel through the tuner's launch and check (build_tools/tune.py
measure); prints ms and % of copy bandwidth (--bytes a column: 4 for a forward that reads x
and writes y) per round and config.
"""
import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._gpu import copy_bandwidth, graph_ms  # noqa: E402
from build_tools import tune  # noqa: E402
from kernel_src.tuning import tuned_configs  # noqa: E402


NORMS = ("rms", "layer")  # the families whose tuned shapes are (rows, n[, flag])


def overrides(text: str) -> dict:
    """"A=1,B=0" -> {"A": 1, "B": 0}."""
    values = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, value = item.partition("=")
        if not name or not value:
            raise SystemExit(f"--set takes NAME=INT[,NAME=INT...], got {text!r}")
        values[name] = int(value)
    return values


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True,
                   choices=[n for n in sorted(tune.CASES) if n.split("_")[0] in NORMS])
    p.add_argument("--set", required=True, help="constexprs of the trial config, NAME=INT,...")
    p.add_argument("--ns", default="1024,2048,4096,8192,16384,32768,65536")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bytes", type=int, default=4, help="bytes a column moved (floor)")
    args = p.parse_args()
    trial = overrides(args.set)
    case = tune.CASES[args.spec]
    plain = {s[1]: s for s in case.shapes if not tune._flag(s)}
    ns = [int(n) for n in args.ns.split(",")]
    for n in ns:
        if n not in plain:
            raise SystemExit(f"--ns {n}: {args.spec} tunes rows of {sorted(plain)} only")
    copy = copy_bandwidth()
    print(f"copy {copy / 1e12:.2f} TB/s; trial: {trial}")
    table = tuned_configs(case.spec, "sm90")
    for n in ns:
        shape = plain[n]
        rows = 2**26 // n
        key = tune.tuning.bucket_key(case.spec, shape[1:])
        base = table.get(key) or case.spec.rule(*shape[1:])
        configs = [base, dataclasses.replace(base, constexprs={**base.constexprs, **trial})]
        floor_ms = args.bytes * rows * n / copy * 1e3
        for r in range(args.rounds):
            order = configs if r % 2 == 0 else configs[::-1]
            for c, ms, why in tune.measure(case, (rows, *shape[1:]), order, "cuda",
                                           lambda fn, c: graph_ms(fn), torch.bfloat16):
                label = "trial" if c is configs[1] else "table"
                text = why or f"{ms:.4f} ms {100 * floor_ms / ms:5.1f}%"
                print(f"{rows}x{n} round {r} {label} {text}  {c.tag}", flush=True)


if __name__ == "__main__":
    main()
