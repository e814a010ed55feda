"""Experiment (written in session 17, run in session 18): how many of a row's loads the
looped norm forward's pass 1 keeps in flight, against torch.compile's kernels.

On an H200 (docs/perf-notes.md, session 17, lead 2) torch.compile's LayerNorm forward read
4096 x 16384 in 0.0732 ms against 0.0882 for the library's looped kernel on the same tile
(2048 columns, 16 warps, one row a program, 31 and 32 registers). In the sm90 SASS,
Inductor's shapes are compiled in and ptxas unrolls its pass 1 whole: the row's 8 loads go
out back to back. The library's runtime trip count gets 4 loads a step. Here minimal looped
forwards (one row a program, the library's eviction hints, no row masks, no residual path)
take pass 1 in chunks of PASS1_BLOCK columns: BLOCK_N (the library's way) or the whole row
in one load, dropped after the sums, with pass 2 re-reading x from L2 by BLOCK_N chunks as
Inductor's kernel does. sm90 ptxas (--sass, on the CPU): at 2048 columns on 16 warps the
whole-row pass 1 takes 28 registers and issues its four 16-byte loads a thread back to
back, the same 64 bytes a thread in flight as Inductor's eight 8-byte ones; the chunked one
takes 31. Prediction: the whole-row pass 1 reaches torch.compile's 86-90% where the chunked
one stays at the library's 72-85%.

Outcome (H200, docs/perf-notes.md "Session 18"; raw: docs/results/2026-12-02-norm-fwd-
pass1-session18-h200.txt): confirmed, LayerNorm 4096 x 16384 on 4096 x 16 warps 74.5 ->
86.8% of copy (torch.compile 86.2%), RMSNorm 2048 x 32768 on 8192 x 32 warps 76.5 -> 88.0%
(89.5%). The same load inside a runtime loop of one trip lost most of it (86.8 -> 74.6% on
that LayerNorm tile), w and b under the default L2 policy nothing. The library took it as
PASS1_BLOCK (kernel_src/rms_norm/kernels.py, _looped_rows), with no loop; its rows here are
the library's looped kernel on each tile, pass 1 by blocks and by the whole row.

Session 20 added the variant "pass 2 in static trips" (PASS2_STATIC: with the whole-row
pass 1, pass 2 takes PASS1_BLOCK // BLOCK_N blocks in a trip count known to ptxas). H200,
RMSNorm 2048 x 32768: 87.0 -> 89.5-90.0% of copy on 16384 x 32 warps, 87.6-88.1 -> 89.1-89.7
on 8192 x 32 (torch.compile 89.3-89.7); LayerNorm 32K on 8192 x 16 79.7% against the library's
79.6. Ported to the library's RMSNorm kernel it lost in the suite (32K 87.4 -> 84.0%, 8K
90.9 -> 88.3%) and was not kept (docs/perf-notes.md, session 20).

  python benchmarks/experiment_norm_fwd_pass1.py [--op layer_norm|rms_norm]
      [--cols N --tiles BLOCK_NxWARPS,...]
      (CUDA GPU: each variant, the library's kernel on the same tile and torch.compile, from
      CUDA graphs, checked against fp32 torch first; --cols: rows of N columns, 2^26
      elements in all, instead of the op's shape below; --tiles: instead of its tiles)
  python benchmarks/experiment_norm_fwd_pass1.py --sass [--op ... --cols ... --tiles ...]
      (no GPU: sm90 ptxas of each variant, its registers and global loads)
  python benchmarks/experiment_norm_fwd_pass1.py --smoke
      (no GPU: each variant through Triton's interpreter on a small shape, against torch)
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

EPS = 1e-6
# (op, rows, cols, [(BLOCK_N, warps)]): session 17's tiles and the best of the minimal
# kernels' (first run, session 18), then the tiles the session-18 tune chose for the library
SHAPES = {"layer_norm": (4096, 16384, ((2048, 16), (4096, 16), (8192, 8))),
          "rms_norm": (2048, 32768, ((4096, 32), (8192, 32), (8192, 16)))}


@triton.jit
def _add_pairs(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit
def _pass2_chunk(x_row, y_row, W, B, c, n_cols, mean, rstd, LAYER_NORM: tl.constexpr,
                 W_HINT: tl.constexpr):
    m = c < n_cols
    x = tl.load(x_row + c, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
    w = tl.load(W + c, mask=m, other=0.0, eviction_policy=W_HINT).to(tl.float32)
    if LAYER_NORM:
        b = tl.load(B + c, mask=m, other=0.0, eviction_policy=W_HINT).to(tl.float32)
        y = (x - mean) * rstd * w + b
    else:
        y = (x * rstd).to(y_row.dtype.element_ty).to(tl.float32) * w  # llama casting
    tl.store(y_row + c, y.to(y_row.dtype.element_ty), mask=m)


@triton.jit
def minimal_fwd(Y, X, W, B, STAT, n_cols, eps, LAYER_NORM: tl.constexpr,
                BLOCK_N: tl.constexpr, PASS1_BLOCK: tl.constexpr, PASS1_LOOP: tl.constexpr,
                W_HINT: tl.constexpr, PASS2_STATIC: tl.constexpr = False):
    """One row a program. Pass 1: sums over chunks of PASS1_BLOCK columns (LayerNorm: of x
    and x^2 shifted by the row's first element; RMSNorm: of x^2), evict_last; a whole-row
    pass 1 inside a runtime loop of one trip with PASS1_LOOP (the library's form). Pass 2: y
    by chunks of BLOCK_N, x evict_first, w and b with the W_HINT policy; with PASS2_STATIC
    (session 20, whole-row pass 1 only) PASS1_BLOCK // BLOCK_N chunks in a trip count known
    to ptxas, as Inductor's fixed shapes give it, instead of a runtime loop to n_cols. STAT:
    rstd a row."""
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * n_cols
    y_row = Y + row * n_cols
    p1 = tl.arange(0, PASS1_BLOCK)
    shift = 0.0
    if LAYER_NORM:
        shift = tl.load(x_row).to(tl.float32)
    if PASS1_BLOCK == BLOCK_N:  # by chunks, summed per lane, reduced once (the library's way)
        acc1 = tl.zeros([PASS1_BLOCK], dtype=tl.float32)
        acc2 = tl.zeros([PASS1_BLOCK], dtype=tl.float32)
        for start in tl.range(0, n_cols, PASS1_BLOCK):
            c = start + p1
            xc = tl.load(x_row + c, mask=c < n_cols, other=0.0, eviction_policy="evict_last")
            d = tl.where(c < n_cols, xc.to(tl.float32) - shift, 0.0)
            acc1 += d
            acc2 += d * d
        s1, s2 = tl.reduce((acc1, acc2), 0, _add_pairs)
    elif PASS1_LOOP:  # chunks of PASS1_BLOCK in a runtime loop, each reduced at once
        s1 = 0.0
        s2 = 0.0
        for start in tl.range(0, n_cols, PASS1_BLOCK, num_stages=1):
            c = start + p1
            xc = tl.load(x_row + c, mask=c < n_cols, other=0.0, eviction_policy="evict_last")
            d = tl.where(c < n_cols, xc.to(tl.float32) - shift, 0.0)
            a1, a2 = tl.reduce((d, d * d), 0, _add_pairs)
            s1 += a1
            s2 += a2
    else:  # the whole row (PASS1_BLOCK >= n_cols) in one load, reduced at once
        xr = tl.load(x_row + p1, mask=p1 < n_cols, other=0.0, eviction_policy="evict_last")
        d = tl.where(p1 < n_cols, xr.to(tl.float32) - shift, 0.0)
        s1, s2 = tl.reduce((d, d * d), 0, _add_pairs)
    if LAYER_NORM:
        m1 = s1 / n_cols
        mean = shift + m1
        rstd = 1.0 / tl.sqrt(tl.maximum(s2 / n_cols - m1 * m1, 0.0) + eps)
    else:
        mean = 0.0
        rstd = 1.0 / tl.sqrt(s2 / n_cols + eps)
    tl.store(STAT + row, rstd)
    cols = tl.arange(0, BLOCK_N)
    if PASS2_STATIC:  # the row fits PASS1_BLOCK; chunks past n_cols are masked off
        for i in tl.static_range(PASS1_BLOCK // BLOCK_N):
            _pass2_chunk(x_row, y_row, W, B, i * BLOCK_N + cols, n_cols, mean, rstd,
                         LAYER_NORM, W_HINT)
    else:
        for start in tl.range(0, n_cols, BLOCK_N):
            _pass2_chunk(x_row, y_row, W, B, start + cols, n_cols, mean, rstd, LAYER_NORM,
                         W_HINT)


def variants(n, tiles):
    """(label, BLOCK_N, PASS1_BLOCK, warps, PASS1_LOOP, W_HINT, PASS2_STATIC): pass 1 by
    chunks and by the whole row, the latter also in a loop, with w and b under the default
    policy, and with pass 2 in static trips."""
    for block_n, warps in tiles:
        row = triton.next_power_of_2(n)
        yield (f"chunked {block_n}x{warps}w", block_n, block_n, warps, False, "evict_last",
               False)
        yield (f"whole-row pass 1 {block_n}x{warps}w", block_n, row, warps, False,
               "evict_last", False)
        yield f"  ... in a loop", block_n, row, warps, True, "evict_last", False
        yield f"  ... w, b default policy", block_n, row, warps, False, "", False
        yield f"  ... pass 2 in static trips", block_n, row, warps, False, "evict_last", True


def reference(op, x, w, b):
    xf = x.float()
    if op == "layer_norm":
        return F.layer_norm(xf, (x.shape[-1],), w.float(), b.float(), EPS)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype).float() \
        * w.float()


def inputs(m, n, device):
    gen = torch.Generator(device=device).manual_seed(0)
    x = (torch.randn(m, n, generator=gen, device=device) * 2 + 0.5).to(torch.bfloat16)
    w = (torch.rand(n, generator=gen, device=device) + 0.5).to(torch.bfloat16)
    b = torch.randn(n, generator=gen, device=device).to(torch.bfloat16)
    return x, w, b


def launcher(op, x, w, b, block_n, pass1, warps, pass1_loop, w_hint, pass2_static):
    m, n = x.shape
    y = torch.empty_like(x)
    stat = torch.empty(m, device=x.device, dtype=torch.float32)

    def run():
        minimal_fwd[(m,)](y, x, w, b, stat, n, EPS, LAYER_NORM=op == "layer_norm",
                          BLOCK_N=block_n, PASS1_BLOCK=pass1, PASS1_LOOP=pass1_loop,
                          W_HINT=w_hint, PASS2_STATIC=pass2_static, num_warps=warps)
        return y
    return run


def error(got, want):
    return ((got.float() - want).norm() / want.norm()).item()


def smoke():
    for op in SHAPES:
        m, n = 5, 200
        x, w, b = inputs(m, n, "cpu")
        want = reference(op, x, w, b)
        for label, block_n, pass1, warps, *rest in variants(n, ((64, 1),)):
            e = error(launcher(op, x, w, b, block_n, pass1, warps, *rest)(), want)
            assert e < 2e-2, (op, label, e)
            print(f"{op} {m}x{n} {label}: rel. error {e:.1e}", flush=True)


def tiles_arg(text):
    """--tiles: BLOCK_NxWARPS,... -> ((BLOCK_N, warps), ...), powers of two."""
    tiles = []
    for item in text.split(","):
        try:
            block_n, warps = (int(v) for v in item.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: expected BLOCK_NxWARPS, e.g. 4096x16")
        if block_n & (block_n - 1) or warps not in (1, 2, 4, 8, 16, 32) or block_n < 32:
            raise argparse.ArgumentTypeError(f"{item!r}: BLOCK_N a power of two from 32, "
                                             "warps 1-32, a power of two")
        tiles.append((block_n, warps))
    return tuple(tiles)


def chosen_shapes(args):
    """{op: (rows, cols, tiles)}: SHAPES' entries of the chosen ops, with --cols and --tiles."""
    chosen = {}
    for op in args.op:
        m, n, tiles = SHAPES[op]
        if args.cols:
            m, n = max(1, 2**26 // args.cols), args.cols
        chosen[op] = (m, n, args.tiles or tiles)
    return chosen


def sass(shapes):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    sig = {"Y": "*bf16", "X": "*bf16", "W": "*bf16", "B": "*bf16", "STAT": "*fp32",
           "n_cols": "i32", "eps": "fp32", "LAYER_NORM": "constexpr", "BLOCK_N": "constexpr",
           "PASS1_BLOCK": "constexpr", "PASS1_LOOP": "constexpr", "W_HINT": "constexpr",
           "PASS2_STATIC": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(6)}
    for op, (m, n, tiles) in shapes.items():
        for label, block_n, pass1, warps, pass1_loop, w_hint, static in variants(n, tiles):
            source = ASTSource(minimal_fwd, signature=sig, attrs=attrs,
                               constexprs={"LAYER_NORM": op == "layer_norm",
                                           "BLOCK_N": block_n, "PASS1_BLOCK": pass1,
                                           "PASS1_LOOP": pass1_loop, "W_HINT": w_hint,
                                           "PASS2_STATIC": static})
            kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": warps, "num_stages": 1})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(kernel.asm["cubin"])
                f.flush()
                usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True,
                                       text=True).stdout
                code = subprocess.run([tool, "-sass", f.name], capture_output=True,
                                      text=True).stdout
            regs = re.search(r"REG:(\d+)", usage).group(1)
            stack = re.search(r"STACK:(\d+)", usage).group(1)
            print(f"{op} {n} {label}: {regs} registers, stack {stack} B, "
                  f"{len(re.findall(r'LDG', code))} LDG in the SASS", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=sorted(SHAPES), nargs="+", default=sorted(SHAPES))
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter check only")
    parser.add_argument("--sass", action="store_true", help="sm90 ptxas report only (no GPU)")
    parser.add_argument("--cols", type=int, help="row length (rows: 2^26 elements in all)")
    parser.add_argument("--tiles", type=tiles_arg, help="BLOCK_NxWARPS,... (e.g. 4096x16,8192x8)")
    args = parser.parse_args()
    if args.smoke:
        return smoke()
    shapes = chosen_shapes(args)
    if args.sass:
        return sass(shapes)
    from _gpu import copy_bandwidth, graph_ms
    from liger_aot.kernel_src import jit_function
    from liger_aot.kernel_src.layer_norm import spec as ln_spec
    from liger_aot.kernel_src.rms_norm import spec as rms_spec
    from liger_aot.kernel_src.spec import Config

    bw = copy_bandwidth()
    print(f"copy {bw / 1e12:.2f} TB/s", flush=True)
    for op, (m, n, tiles) in shapes.items():
        x, w, b = inputs(m, n, "cuda")
        want = reference(op, x, w, b)
        runs = [(label, launcher(op, x, w, b, *tile))
                for label, *tile in variants(n, tiles)]
        # the library's looped kernel on the same tiles, pass 1 by chunks and by the row
        for block_n, warps, pass1 in [(bn, w, p) for bn, w in tiles
                                      for p in (0, triton.next_power_of_2(n))]:
            config = Config({"BLOCK_M": 1, "BLOCK_N": block_n, "LOOP": True, "STAGES": 1,
                             "PROGRAMS_PER_SM": 0, "PASS1_BLOCK": pass1}, num_warps=warps)
            spec = ln_spec.FWD if op == "layer_norm" else rms_spec.FWD
            fn = jit_function(spec, config)
            y = torch.empty_like(x)
            stats = torch.empty(2, m, device="cuda")
            if op == "layer_norm":
                args_ = (y, x, w, b, stats[0], stats[1], m, n, n, n, EPS, 1, 1)
                options = {}
            else:
                args_ = (y, x, w, stats[1], m, n, n, n, EPS, 0.0, y, x, n, n, 0, 1)
                options = {"CASTING": 0}

            def library(fn=fn, args_=args_, config=config, options=options, y=y):
                fn[(m,)](*args_, **config.constexprs, **options, num_warps=config.num_warps)
                return y
            runs.append((f"library {block_n}x{warps}w" + (" whole-row pass 1" if pass1 else ""),
                         library))
        compiled = torch.compile(lambda x, w, b: reference(op, x, w, b).to(x.dtype),
                                 dynamic=False)
        runs.append(("torch.compile", lambda: compiled(x, w, b)))
        for label, run in runs:
            with torch.no_grad():
                e = error(run(), want)
                ms = graph_ms(run)
            print(f"{op} {m}x{n} {label:28s} {ms:.4f} ms {100 * 4 * m * n / bw / ms * 1e3:5.1f}%"
                  f" of copy  err {e:.1e}", flush=True)


if __name__ == "__main__":
    main()
