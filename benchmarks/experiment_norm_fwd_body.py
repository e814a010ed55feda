"""Experiment (session 41): what torch.compile's LayerNorm forward at 1K has that ours lacks.

At 65536 x 1024 (bf16, CUDA graphs) torch.compile's forward reads 0.7-0.8 points of copy
above the library's on both cards (session 36, H200: 90.1 against 89.3-89.7; session 37,
H100: 93.2 against 92.5), and the library's one-row-on-one-warp HOLD_ROW kernel, Inductor's
own layout, read 1.2-1.5 under the library's table config (session 40, H100). So the layout
is not the difference. What is left is the body. Inductor's kernel (session 20) has the row
length and stride compiled in, two reductions (the mean, then the centred squares), and under
torch.no_grad() stores y alone. The library's stores mean and rstd too (8 bytes a row: 0.2%
of the bytes at 1K, and two scalar stores a row), takes the stride at run time and sums x -
x[0] and its square in one reduction.

This script times, one row a program, bf16, 2^26 elements, each checked against an fp32
torch reference first, each a CUDA-graph replay (the L2 flushed before each, do_bench's
median):
  library        the op as shipped (the AOT build where LIGER_AOT_ARTIFACT_DIR names one)
  torch.compile  F.layer_norm compiled (dynamic=False), under torch.no_grad()
  two-pass       this script's kernel: mean, then the centred squares (Inductor's math)
  one-pass       x - x[0] and its square in one reduction (the library's math)
each kernel with the statistics stored or not (stats / nostats) and the stride at run time
or compiled in (static), on the warp counts asked for. So stats against nostats prices the
statistics, one-pass against two-pass the reduction, static the stride.

  python benchmarks/experiment_norm_fwd_body.py [--cases "N:warps,warps;..."] [--rounds 3]
      [--compile-only]

--compile-only: sm90 ptxas registers and SASS instruction counts of each kernel on a CPU.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from _gpu import (checked_timing, graph_ms, layer_norm_forward_case,  # noqa: E402
                  parse_row_warps, start_timing)

CASES = "1024:1,2;2048:1,2;4096:2,4"
EPS = 1e-6
# (name, TWO_PASS, STATS, STATIC_STRIDE) of this script's kernel
VARIANTS = (("two-pass nostats", 1, 0, 0), ("two-pass stats", 1, 1, 0),
            ("two-pass stats static", 1, 1, 1), ("one-pass stats", 0, 1, 0),
            ("one-pass nostats", 0, 0, 0))


@triton.jit
def _add_pairs(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit
def layer_norm_row(Y, X, W, B, MEAN, RSTD, stride, eps, N: tl.constexpr,
                   TWO_PASS: tl.constexpr, STATS: tl.constexpr, STATIC_STRIDE: tl.constexpr):
    """One row of N columns a program (y's stride = x's)."""
    row = tl.program_id(0).to(tl.int64)
    step = N if STATIC_STRIDE else stride
    cols = tl.arange(0, N)
    x = tl.load(X + row * step + cols).to(tl.float32)
    if TWO_PASS:
        mean = tl.sum(x, axis=0) / N
        xc = x - mean
        var = tl.sum(xc * xc, axis=0) / N
    else:
        shift = tl.load(X + row * step).to(tl.float32)
        xs = x - shift
        s1, s2 = tl.reduce((xs, xs * xs), 0, _add_pairs)
        m1 = s1 / N
        var = tl.maximum(s2 / N - m1 * m1, 0.0)
        mean = shift + m1
        xc = x - mean
    rstd = 1.0 / tl.sqrt(var + eps)
    y = xc * rstd * tl.load(W + cols).to(tl.float32) + tl.load(B + cols).to(tl.float32)
    tl.store(Y + row * step + cols, y.to(Y.dtype.element_ty))
    if STATS:
        tl.store(MEAN + row, mean)
        tl.store(RSTD + row, rstd)


def parse_cases(text):
    """'N:warps,warps;N:warps' -> [(N, warps)]; N a power of two from 256 to 16384 (see
    _gpu.parse_row_warps)."""
    return parse_row_warps(text, 256, 16384)


def kernel_args(n, two_pass, stats, static):
    return {"N": n, "TWO_PASS": two_pass, "STATS": stats, "STATIC_STRIDE": static}


def compile_only(cases):
    """sm90 ptxas registers, stack and SASS instructions of each variant (no GPU)."""
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "tests"))
    from _sm90 import sm90_usage

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    sig = {"Y": "*bf16", "X": "*bf16", "W": "*bf16", "B": "*bf16", "MEAN": "*fp32",
           "RSTD": "*fp32", "stride": "i32", "eps": "fp32", "N": "constexpr",
           "TWO_PASS": "constexpr", "STATS": "constexpr", "STATIC_STRIDE": "constexpr"}
    for n, warps in cases:
        for name, two_pass, stats, static in VARIANTS:
            src = ASTSource(layer_norm_row, signature=sig,
                            constexprs=kernel_args(n, two_pass, stats, static),
                            attrs={(i,): [["tt.divisibility", 16]] for i in range(7)})
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": warps})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(k.asm["cubin"])
                f.flush()
                sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                                      check=True).stdout
            usage = sm90_usage(k.asm["cubin"])
            count = len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", sass, re.M))
            print(f"N {n:5d} {warps:2d} warps {name:22s}: regs {usage['regs']:3d}, stack "
                  f"{usage['stack']} B, {count} SASS instructions", flush=True)


def time_case(n, warps_list, elements, bw, times, compiled):
    """One timing of each path at row length n; ms appended to times[(n, label)]."""
    from liger_aot.ops import layer_norm as ln_mod

    m = elements // n
    x, w, b, err = layer_norm_forward_case(m, n, EPS)
    floor_ms = 4 * m * n / bw * 1e3
    y = torch.empty_like(x)
    mean = torch.empty(m, device="cuda")
    rstd = torch.empty(m, device="cuda")

    if n not in compiled:
        compiled[n] = torch.compile(lambda t: F.layer_norm(t, (n,), w, b, EPS), dynamic=False)
    paths = [("library", lambda: ln_mod.layer_norm_forward(x, w, b, EPS)[:1]),
             ("torch.compile", lambda: (compiled[n](x),))]
    for warps in warps_list:
        for name, two_pass, stats, static in VARIANTS:
            args = kernel_args(n, two_pass, stats, static)

            def run(args=args, warps=warps):
                layer_norm_row[(m,)](y, x, w, b, mean, rstd, x.stride(0), EPS, **args,
                                     num_warps=warps)
                return (y,)
            paths.append((f"{name} {warps}w", run))
    with torch.no_grad():
        for label, fn in paths:
            e, ms, status = checked_timing(fn, err, graph_ms)
            times.setdefault((n, label), []).append(ms)
            print(f"{m:6d} x {n:5d} {label:28s} {ms:7.4f} ms {100 * floor_ms / ms:5.1f}% of "
                  f"copy  err {e:.1e} {status}", flush=True)


def summary(times):
    """Per row length, each path's median and its spread over the rounds, best first."""
    import statistics

    print("== medians over the rounds (% of copy: min-max)")
    by_n = {}
    for (n, label), ms in times.items():
        by_n.setdefault(n, []).append((label, ms))
    for n, rows in sorted(by_n.items()):
        ok = [(statistics.median(ms), min(ms), max(ms), label) for label, ms in rows
              if all(v == v for v in ms)]
        for med, lo, hi, label in sorted(ok):
            print(f"N {n:5d} {label:28s} {med:7.4f} ms ({lo:.4f}-{hi:.4f})", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=CASES,
                        help=f"'N:warps,warps;N:warps' (default {CASES})")
    parser.add_argument("--elements", type=int, default=1 << 26, help="rows x cols a shape")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times each path is timed, in turns (default 3: the spread)")
    parser.add_argument("--compile-only", action="store_true",
                        help="sm90 registers and SASS instruction counts only (no GPU)")
    args = parser.parse_args()
    if args.rounds < 1 or args.elements < 16384:
        parser.error("--rounds must be at least 1 and --elements at least 16384")
    cases = parse_cases(args.cases)
    if args.compile_only:
        os.environ.pop("TRITON_INTERPRET", None)
        compile_only(cases)
        return
    bw = start_timing("layer_norm")
    by_n = {}
    for n, warps in cases:
        by_n.setdefault(n, []).append(warps)
    times, compiled = {}, {}
    for r in range(args.rounds):
        print(f"== round {r + 1}", flush=True)
        for n, warps_list in by_n.items():
            time_case(n, warps_list, args.elements, bw, times, compiled)
    summary(times)


if __name__ == "__main__":
    main()
