"""Norm forwards and the copy they are measured against, by size and by timer.

The suite times the norms at 2^26 bf16 elements (128 MiB read, 128 MiB written, ~63 us at
the H200's copy rate) against a copy of 2 GiB, both with triton.testing.do_bench, which
zeroes a 256 MB buffer before each timed call. That flush leaves L2 full of dirty lines,
which the timed kernel must write back to DRAM along with its own traffic: a fixed cost of
each timing, spread over 1 ms by the 2 GiB copy but not by a 63 us kernel. This script
separates the two: at each size (2^k bf16 elements) it times, from CUDA-graph replays,

  suite: do_bench of the replay (the suite's --graphs timer: zeroed buffer before each call);
  clean: the same flush, then a read of another 256 MB buffer, so that the dirty lines are
         written back before the timed replay starts (L2 holds clean lines only);

for two references (`copy_`: torch's copy, a device-to-device memcpy; `neg`: torch's
elementwise kernel, one read and one write an element, a copy on the SMs) and for the
forwards of the suite's norm cases (benchmarks/suite.py builders; each path's outputs
checked against the fp32 reference first). Rates count the suite's bytes (x read, y
written: 4 bytes an element; 8 for the fused add) and are printed as % of the suite's
ceiling (a 2 GiB copy through do_bench) and of the `neg` copy of the same size and timer.

With two sizes or more, each timing is also split into a fixed cost and a rate: a least-
squares line through (bytes, ms) per timer, op, row length and path, ms = fixed + bytes /
rate. The rate is the kernel's streaming speed; the fixed cost is what a call pays whatever
its size (the flush's dirty lines, the launch, the grid's ramp and its last rows' latency).
For each it prints the fixed cost under which the suite's size (2^26) would reach 90% of the
ceiling at that rate. `--fit CSV` prints the same split of an earlier run's norm_size.csv
(no GPU needed).

  python benchmarks/experiment_norm_size.py [--log2-elements 26,28] [--timers suite,clean]
      [--ops rms_norm,layer_norm,fused_add_rms_norm] [--ns 1024,...,65536]
      [--paths liger-aot,torch.compile,liger-kernel] [--out DIR]
  python benchmarks/experiment_norm_size.py --fit DIR/norm_size.csv [--out DIR]

Writes norm_size.csv (one row per size, timer, op, row length and path) and, with two sizes
or more, norm_size_fit.csv (one row per timer, op, row length and path) under --out.
"""
import argparse
import csv
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import suite  # noqa: E402
from benchmarks._gpu import copy_bandwidth  # noqa: E402
from build_tools.tune import capture_graph  # noqa: E402

TIMERS = ("suite", "clean")
FLUSH_BYTES = 256 * 10**6  # do_bench's flush buffer (triton.runtime.driver)


class Timers:
    """The two timers of one CUDA-graph replay (see the module docstring)."""

    def __init__(self, reps: int = 100):
        self.reps = reps
        self.suite_bench = suite.Bench("cuda", warmup_ms=10.0, rep_ms=50.0)  # the suite's defaults
        self.dirty = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        self.clean_reader = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def time(self, fn, timer: str) -> float:
        if timer == "suite":
            return self.suite_bench.time_graph(fn)
        graph = capture_graph(fn)
        try:
            events = [(torch.cuda.Event(enable_timing=True),
                       torch.cuda.Event(enable_timing=True)) for _ in range(self.reps)]
            for _ in range(5):
                graph.replay()
            for start, end in events:
                self.dirty.zero_()  # as do_bench flushes
                self.clean_reader.sum()  # ... then the dirty lines evicted, written back
                start.record()
                graph.replay()
                end.record()
            torch.cuda.synchronize()
            return statistics.median(s.elapsed_time(e) for s, e in events)
        finally:
            del graph


