"""Experiment (session 39): the looped norm forwards' pass 2 from registers instead of L2.

The library's looped forwards (one row a program, the whole row loaded at once in pass 1:
PASS1_BLOCK = the bucket) drop the row's registers after pass 1's reduction and read the row
again from L2 in BLOCK_N chunks for pass 2 (evict_last, then evict_first). So each row must
stay in L2 until its program comes back for it, and pass 2 issues the loads a second time.
Session 11 held whole rows in fp32 and lost (one 1024-thread program an SM at 64K), but not
at the shorter rows nor with the row held as the bf16 it was loaded as (16 registers a thread
for 32 columns, not 32).

KEEP 0: the library's shape (pass 2 re-reads x); 1: pass 2 from pass 1's fp32 registers;
2: pass 2 from the loaded bf16 registers, widened again by a bit cast that the compiler
cannot merge with pass 1's conversion (so the fp32 copy dies at the reduction). Minimal
kernels, one row a program, rows of exactly N columns; each timed as a CUDA-graph replay of
the kernel alone (L2 flushed before each, do_bench's median), checked first against an fp32
torch reference, beside the library's forward (the AOT build where LIGER_AOT_ARTIFACT_DIR
names one, else its JIT fallback). Needs a CUDA GPU; --compile-only: sm90 ptxas registers and
stack of each case on a CPU.

  python benchmarks/experiment_norm_fwd_one_read.py [--op layer_norm|rms_norm]
      [--cases "N:warps,warps;N:warps"] [--keeps 0,1,2] [--compile-only]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

CASES = {"layer_norm": "1024:1,2,4;8192:4,8,16;16384:8,16,32;32768:16,32",
         "rms_norm": "32768:16,32;16384:8,16"}
CHUNK = 4096  # pass 2's column block where it re-reads (the library's 8K-16K tables' tile)


@triton.jit
def _add_pairs(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit
def _widen(x_raw, KEEP: tl.constexpr):
    if KEEP == 2:  # bf16 bits << 16 are the fp32 value; not CSE'd with pass 1's cvt
        return (x_raw.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32,
                                                                       bitcast=True)
    return x_raw.to(tl.float32)


@triton.jit
def norm_fwd(Y, X, W, B, MEAN, RSTD, stride, eps, N: tl.constexpr, BLOCK_N: tl.constexpr,
             LAYER: tl.constexpr, KEEP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride
    y_row = Y + row * stride
    wide = tl.arange(0, N)
    if KEEP == 0:
        x_raw = tl.load(x_row + wide, eviction_policy="evict_last")
    else:
        x_raw = tl.load(x_row + wide)
    x = x_raw.to(tl.float32)
    if LAYER:
        shift = tl.load(x_row).to(tl.float32)
        xs = x - shift
        s1, s2 = tl.reduce((xs, xs * xs), 0, _add_pairs)
        m1 = s1 / N
        mean = shift + m1
        rstd = 1.0 / tl.sqrt(tl.maximum(s2 / N - m1 * m1, 0.0) + eps)
        tl.store(MEAN + row, mean)
    else:
        mean = 0.0
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
    tl.store(RSTD + row, rstd)
    if KEEP == 0:
        for start in tl.range(0, N, BLOCK_N):
            c = start + tl.arange(0, BLOCK_N)
            xc = tl.load(x_row + c, eviction_policy="evict_first").to(tl.float32)
            y = (xc - mean) * rstd * tl.load(W + c).to(tl.float32)
            if LAYER:
                y += tl.load(B + c).to(tl.float32)
            tl.store(y_row + c, y.to(Y.dtype.element_ty))
    else:
        y = (_widen(x_raw, KEEP) - mean) * rstd * tl.load(W + wide).to(tl.float32)
        if LAYER:
            y += tl.load(B + wide).to(tl.float32)
        tl.store(y_row + wide, y.to(Y.dtype.element_ty))


def parse_cases(text):
    """'N:warps,warps;N:warps' -> [(N, warps)]; N a power of two from 64 (one tl.arange a
    row), warps a power of two up to 32. SystemExit naming the bad item otherwise."""
    out = []
    for item in text.split(";"):
        try:
            n, warps = item.split(":")
            pairs = [(int(n), int(w)) for w in warps.split(",")]
        except ValueError:
            raise SystemExit(f"--cases: '{item}' is not N:warps[,warps...]") from None
        for n, w in pairs:
            if n < 64 or n & (n - 1) or not 1 <= w <= 32 or w & (w - 1):
                raise SystemExit(f"--cases: '{item}': N must be a power of two from 64, "
                                 "warps a power of two up to 32")
        out += pairs
    return out


def parse_keeps(text):
    try:
        keeps = [int(k) for k in text.split(",")]
    except ValueError:
        keeps = [-1]
    if not all(k in (0, 1, 2) for k in keeps):
        raise SystemExit(f"--keeps: '{text}' is not a list of 0, 1 and 2")
    return keeps


def constexprs(n, keep, layer):
    return {"N": n, "BLOCK_N": min(CHUNK, n // 2), "LAYER": int(layer), "KEEP": keep}


def compile_only(cases, keeps, layer):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from _sm90 import sm90_usage
    sig = {"Y": "*bf16", "X": "*bf16", "W": "*bf16", "B": "*bf16", "MEAN": "*fp32",
           "RSTD": "*fp32", "stride": "i32", "eps": "fp32"}
    for n, warps in cases:
        for keep in keeps:
            k = constexprs(n, keep, layer)
            src = ASTSource(norm_fwd, signature={**sig, **{c: "constexpr" for c in k}},
                            constexprs=k)
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": warps, "num_stages": 1})
            u = sm90_usage(kernel.asm["cubin"])
            ptx_lines = kernel.asm["ptx"].count("\n")
            print(f"N {n:6d} warps {warps:2d} KEEP {keep}: regs {u['regs']:3d} stack "
                  f"{u['stack']} B, {ptx_lines} PTX lines", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=("layer_norm", "rms_norm"), default="layer_norm")
    parser.add_argument("--cases", help="'N:warps,warps;N:warps' (default: per op)")
    parser.add_argument("--keeps", default="0,1,2", help="KEEP values to run (see above)")
    parser.add_argument("--elements", type=int, default=1 << 26, help="rows x cols a shape")
    parser.add_argument("--compile-only", action="store_true",
                        help="sm90 ptxas only (no GPU): registers and stack of each case")
    args = parser.parse_args()
    cases = parse_cases(args.cases or CASES[args.op])
    keeps = parse_keeps(args.keeps)
    layer = args.op == "layer_norm"
    if args.compile_only:
        compile_only(cases, keeps, layer)
        return
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this experiment times GPU kernels "
                         "(--compile-only runs on a CPU)")

    import torch.nn.functional as F

    from _gpu import checked_timing, copy_bandwidth, graph_ms
    from liger_aot.ops import layer_norm as ln_mod
    from liger_aot.ops import rms_norm as rms_mod

    bw = copy_bandwidth()
    print(f"{args.op}: copy {bw / 1e12:.2f} TB/s, "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    for n in sorted({n for n, _ in cases}):
        m = args.elements // n
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) + 3.0
        w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
        b = (0.1 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
        xf = x.float()
        ref = (F.layer_norm(xf, (n,), w.float(), b.float(), 1e-6) if layer else
               xf * torch.rsqrt(xf.pow(2).mean(1, keepdim=True) + 1e-6) * w.float())
        floor_ms = 4 * m * n / bw * 1e3

        def err(y):
            return ((y.float() - ref).norm() / ref.norm()).item()

        def library():
            if layer:
                return ln_mod.layer_norm_forward(x, w, b, 1e-6)[:1]
            return rms_mod._forward(x, w, 1e-6, 0.0, 0)[:1]

        runs = [("library", library)]
        for warps in [w_ for n_, w_ in cases if n_ == n]:
            for keep in keeps:
                def minimal(warps=warps, keep=keep):
                    y = torch.empty_like(x)
                    stats = torch.empty(2, m, device="cuda", dtype=torch.float32)
                    norm_fwd[(m,)](y, x, w, b, stats[0], stats[1], n, 1e-6,
                                   **constexprs(n, keep, layer), num_warps=warps,
                                   num_stages=1)
                    return (y,)
                runs.append((f"minimal {warps:2d} warps KEEP {keep}", minimal))
        for name, fn in runs:
            e, ms, status = checked_timing(fn, err, graph_ms)
            print(f"{m:6d} x {n:5d} {name:26s} {ms:7.4f} ms {100 * floor_ms / ms:5.1f}% of copy"
                  f"  err {e:.1e} {status}", flush=True)


if __name__ == "__main__":
    main()