def reference_rates(k: int, timers: Timers, names) -> dict:
    """{(kind, timer): bytes read + written per second} of the two copies of 2^k bf16."""
    x = torch.randn(2**k, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    kinds = {"copy_": lambda: y.copy_(x), "neg": lambda: torch.neg(x, out=y)}
    rates = {(kind, t): timed_bytes(kind, k, "") / (timers.time(fn, t) * 1e-3)
             for kind, fn in kinds.items() for t in names}
    del x, y
    torch.cuda.empty_cache()
    return rates


SUITE_LOG2 = 26  # the suite's size, 2^26 elements
TARGET = 0.90  # the share of the copy ceiling
FIT_FIELDS = ("timer", "op", "n", "path", "sizes", "fixed_us", "rate_tbps", "rate_pct_of_copy",
              "suite_size_pct_of_copy", "fixed_us_for_target")


def timed_bytes(op: str, k: int, n) -> int:
    """The bytes a timing of 2^k elements counts: a norm case's forward traffic at rows of n
    (benchmarks/suite.py's count, as main's rates use), one read and one write an element
    for the references (neg, copy_)."""
    if op in suite.CASES:
        return suite.CASES[op].traffic({"M": 2**k // int(n), "N": int(n)}, 2)["fwd"]
    return 4 * 2**k


def fit_fixed_and_rate(records: list, ceiling: float) -> list:
    """One record per (timer, op, n, path) timed ok at two sizes or more: the least-squares
    line ms = fixed + bytes / rate through its timings (timed_bytes), and at that rate the
    fixed cost under which 2^26 elements reach TARGET of `ceiling` (bytes a second)."""
    groups = {}
    for r in records:
        # copy_ is a memcpy node, 2.7 TB/s at 512 MiB: not a line through the sizes
        if r["op"] == "copy_" or r["status"] != "ok" or not math.isfinite(float(r["ms"])):
            continue
        key = (r["timer"], r["op"], str(r["n"]), r["path"])
        nbytes = timed_bytes(r["op"], int(r["log2_elements"]), r["n"])
        groups.setdefault(key, []).append((nbytes, float(r["ms"]) * 1e-3))
    fits = []
    for (timer, op, n, path), points in groups.items():
        if len({round(b) for b, _ in points}) < 2:
            continue
        xs, ts = [b for b, _ in points], [t for _, t in points]
        x_mean, t_mean = statistics.fmean(xs), statistics.fmean(ts)
        slope = (sum((x - x_mean) * (t - t_mean) for x, t in zip(xs, ts))
                 / sum((x - x_mean) ** 2 for x in xs))  # seconds a byte
        fixed = t_mean - slope * x_mean
        suite_bytes = timed_bytes(op, SUITE_LOG2, n)
        suite_time = fixed + slope * suite_bytes
        fits.append({"timer": timer, "op": op, "n": n, "path": path, "sizes": len(points),
                     "fixed_us": fixed * 1e6, "rate_tbps": 1 / slope / 1e12,
                     "rate_pct_of_copy": 100 / slope / ceiling,
                     "suite_size_pct_of_copy": 100 * suite_bytes / suite_time / ceiling,
                     "fixed_us_for_target": (suite_bytes / (TARGET * ceiling)
                                             - slope * suite_bytes) * 1e6})
    return fits


def fit_lines(fits: list) -> list:
    lines = [f"{'timer':5} {'op':18} {'N':>6} {'path':13} {'fixed':>8} {'rate':>10} "
             f"{'% copy':>6} {'at 2^26':>7} {'fixed for 90% at 2^26':>22}"]
    for f in fits:
        lines.append(f"{f['timer']:5} {f['op']:18} {f['n']:>6} {f['path']:13} "
                     f"{f['fixed_us']:6.2f}us {f['rate_tbps']:6.2f}TB/s "
                     f"{f['rate_pct_of_copy']:6.1f} {f['suite_size_pct_of_copy']:6.1f}% "
                     f"{f['fixed_us_for_target']:20.2f}us")
    return lines


def write_fits(fits: list, out: str) -> str:
    path = os.path.join(out, "norm_size_fit.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIT_FIELDS)
        w.writeheader()
        w.writerows(fits)
    return path


def refit(csv_path: str, out: str):
    """--fit: the fixed-cost split of an earlier run's norm_size.csv. The ceiling is
    recovered from its neg rows (their ms and % of the 2 GiB copy)."""
    with open(csv_path, newline="") as f:
        records = list(csv.DictReader(f))
    refs = [r for r in records if r["op"] == "neg" and r["status"] == "ok"]
    if not refs:
        raise SystemExit(f"--fit: {csv_path} has no neg rows (not a norm_size.csv?)")
    r = refs[0]
    ceiling = timed_bytes("neg", int(r["log2_elements"]), "") / (float(r["ms"]) * 1e-3) / (
        float(r["pct_of_2gib_copy"]) / 100)
    fits = fit_fixed_and_rate(records, ceiling)
    if not fits:
        raise SystemExit(f"--fit: {csv_path} times nothing at two sizes")
    print(f"{csv_path}: ceiling (2 GiB copy) {ceiling / 1e12:.2f} TB/s")
    print("\n".join(fit_lines(fits)))
    os.makedirs(out, exist_ok=True)
    print(f"wrote {write_fits(fits, out)}")


def forward_check(setup, path_fn, dtype) -> float:
    """The largest relative error of a path's forward outputs against the fp32 formula."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    ref = suite.reference(setup, dtype, gen)
    with torch.no_grad():
        outs = suite.as_tuple(path_fn(*setup.inputs))
    return max(suite.rel_error(o, r) for o, r in zip(outs, ref.outputs))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log2-elements", default="26,28",
                   help="sizes, as log2 of M*N (default 26, the suite's, and 28)")
    p.add_argument("--timers", default="suite,clean", help="suite and/or clean (see above)")
    p.add_argument("--ops", default="rms_norm,layer_norm,fused_add_rms_norm",
                   help="norm cases of benchmarks/suite.py")
    p.add_argument("--ns", default="1024,2048,4096,8192,16384,32768,65536")
    p.add_argument("--paths", default="liger-aot,torch.compile,liger-kernel")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--fit", metavar="CSV",
                   help="only split an earlier run's norm_size.csv into fixed cost and rate")
    args = p.parse_args(argv)
    if args.fit:
        return refit(args.fit, args.out)
    sizes = [int(k) for k in args.log2_elements.split(",")]
    ns = [int(n) for n in args.ns.split(",")]
    ops, paths = args.ops.split(","), args.paths.split(",")
    names = args.timers.split(",")
    for op in ops:
        if op not in suite.CASES or suite.CASES[op].sweep != "N":  # the norm sweeps
            raise SystemExit(f"--ops: {op!r} is not a norm case of benchmarks/suite.py")
    for t in names:
        if t not in TIMERS:
            raise SystemExit(f"--timers: {t!r} is not one of {', '.join(TIMERS)}")
    for path in paths:
        if path not in suite.PATHS or path == "eager":
            raise SystemExit(f"--paths: {path!r} is not one of liger-aot, torch.compile, "
                             "liger-kernel")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this experiment times GPU kernels")
    import torch._dynamo as dynamo

    big = copy_bandwidth()
    timers = Timers()
    dtype = torch.bfloat16
    print(f"{torch.cuda.get_device_name()}: 2 GiB copy (the suite's ceiling) "
          f"{big / 1e12:.2f} TB/s", flush=True)
    records = []
    for k in sizes:
        refs = reference_rates(k, timers, names)
        for (kind, t), rate in refs.items():
            print(f"2^{k} {kind:6} {t:5} {rate / 1e12:.2f} TB/s ({100 * rate / big:.1f}% of the "
                  f"2 GiB copy)", flush=True)
            records.append({"log2_elements": k, "timer": t, "op": kind, "n": "", "path": "",
                            "status": "ok", "ms": timed_bytes(kind, k, "") / rate * 1e3,
                            "pct_of_2gib_copy": 100 * rate / big,
                            "pct_of_same_size_neg": 100 * rate / refs[("neg", t)]})
        for op in ops:
            case = suite.CASES[op]
            for n in ns:
                shape = {"M": 2**k // n, "N": n}
                traffic = timed_bytes(op, k, n)
                gen = torch.Generator(device="cuda")
                gen.manual_seed(0)
                dynamo.reset()  # a fresh compile per shape, as the suite does
                setup = case.build(shape, dtype, "cuda", gen)
                for path in paths:
                    fn = setup.paths[path]
                    status, err = "ok", math.nan
                    if isinstance(fn, str):
                        status = fn
                    else:
                        try:
                            err = forward_check(setup, fn, dtype)
                            if not err < suite.TOLERANCE[dtype]:
                                status = f"wrong: rel. error {err:.2e}"
                        except Exception as e:  # noqa: BLE001 - keep the other runs
                            status = f"{type(e).__name__}: {e}"[:120]

                    def forward(fn=fn):
                        with torch.no_grad():
                            fn(*setup.inputs)

                    for t in names:
                        ms = timers.time(forward, t) if status == "ok" else math.nan
                        rate = traffic / (ms * 1e-3)
                        records.append({"log2_elements": k, "timer": t, "op": op, "n": n,
                                        "path": path, "status": status, "ms": ms,
                                        "pct_of_2gib_copy": 100 * rate / big,
                                        "pct_of_same_size_neg": 100 * rate / refs[("neg", t)]})
                        print(f"2^{k} {op:18} N={n:6} {path:13} {t:5} {status[:40]:6} "
                              f"{ms:.4f} ms {100 * rate / big:5.1f}% of 2 GiB copy "
                              f"{records[-1]['pct_of_same_size_neg']:5.1f}% of same-size neg",
                              flush=True)
                del setup
                torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "norm_size.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(records[0]))
        w.writeheader()
        w.writerows(records)
    print(f"wrote {path}")
    fits = fit_fixed_and_rate(records, big)
    if fits:
        print("\n".join(fit_lines(fits)))
        print(f"wrote {write_fits(fits, args.out)}")


if __name__ == "__main__":
    main()
