"""Kernel benchmark suite: liger-aot against torch eager, torch.compile and Liger-Kernel 0.8.5,
side by side in one process on one GPU.

  python benchmarks/suite.py [--ops OP,...] [--quick] [--out DIR] [--paths PATH,...]
                               [--dtype bf16|fp16|fp32] [--warmup-ms MS] [--rep-ms MS]
                               [--graphs]
  python benchmarks/suite.py --smoke --out DIR     # CPU, tiny shapes: checks the script only

On the H200 (artifacts built for sm90, Liger-Kernel 0.8.5 installed from its wheel):

  LIGER_AOT_ARTIFACT_DIR=<build> LIGER_AOT_STRICT=1 python3 benchmarks/suite.py --out $OUT

What one run does
  1. Ceilings, measured in the same process: device-to-device copy of 2 GiB (bytes read +
     written per second) and an 8192^3 matmul in the run's dtype (2*8192^3 flops per call).
  2. For each op and shape: builds the inputs (fixed seed) and an fp32 torch reference (the
     eager formula on fp32 copies of the inputs, fp32 cotangents). Each path then runs forward
     and backward once, and every output and every input gradient is checked against the
     reference: norm-wise relative error <= the dtype's tolerance (bf16 2e-2, fp16 5e-3, fp32
     5e-3: Triton dots run fp32 as TF32) and all values finite. A path that fails, raises or is
     missing is reported with its error (column status) and not timed; the others are timed.
  3. Times, each the median of triton.testing.do_bench (L2 flushed before every call):
       fwd        the forward under torch.no_grad()
       fwd(grad)  the forward recording autograd (graph then dropped). Cross-entropy and fused
                  linear cross-entropy (liger-aot and Liger-Kernel) compute their gradients
                  here, in the forward, so for them fwd + bwd < fwd+bwd.
       bwd        the backward alone: do_bench has no per-call setup, so its procedure is
                  written out (Bench.time_with_setup): a fresh forward builds the graph outside
                  the timed region, the L2 is flushed, CUDA events bracket the backward; median.
                  No retain_graph: with it liger-aot's cross-entropy and fused linear
                  cross-entropy would scale their saved gradients out of place into new
                  buffers instead of in place (a different path from a training step), and
                  torch.compile's backward refuses it (donated buffers).
       fwd+bwd    forward then backward.
     With --graphs, also fwd, fwd(grad) and fwd+bwd from CUDA-graph replays (bwd = fwd+bwd -
     fwd(grad)), timed the same way: GPU work without host time. An eager do_bench window
     holds the host's Python and autograd time whenever the GPU waits for it (session 3 on the
     H200: ops under ~0.3 ms of GPU time, every path, read 1.5-3x their GPU time).
     The backward is torch.autograd.grad(outputs, inputs, cotangents): it returns the input
     gradients without AccumulateGrad, so nothing accumulates and .grad stays None (as it would
     with `.grad = None` before each step), and one gradient reaching two leaves (fused
     add+RMSNorm's dx for x and residual) is not copied, as in a model where those are
     activations. Cotangents: fixed random normals for tensor outputs, 1.0 for a scalar loss
     (what loss.backward() passes).
  4. Rates: minimal bytes (table below) over the time against the copy ceiling, for fwd, bwd
     and fwd+bwd; for fused linear cross-entropy TFLOP/s and % of the matmul ceiling. Peak
     memory of one fwd+bwd beyond what was allocated before it (inputs, cotangents, the
     reference) and beyond the gradients it returns (those not aliasing an input: Liger-Kernel's
     cross-entropy returns the logits' own buffer), i.e. the working memory of the op. At the
     standard shapes also the GPU kernels of one fwd and one fwd+bwd (torch.profiler; CSV
     columns fwd_kernels, fwdbwd_kernels; RoPE's "q and k in one launch" shows there).

Paths
  liger-aot      liger_aot.ops (norms with in_place=False, their default)
  eager          the torch formula in the run's dtype (what Hugging Face models run; the
                 cross-entropy losses upcast the logits to fp32 as HF does)
  torch.compile  torch.compile(formula, dynamic=False), default mode. Dynamo is reset before
                 each shape, so each shape compiles two graphs (training and no-grad); the norm
                 sweep recompiles per N. Compile time is not in any timing.
  liger-kernel   liger_kernel.transformers.functional (Liger-Kernel 0.8.5), in_place=False for
                 the norms (its functional's default True writes dx into the cotangent). Where
                 a function is missing or the package does not import, the row says "n/a" and
                 why. Liger-Kernel writes some results into its inputs whatever the flags
                 (cross-entropy: the gradient into the logits; SwiGLU/GeGLU backward: da, db
                 into a, b; RoPE: into q, k and dq, dk): each path gets its own copies of inputs
                 and cotangents, checked after one call; later timed calls see changed values,
                 which does not change the work. Its cross-entropy backward compares
                 grad_output with 1.0 on the host (a synchronization): part of its time.

Shapes: the standard shape of each op first (--quick runs only those); the norms also sweep
N = 1K..64K with M*N = 64M elements (1024 x 65536 ... 65536 x 1024; 16384 x 4096 is the
standard shape); cross-entropy also runs vocab 256000 (time should scale with V).

Outputs in --out: kernels.csv (one row per op, shape, path; every figure above), kernels.png
(fwd+bwd ms and % of the ceiling per op at the standard shapes), kernels_<norm>_sweep.png (%
of copy against N per path: fwd, bwd and fwd+bwd panels), kernels_targets.txt (the issue's
targets, evaluated per path). Plots need matplotlib (else a line says so).

Runtime (estimate, H200, default run, cold inductor cache): ~4-5 min. 27 op-shapes x 4
paths: ~1.5 min of checks and timing (four timings per path, each ~10 ms of warm-up and 50 ms
of repeats plus the L2 flushes; cross-entropy repeats >= 300 ms, the fused linear loss
>= 500 ms), and ~2.5 min of torch.compile (54 graphs, 2-4 s each, ~20 s for the first; about
half that with a warm inductor cache). --quick (8 op-shapes): ~1.5 min. Without torch.compile
(--paths liger-aot,eager,liger-kernel): ~2 min. The run prints each shape's wall time and
the total.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import math
import os
import statistics
import sys
import textwrap
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "benchmarks")):  # the package; _gpu beside this file
    if _path not in sys.path:
        sys.path.insert(0, _path)

from _gpu import capture_graph  # noqa: E402

PATHS = ("liger-aot", "eager", "torch.compile", "liger-kernel")
NORM_NS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
NORM_ELEMENTS = 64 * 2**20  # M * N of every norm sweep shape
EPS = 1e-6
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# norm-wise relative error allowed against the fp32 reference (fp32: Triton dots run as TF32)
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 5e-3}
PASSES = ("fwd", "bwd", "fwdbwd")
PASS_LABEL = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}


# -- cases ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Setup:
    """One op at one shape: inputs (those with requires_grad get gradients), the eager
    formula (also run on fp32 copies of the inputs as the reference), and per path a callable
    taking the inputs and returning a tensor or a tuple of tensors, or a string saying why the
    path is not available."""
    inputs: tuple
    formula: Callable
    paths: dict


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    title: str
    shapes: tuple        # dicts of dimensions; shapes[0] is the standard shape
    smoke_shapes: tuple  # tiny shapes for --smoke (CPU, Triton interpreter)
    label: Callable      # shape -> "16384x4096"
    traffic: Callable    # (shape, itemsize) -> {"fwd", "bwd", "fwdbwd": minimal bytes or None}
    flops: Optional[Callable]  # shape -> {"fwd", "bwd", "fwdbwd": flops or None}, or None
    bytes_doc: str
    build: Callable      # (shape, dtype, device, generator) -> Setup
    sweep: Optional[str] = None  # the dimension swept over shapes[1:], for the line plots
    min_rep_ms: float = 0.0      # do_bench repeat time at least this (slow ops: enough calls)


def _randn(shape, dtype, device, gen, scale=1.0, offset=0.0):
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return (t * scale + offset).to(dtype)


def _leaf(t):
    return t.requires_grad_()


def _liger_kernel(name: str, adapt: Callable = lambda f: f):
    """Liger-Kernel's functional `name` adapted by `adapt`, or a string saying why not."""
    try:
        import liger_kernel.transformers.functional as lf
    except Exception as e:  # noqa: BLE001 - any import failure is reported as n/a
        return f"n/a: liger_kernel does not import ({type(e).__name__}: {e})"
    fn = getattr(lf, name, None)
    if fn is None:
        return f"n/a: {liger_kernel_version()} has no transformers.functional.{name}"
    return adapt(fn)


def liger_kernel_version() -> str:
    try:
        from importlib.metadata import version
        return f"Liger-Kernel {version('liger_kernel')}"
    except Exception:  # noqa: BLE001
        return "Liger-Kernel not installed"


def _liger_aot(module: str, name: str, adapt: Callable = lambda f: f):
    try:
        mod = __import__(f"liger_aot.ops.{module}", fromlist=[name])
        return adapt(getattr(mod, name))
    except Exception as e:  # noqa: BLE001
        return f"error: liger_aot.ops.{module}.{name}: {type(e).__name__}: {e}"


def _paths(formula, aot, liger):
    return {"liger-aot": aot, "eager": formula,
            "torch.compile": torch.compile(formula, dynamic=False), "liger-kernel": liger}


def _rms(xf):
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)


def build_rms_norm(shape, dtype, device, gen):
    M, N = shape["M"], shape["N"]
    x = _leaf(_randn((M, N), dtype, device, gen))
    w = _leaf(_randn((N,), dtype, device, gen, 0.1, 1.0))

    def formula(x, w):  # Llama casting: normalize in fp32, cast, then scale
        return _rms(x.float()).to(x.dtype) * w

    return Setup((x, w), formula, _paths(
        formula,
        _liger_aot("rms_norm", "rms_norm",
                   lambda f: lambda x, w: f(x, w, EPS, in_place=False)),
        _liger_kernel("liger_rms_norm", lambda f: lambda x, w: f(x, w, EPS, in_place=False))))


def build_layer_norm(shape, dtype, device, gen):
    M, N = shape["M"], shape["N"]
    x = _leaf(_randn((M, N), dtype, device, gen))
    w = _leaf(_randn((N,), dtype, device, gen, 0.1, 1.0))
    b = _leaf(_randn((N,), dtype, device, gen, 0.1))

    def formula(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, EPS)

    return Setup((x, w, b), formula, _paths(
        formula,
        _liger_aot("layer_norm", "layer_norm", lambda f: lambda x, w, b: f(x, w, b, EPS)),
        _liger_kernel("liger_layer_norm", lambda f: lambda x, w, b: f(x, w, b, EPS))))


def build_fused_add_rms_norm(shape, dtype, device, gen):
    M, N = shape["M"], shape["N"]
    x = _leaf(_randn((M, N), dtype, device, gen))
    r = _leaf(_randn((M, N), dtype, device, gen))
    w = _leaf(_randn((N,), dtype, device, gen, 0.1, 1.0))

    def formula(x, r, w):  # (rmsnorm(x + r), x + r): the residual stream goes on
        s = x + r
        return _rms(s.float()).to(s.dtype) * w, s

    return Setup((x, r, w), formula, _paths(
        formula,
        _liger_aot("rms_norm", "fused_add_rms_norm",
                   lambda f: lambda x, r, w: f(x, r, w, EPS, in_place=False)),
        _liger_kernel("liger_fused_add_rms_norm",
                      lambda f: lambda x, r, w: f(x, r, w, EPS, in_place=False))))


def _build_glu(act, aot_name, liger_name):
    def build(shape, dtype, device, gen):
        M, N = shape["M"], shape["N"]
        a = _leaf(_randn((M, N), dtype, device, gen))
        b = _leaf(_randn((M, N), dtype, device, gen))

        def formula(a, b):
            return act(a) * b

        return Setup((a, b), formula, _paths(formula, _liger_aot(aot_name, aot_name),
                                             _liger_kernel(liger_name)))
    return build


build_swiglu = _build_glu(F.silu, "swiglu", "liger_swiglu")
build_geglu = _build_glu(lambda a: F.gelu(a, approximate="tanh"), "geglu", "liger_geglu")


def build_rope(shape, dtype, device, gen):
    B, H, KH, S, D = shape["B"], shape["H"], shape["KH"], shape["S"], shape["D"]
    # Hugging Face's layout: projections viewed (B, S, heads, D), then transposed to
    # (B, heads, S, D) without a copy
    q = _leaf(_randn((B, S, H, D), dtype, device, gen).transpose(1, 2))
    k = _leaf(_randn((B, S, KH, D), dtype, device, gen).transpose(1, 2))
    inv_freq = 10000.0 ** (-torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
    angle = torch.arange(S, device=device, dtype=torch.float32)[:, None] * inv_freq
    angle = torch.cat((angle, angle), -1)[None]  # (1, S, D)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)

    def rotate_half(t):
        return torch.cat((-t[..., D // 2:], t[..., :D // 2]), -1)

    def formula(q, k):  # apply_rotary_pos_emb, unsqueeze_dim=1
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s

    return Setup((q, k), formula, _paths(
        formula,
        _liger_aot("rope", "liger_rotary_pos_emb", lambda f: lambda q, k: f(q, k, cos, sin)),
        _liger_kernel("liger_rope", lambda f: lambda q, k: tuple(f(q, k, cos, sin)))))


def build_cross_entropy(shape, dtype, device, gen):
    M, V = shape["M"], shape["V"]
    x = _leaf(_randn((M, V), dtype, device, gen))
    target = torch.randint(0, V, (M,), generator=gen, device=device)

    def formula(x):  # Hugging Face upcasts the logits
        return F.cross_entropy(x.float(), target)

    return Setup((x,), formula, _paths(
        formula,
        _liger_aot("cross_entropy", "cross_entropy", lambda f: lambda x: f(x, target)),
        _liger_kernel("liger_cross_entropy", lambda f: lambda x: f(x, target))))


def build_fused_linear_cross_entropy(shape, dtype, device, gen):
    T, H, V = shape["T"], shape["H"], shape["V"]
    x = _leaf(_randn((T, H), dtype, device, gen))
    w = _leaf(_randn((V, H), dtype, device, gen, 0.02))
    target = torch.randint(0, V, (T,), generator=gen, device=device)

    def formula(x, w):
        return F.cross_entropy((x @ w.t()).float(), target)

    return Setup((x, w), formula, _paths(
        formula,
        _liger_aot("fused_linear_cross_entropy", "fused_linear_cross_entropy",
                   lambda f: lambda x, w: f(x, w, target)),
        _liger_kernel("liger_fused_linear_cross_entropy",
                      lambda f: lambda x, w: f(x, w, target))))


def _mn(shape):
    return f"{shape['M']}x{shape['N']}"


def _norm_shapes(n_list=NORM_NS, elements=NORM_ELEMENTS, standard_n=4096):
    std = {"M": elements // standard_n, "N": standard_n}
    return (std,) + tuple({"M": elements // n, "N": n} for n in n_list if n != standard_n)


def _norm_case(op, title, build, fwd_passes, bwd_passes, doc):
    def traffic(s, e):
        mn = s["M"] * s["N"] * e
        return {"fwd": fwd_passes * mn, "bwd": bwd_passes * mn,
                "fwdbwd": (fwd_passes + bwd_passes) * mn}
    return Case(op, title, _norm_shapes(),
                _norm_shapes((64, 128, 256), 16 * 64, 64), _mn, traffic, None, doc, build,
                sweep="N")


def _glu_case(op, title, build):
    def traffic(s, e):
        mn = s["M"] * s["N"] * e
        return {"fwd": 3 * mn, "bwd": 5 * mn, "fwdbwd": 8 * mn}
    return Case(op, title, ({"M": 8192, "N": 14336},), ({"M": 8, "N": 64},), _mn, traffic,
                None, "fwd reads a, b, writes c: 3*M*N*e; bwd reads dc, a, b, writes da, db: "
                "5*M*N*e", build)


def _rope_label(s):
    return f"q {s['B']}x{s['H']}x{s['S']}x{s['D']}, k {s['KH']} heads"


def _rope_traffic(s, e):
    qk = s["B"] * (s["H"] + s["KH"]) * s["S"] * s["D"] * e
    return {"fwd": 2 * qk, "bwd": 2 * qk, "fwdbwd": 4 * qk}


def _ce_traffic(s, e):
    mv = s["M"] * s["V"] * e
    return {"fwd": mv, "bwd": None, "fwdbwd": 2 * mv}


def _flce_flops(s):
    mm = 2 * s["T"] * s["H"] * s["V"]
    return {"fwd": mm, "bwd": None, "fwdbwd": 3 * mm}


CASES = {c.op: c for c in (
    _norm_case("rms_norm", "RMSNorm", build_rms_norm, 2, 3,
               "fwd reads x, writes y: 2*M*N*e; bwd (with the weight gradient) reads x, dy, "
               "writes dx: 3*M*N*e (weight, rstd and dw partials not counted)"),
    _norm_case("layer_norm", "LayerNorm", build_layer_norm, 2, 3,
               "fwd reads x, writes y: 2*M*N*e; bwd (with weight and bias gradients) reads x, "
               "dy, writes dx: 3*M*N*e (mean, rstd, partials not counted)"),
    _norm_case("fused_add_rms_norm", "fused add+RMSNorm", build_fused_add_rms_norm, 4, 4,
               "fwd reads x, residual, writes y, s = x + residual: 4*M*N*e; bwd reads dy, "
               "ds, s, writes one dx (x's and residual's gradients are equal): 4*M*N*e"),
    _glu_case("swiglu", "SwiGLU", build_swiglu),
    _glu_case("geglu", "GeGLU (tanh)", build_geglu),
    Case("rope", "RoPE", ({"B": 4, "H": 32, "KH": 8, "S": 4096, "D": 128},),
         ({"B": 1, "H": 4, "KH": 2, "S": 8, "D": 16},), _rope_label, _rope_traffic, None,
         "q (B, H, S, D) and k (B, KH, S, D) in HF's layout (a transposed (B, S, heads, D)); "
         "fwd reads q, k, writes both rotated: 2*B*(H+KH)*S*D*e; bwd the same for dq, dk; "
         "cos, sin (S*D each) not counted", build_rope),
    Case("cross_entropy", "CrossEntropy", ({"M": 8192, "V": 128256}, {"M": 8192, "V": 256000}),
         ({"M": 8, "V": 100}, {"M": 8, "V": 200}), lambda s: f"{s['M']}x{s['V']}",
         _ce_traffic, None,
         "mean loss over M rows of V logits; fwd (loss only) reads the logits: M*V*e; "
         "fwd+bwd reads the logits and writes their gradient: 2*M*V*e; bwd alone has no "
         "minimal count (the gradient can be written by the forward), so no rate",
         build_cross_entropy, sweep="V", min_rep_ms=300),
    Case("fused_linear_cross_entropy", "Linear+CrossEntropy",
         ({"T": 8192, "H": 4096, "V": 128256},), ({"T": 8, "H": 32, "V": 100},),
         lambda s: f"{s['T']}x{s['H']}->{s['V']}", lambda s, e: {p: None for p in PASSES},
         _flce_flops,
         "loss of x (T, H) @ W (V, H)^T; flops: fwd 2*T*H*V (logits), fwd+bwd 6*T*H*V "
         "(+ dx, dW); TFLOP/s against the matmul ceiling; bwd alone no rate (the gradients "
         "can be computed in the forward); peak memory beyond inputs, weights and gradients",
         build_fused_linear_cross_entropy, min_rep_ms=500),
)}

# The targets, evaluated per path on every shape of the op that was run:
# (op, pass, minimum % of the copy ceiling, wording)
TARGETS = tuple(
    [(op, "fwd", 90, "forward >= 90% of copy, N = 1K..64K")
     for op in ("rms_norm", "layer_norm", "fused_add_rms_norm")]
    + [(op, "bwd", 80, "backward with the weight gradient >= 80% of copy")
       for op in ("rms_norm", "layer_norm", "fused_add_rms_norm")]
    + [("swiglu", "fwdbwd", 90, "fwd+bwd >= 90% of copy"),
       ("geglu", "fwdbwd", 90, "fwd+bwd >= 90% of copy"),
       ("rope", "fwdbwd", 85, "fwd+bwd >= 85% of copy (q and k in one launch)")])


def byte_table(itemsize: int = 2) -> str:
    """The byte / flop model of every case, as the --help epilog shows it."""
    lines = [f"Minimal traffic per op (e = {itemsize} bytes per element), standard shape first:"]
    for case in CASES.values():
        shape = case.shapes[0]
        counts = case.flops(shape) if case.flops else case.traffic(shape, itemsize)
        scale, unit = (1e12, "TFLOP") if case.flops else (1e9, "GB")
        figures = ", ".join(f"{PASS_LABEL[p]} {counts[p] / scale:.3g} {unit}"
                            for p in PASSES if counts[p])
        lines.append(f"  {case.op} [{case.label(shape)}]: {figures}")
        lines += textwrap.wrap(case.bytes_doc, 92, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
    return "\n".join(lines)


def select_shapes(case: Case, quick: bool, smoke: bool, norm_ns=()) -> tuple:
    """The shapes to run: the smoke ones, the standard one (quick) or all; norm_ns (row
    lengths) replaces a norm sweep's, each at the sweep's NORM_ELEMENTS."""
    if norm_ns and case.sweep == "N" and not smoke:
        return tuple({"M": NORM_ELEMENTS // n, "N": n} for n in norm_ns)
    shapes = case.smoke_shapes if smoke else case.shapes
    return shapes[:1] if quick else shapes


# -- timing and memory -----------------------------------------------------------------------

class Bench:
    """Medians of triton.testing.do_bench on CUDA; on CPU (--smoke) a few wall-clock calls,
    only to run the script's logic."""

    def __init__(self, device: str, warmup_ms: float, rep_ms: float):
        self.device, self.warmup_ms, self.rep_ms = device, warmup_ms, rep_ms

    def time(self, fn, min_rep_ms: float = 0.0) -> float:
        if self.device == "cpu":
            return self._cpu(lambda: None, lambda _: fn())
        from triton.testing import do_bench
        return do_bench(fn, warmup=self.warmup_ms, rep=max(self.rep_ms, min_rep_ms),
                        return_mode="median")

    def time_graph(self, fn, min_rep_ms: float = 0.0) -> Optional[float]:
        """Median time of one CUDA-graph replay of fn (captured once after three warm-up calls
        on a side stream), through do_bench like the other timings: the replay holds no host
        time, so a path whose Python outlasts its kernels is timed on its GPU work alone.
        None on CPU; raises when fn cannot be captured (e.g. it synchronizes with the host)."""
        if self.device == "cpu":
            return None
        graph = capture_graph(fn)
        try:
            return self.time(graph.replay, min_rep_ms)
        finally:
            del graph

    def time_with_setup(self, setup, fn, min_rep_ms: float = 0.0) -> float:
        """Median time of fn(setup()) with setup outside the timed region: do_bench's
        procedure (a first call, then warm-up and repeats, the L2 flushed before each timed
        call, CUDA events around it) with a setup step before each call. The counts are sized
        from a whole iteration (setup included, wall clock), so a long setup before a short fn
        (Liger-Kernel's fused linear loss: 55 ms forward, a no-op backward) stays within about
        warmup + rep ms; at least 3 timed calls."""
        if self.device == "cpu":
            return self._cpu(setup, fn)
        from triton import runtime
        driver = runtime.driver.active
        cache = driver.get_empty_cache_for_benchmark()

        def once(events=None):
            state = setup()
            driver.clear_cache(cache)
            if events is not None:
                events[0].record()
            fn(state)
            if events is not None:
                events[1].record()

        once()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            once()
        torch.cuda.synchronize()
        per_call_ms = max((time.perf_counter() - start) * 1e3 / 5, 1e-3)
        for _ in range(max(1, int(self.warmup_ms / per_call_ms))):
            once()
        n = max(3, int(max(self.rep_ms, min_rep_ms) / per_call_ms))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for pair in events:
            once(pair)
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in events)

    @staticmethod
    def _cpu(setup, fn, reps=3) -> float:
        times = []
        for _ in range(reps):
            state = setup()
            start = time.perf_counter()
            fn(state)
            times.append((time.perf_counter() - start) * 1e3)
            del state
        return statistics.median(times)


def count_gpu_kernels(fn, device) -> Optional[int]:
    """GPU activities (kernels, memsets, copies) of one call of fn, from torch.profiler;
    None on CPU or when the profiler cannot trace the device."""
    if device != "cuda":
        return None
    try:
        from torch.profiler import ProfilerActivity, profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        count = sum(1 for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CUDA)
        return count or None  # every call here launches something: 0 means no trace
    except Exception:  # noqa: BLE001 - the count is extra information
        return None


def copy_bandwidth(bench: Bench) -> float:
    """Device-to-device copy, bytes read + written per second."""
    n = 2 * 1024**3 if bench.device == "cuda" else 64 * 1024**2
    x = torch.empty(n, dtype=torch.uint8, device=bench.device)
    y = torch.empty_like(x)
    ms = bench.time(lambda: y.copy_(x))
    return 2 * n / (ms * 1e-3)


def matmul_rate(bench: Bench, dtype) -> float:
    n = 8192 if bench.device == "cuda" else 512
    a = torch.randn(n, n, device=bench.device, dtype=dtype)
    b = torch.randn(n, n, device=bench.device, dtype=dtype)
    ms = bench.time(lambda: a @ b)
    return 2 * n**3 / (ms * 1e-3)


def _storage_key(t):
    return (t.device, t.untyped_storage().data_ptr())


def extra_grad_bytes(grads, inputs) -> int:
    """Bytes of the returned gradients that are new memory: each storage counted once, and
    none that is an input's own buffer."""
    seen = {_storage_key(t) for t in inputs if isinstance(t, torch.Tensor)}
    total = 0
    for g in grads:
        if g is None or _storage_key(g) in seen:
            continue
        seen.add(_storage_key(g))
        total += g.untyped_storage().nbytes()
    return total


# -- checking ---------------------------------------------------------------------------------

def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def rel_error(value: torch.Tensor, ref: torch.Tensor) -> float:
    """||value - ref|| / ||ref|| (fp64 sums over chunks, so huge tensors need no big
    temporaries); inf when value has non-finite entries or the shapes differ."""
    if tuple(value.shape) != tuple(ref.shape):
        return math.inf
    v, r = value.detach().reshape(-1), ref.detach().reshape(-1)
    num = den = 0.0
    step = 1 << 26
    for i in range(0, v.numel(), step):
        vc, rc = v[i:i + step].float(), r[i:i + step].float()
        if not torch.isfinite(vc).all():
            return math.inf
        num += (vc - rc).double().square().sum().item()
        den += rc.double().square().sum().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)


def fresh(t):
    """A path's own copy of an input (same strides), a leaf like the original."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return t
    return t.detach().clone().requires_grad_(t.requires_grad)


def make_cotangents(outputs, dtype, gen):
    """1.0 for a scalar loss, fixed random normals (in the output's layout) otherwise."""
    cots = []
    for o in outputs:
        if o.dim() == 0:
            cots.append(torch.ones((), dtype=o.dtype, device=o.device))
        else:
            c = torch.empty_like(o, dtype=dtype)
            c.copy_(torch.randn(o.shape, generator=gen, device=o.device))
            cots.append(c)
    return cots


@dataclasses.dataclass
class Reference:
    outputs: tuple
    grads: tuple
    cotangents: list


def reference(setup: Setup, dtype, gen) -> Reference:
    ref_inputs = [t.detach().float().requires_grad_(t.requires_grad)
                  if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                  for t in setup.inputs]
    outs = as_tuple(setup.formula(*ref_inputs))
    cots = make_cotangents(outs, dtype, gen)
    grads = torch.autograd.grad(outs, [t for t in ref_inputs if getattr(t, "requires_grad",
                                                                          False)],
                                [c.float() for c in cots])
    return Reference(tuple(o.detach() for o in outs), tuple(grads), cots)


def check_path(fn, xs, cots, ref: Reference, tol: float) -> float:
    """Runs forward and backward once; returns the largest relative error, or raises
    AssertionError naming what is off."""
    outs = as_tuple(fn(*xs))
    if len(outs) != len(ref.outputs):
        raise AssertionError(f"{len(outs)} outputs, the reference has {len(ref.outputs)}")
    errors = {f"out{i}": rel_error(o, r) for i, (o, r) in enumerate(zip(outs, ref.outputs))}
    grads = torch.autograd.grad(outs, [x for x in xs if getattr(x, "requires_grad", False)],
                                cots)
    errors.update({f"grad{i}": rel_error(g, r)
                   for i, (g, r) in enumerate(zip(grads, ref.grads))})
    bad = {k: v for k, v in errors.items() if not v <= tol}
    if bad:
        raise AssertionError("mismatch vs fp32 reference: " + ", ".join(
            f"{k} rel err {v:.2e}" for k, v in bad.items()) + f" (tolerance {tol:.0e})")
    return max(errors.values())


# -- one op at one shape ---------------------------------------------------------------------

COLUMNS = ("op", "shape", "sweep_value", "standard", "path", "dtype", "status", "max_rel_err",
           "fwd_ms", "fwd_grad_ms", "bwd_ms", "fwdbwd_ms",
           "fwd_bytes", "bwd_bytes", "fwdbwd_bytes",
           "fwd_pct_copy", "bwd_pct_copy", "fwdbwd_pct_copy",
           "fwd_graph_ms", "fwd_grad_graph_ms", "bwd_graph_ms", "fwdbwd_graph_ms",
           "fwd_graph_pct_copy", "bwd_graph_pct_copy", "fwdbwd_graph_pct_copy",
           "fwd_flops", "fwdbwd_flops", "fwd_tflops", "fwdbwd_tflops",
           "fwd_pct_matmul", "fwdbwd_pct_matmul",
           "peak_extra_gib", "fwd_kernels", "fwdbwd_kernels", "copy_tbps", "matmul_tflops",
           "note")


def add_rates(row: dict, traffic: dict, flops: Optional[dict], copy_bw: float,
              mm_rate: float) -> dict:
    """Fills the bytes / flops columns and the rates derived from the times in row."""
    for p in PASSES:
        ms = row.get(f"{p}_ms")
        nbytes = traffic.get(p)
        row[f"{p}_bytes"] = nbytes
        row[f"{p}_pct_copy"] = (100 * nbytes / (ms * 1e-3) / copy_bw
                                if nbytes and _finite(ms) and ms > 0 else None)
        ms = row.get(f"{p}_graph_ms")
        row[f"{p}_graph_pct_copy"] = (100 * nbytes / (ms * 1e-3) / copy_bw
                                      if nbytes and _finite(ms) and ms > 0 else None)
    if flops:
        for p in ("fwd", "fwdbwd"):
            ms, n = row.get(f"{p}_ms"), flops.get(p)
            row[f"{p}_flops"] = n
            ok = n and _finite(ms) and ms > 0
            row[f"{p}_tflops"] = n / (ms * 1e-3) / 1e12 if ok else None
            row[f"{p}_pct_matmul"] = 100 * n / (ms * 1e-3) / mm_rate if ok else None
    return row


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def run_shape(case: Case, shape: dict, paths, dtype, device, bench: Bench, copy_bw: float,
              mm_rate: float, log=print, graphs: bool = False) -> list:
    """Check every path at one shape, then time those that passed. One row per path. With
    graphs, also from CUDA-graph replays (time_graph_columns)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    if "torch.compile" in paths:
        import torch._dynamo as dynamo
        dynamo.reset()
    setup = case.build(shape, dtype, device, gen)
    ref = reference(setup, dtype, gen)
    tol = TOLERANCE[dtype]
    traffic = case.traffic(shape, torch.empty((), dtype=dtype).element_size())
    flops = case.flops(shape) if case.flops else None
    sweep_value = shape.get(case.sweep) if case.sweep else None
    rows = []
    for path in paths:
        row = {"op": case.op, "shape": case.label(shape), "sweep_value": sweep_value,
               "standard": shape == case.shapes[0] or shape == case.smoke_shapes[0],
               "path": path, "dtype": str(dtype).replace("torch.", ""),
               "copy_tbps": copy_bw / 1e12, "matmul_tflops": mm_rate / 1e12, "note": ""}
        fn = setup.paths.get(path, f"n/a: unknown path {path}")
        try:
            if isinstance(fn, str):
                status, _, note = fn.partition(": ")  # "n/a: why" or "error: what"
                row["status"], row["note"] = status, note
                continue
            xs = [fresh(t) for t in setup.inputs]
            cots = [c.clone() for c in ref.cotangents]
            gx = [x for x in xs if getattr(x, "requires_grad", False)]
            try:
                row["max_rel_err"] = check_path(fn, xs, cots, ref, tol)
            except Exception as e:  # noqa: BLE001 - reported, not timed
                row["status"] = "check failed"
                row["note"] = f"{type(e).__name__}: {e}"
                continue

            def forward():
                return as_tuple(fn(*xs))

            def no_grad_forward():
                with torch.no_grad():
                    fn(*xs)

            def step():
                return torch.autograd.grad(forward(), gx, cots)

            rep = case.min_rep_ms
            row["fwd_ms"] = bench.time(no_grad_forward, rep)
            row["fwd_grad_ms"] = bench.time(forward, rep)
            row["bwd_ms"] = bench.time_with_setup(
                forward, lambda outs: torch.autograd.grad(outs, gx, cots), rep)
            row["fwdbwd_ms"] = bench.time(step, rep)
            if graphs:
                time_graph_columns(row, bench, no_grad_forward, forward, step, rep)
            row["peak_extra_gib"] = peak_extra(step, xs + cots, device)
            if row["standard"]:
                row["fwd_kernels"] = count_gpu_kernels(no_grad_forward, device)
                row["fwdbwd_kernels"] = count_gpu_kernels(step, device)
            row["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - keep the other paths' numbers
            row["status"] = "error"
            row["note"] = f"{type(e).__name__}: {e}"
        finally:
            add_rates(row, traffic, flops, copy_bw, mm_rate)
            rows.append(row)
            log(format_row(row))
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def time_graph_columns(row: dict, bench: Bench, no_grad_forward, forward, step, rep: float):
    """fwd, fwd(grad) and fwd+bwd from CUDA-graph replays, and bwd as fwd+bwd - fwd(grad)
    (a backward cannot be captured apart from the forward that builds its graph). A path
    that cannot be captured gets no graph columns and says why in its note."""
    try:
        row["fwd_graph_ms"] = bench.time_graph(no_grad_forward, rep)
        row["fwd_grad_graph_ms"] = bench.time_graph(forward, rep)
        row["fwdbwd_graph_ms"] = bench.time_graph(step, rep)
        if _finite(row["fwdbwd_graph_ms"]) and _finite(row["fwd_grad_graph_ms"]):
            row["bwd_graph_ms"] = row["fwdbwd_graph_ms"] - row["fwd_grad_graph_ms"]
    except Exception as e:  # noqa: BLE001 - the eager timings stand
        for key in ("fwd_graph_ms", "fwd_grad_graph_ms", "bwd_graph_ms", "fwdbwd_graph_ms"):
            row.pop(key, None)
        row["note"] = (row.get("note", "") + f" no CUDA graph: {type(e).__name__}: "
                       f"{str(e)[:120]}").strip()
        torch.cuda.synchronize()


def peak_extra(step, live, device) -> Optional[float]:
    """GiB allocated at the peak of one step beyond what was allocated before it and beyond
    the new gradients it returns."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grads = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before - extra_grad_bytes(grads, live)
    return peak / 2**30


# -- reporting --------------------------------------------------------------------------------

def _fmt(v, spec=".3f", none="-"):
    if v is None or (isinstance(v, float) and math.isnan(v)) or v == "":
        return none
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


TABLE = (("op", 26, "s", "op"), ("shape", 28, "s", "shape"), ("path", 13, "s", "path"),
         ("fwd ms", 8, ".3f", "fwd_ms"), ("fwd(g) ms", 9, ".3f", "fwd_grad_ms"),
         ("bwd ms", 8, ".3f", "bwd_ms"), ("f+b ms", 8, ".3f", "fwdbwd_ms"),
         ("fwd%cp", 6, ".0f", "fwd_pct_copy"), ("bwd%cp", 6, ".0f", "bwd_pct_copy"),
         ("f+b%cp", 6, ".0f", "fwdbwd_pct_copy"), ("TFLOP/s", 7, ".0f", "fwdbwd_tflops"),
         ("%mm", 4, ".0f", "fwdbwd_pct_matmul"), ("peakGiB", 7, ".2f", "peak_extra_gib"),
         ("status", 0, "s", "status"))


def table_header() -> str:
    return " ".join(f"{h:<{w}}" if fmt == "s" else f"{h:>{w}}" for h, w, fmt, _ in TABLE)


def format_row(row: dict) -> str:
    cells = []
    for _, width, spec, key in TABLE:
        v = row.get(key)
        if key == "status":
            v = row.get("status", "") + (f": {row['note']}" if row.get("note") else "")
            cells.append(v[:200])
        elif spec == "s":
            cells.append(f"{_fmt(v, 's')[:width]:<{width}}")
        else:
            cells.append(f"{_fmt(v, spec):>{width}}")
    return " ".join(cells)


def write_csv(rows, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: _csv_value(row.get(k)) for k in COLUMNS})


def _csv_value(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def _ordered(values):
    return list(dict.fromkeys(values))


def plot_summary(rows, path: str) -> None:
    """Bars per op at its standard shape: fwd+bwd ms (log) and fwd+bwd % of the ceiling."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    std = [r for r in rows if r.get("standard")]
    groups = _ordered((r["op"], r["shape"]) for r in std)
    paths = [p for p in PATHS if any(r["path"] == p for r in std)] + \
        _ordered(r["path"] for r in std if r["path"] not in PATHS)
    fig, (ax_ms, ax_pct) = plt.subplots(2, 1, figsize=(max(8, 1.6 * len(groups)), 8))
    width = 0.8 / max(1, len(paths))
    for i, p in enumerate(paths):
        def value(key, g):
            r = next((r for r in std if (r["op"], r["shape"]) == g and r["path"] == p), {})
            v = r.get(key)
            return v if _finite(v) else float("nan")
        xs = [j + i * width for j in range(len(groups))]
        ax_ms.bar(xs, [value("fwdbwd_ms", g) for g in groups], width, label=p)
        pct = [value("fwdbwd_pct_copy", g) if _finite(value("fwdbwd_pct_copy", g))
               else value("fwdbwd_pct_matmul", g) for g in groups]
        ax_pct.bar(xs, pct, width, label=p)
    ticks = [j + 0.4 - width / 2 for j in range(len(groups))]
    labels = [f"{op}\n{shape}" for op, shape in groups]
    ax_ms.set_xticks(ticks, labels, fontsize=7)
    ax_ms.set_ylabel("fwd+bwd ms (median, log)")
    ax_ms.set_yscale("log")
    ax_ms.legend(fontsize=8)
    ax_pct.set_xticks(ticks, labels, fontsize=7)
    ax_pct.set_ylabel("fwd+bwd % of copy\n(Linear+CE: % of matmul)")
    ax_pct.axhline(100, color="gray", lw=0.5)
    fig.suptitle("kernels at their standard shapes", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sweep(rows, op: str, path: str) -> None:
    """% of copy against N per path, one panel each for fwd, bwd and fwd+bwd."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r["op"] == op and _finite(r.get("sweep_value"))]
    targets = {p: pct for o, p, pct, _ in TARGETS if o == op}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    for ax, p in zip(axes, PASSES):
        for name in _ordered(r["path"] for r in mine):
            pts = sorted((r["sweep_value"], r[f"{p}_pct_copy"]) for r in mine
                         if r["path"] == name and _finite(r.get(f"{p}_pct_copy")))
            if pts:
                ax.plot([n for n, _ in pts], [v for _, v in pts], marker="o", label=name)
        if p in targets:
            ax.axhline(targets[p], color="gray", ls="--", lw=1, label=f"target {targets[p]}%")
        ax.set_xscale("log", base=2)
        ns = sorted({r["sweep_value"] for r in mine})
        ax.set_xticks(ns, [f"{n // 1024}K" if n >= 1024 else str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("N (M*N fixed)")
        ax.set_title(f"{op} {PASS_LABEL[p]}")
        ax.grid(alpha=0.3)
    top = max([100.0] + [r[f"{p}_pct_copy"] for r in mine for p in PASSES
                         if _finite(r.get(f"{p}_pct_copy"))])
    axes[0].set_ylim(0, 1.05 * top)
    axes[0].set_ylabel("% of measured copy bandwidth")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(rows, out: str) -> list:
    """Writes kernels.png and one kernels_<op>_sweep.png per swept norm; returns the files,
    or raises ImportError without matplotlib."""
    import matplotlib  # noqa: F401 - the caller reports its absence
    files = [os.path.join(out, "kernels.png")]
    plot_summary(rows, files[0])
    for op, case in CASES.items():
        if case.sweep == "N" and len({r.get("sweep_value") for r in rows if r["op"] == op}) > 1:
            files.append(os.path.join(out, f"kernels_{op}_sweep.png"))
            plot_sweep(rows, op, files[-1])
    return files


def evaluate_targets(rows) -> list:
    """Lines of text: each target per path (minimum over the shapes run, failing shapes),
    cross-entropy's scaling with V, and the fused linear loss's time and memory."""
    lines = []
    paths = _ordered(r["path"] for r in rows)
    graphed = any(_finite(r.get("fwdbwd_graph_ms")) for r in rows)
    for (op, p, pct, words), kind in itertools.product(TARGETS, ("", "_graph")):
        if kind and not graphed:
            continue
        mine = [r for r in rows if r["op"] == op]
        if not mine:
            continue
        if kind:
            words += " [CUDA-graph replays]"
        parts = []
        for path in paths:
            vals = [(r["shape"], r[f"{p}{kind}_pct_copy"]) for r in mine
                    if r["path"] == path and _finite(r.get(f"{p}{kind}_pct_copy"))]
            if not vals:
                continue
            low = min(v for _, v in vals)
            misses = [f"{s} {v:.0f}%" for s, v in vals if v < pct]
            verdict = "PASS" if not misses else "FAIL (" + ", ".join(misses) + ")"
            parts.append(f"{path} min {low:.0f}% {verdict}")
        lines.append(f"{op} {words}: " + ("; ".join(parts) if parts else "not measured"))
    counted = [r for r in rows if r["op"] == "rope" and r.get("fwd_kernels") is not None]
    if counted:
        lines.append("rope GPU kernels per call (fwd / fwd+bwd, torch.profiler): " + "; ".join(
            f"{r['path']} {r['fwd_kernels']} / {_fmt(r.get('fwdbwd_kernels'), 'd')}"
            for r in counted))
    ce = [r for r in rows if r["op"] == "cross_entropy" and _finite(r.get("fwdbwd_ms"))]
    vocab = sorted({r["sweep_value"] for r in ce if _finite(r.get("sweep_value"))})
    if len(vocab) >= 2:
        lo, hi = vocab[0], vocab[-1]
        parts = []
        for path in paths:
            t = {r["sweep_value"]: r["fwdbwd_ms"] for r in ce if r["path"] == path}
            if lo in t and hi in t:
                parts.append(f"{path} {t[lo]:.3f} -> {t[hi]:.3f} ms (x{t[hi] / t[lo]:.2f})")
        lines.append(f"cross_entropy fwd+bwd V {lo} -> {hi} (linear: x{hi / lo:.2f}): "
                     + "; ".join(parts))
    for r in rows:
        if r["op"] == "fused_linear_cross_entropy" and _finite(r.get("fwdbwd_ms")):
            lines.append(
                f"fused_linear_cross_entropy {r['shape']} {r['path']}: fwd+bwd "
                f"{r['fwdbwd_ms']:.2f} ms, {_fmt(r.get('fwdbwd_tflops'), '.0f')} TFLOP/s "
                f"({_fmt(r.get('fwdbwd_pct_matmul'), '.0f')}% of matmul), peak beyond "
                f"inputs/weights/grads {_fmt(r.get('peak_extra_gib'), '.2f')} GiB")
    return lines


# -- command line -----------------------------------------------------------------------------

def _csv_list(choices, what):
    def parse(text):
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(bad) or '(none given)'}; choose from "
                + ", ".join(choices))
        return items
    return parse


def _row_lengths(text):
    try:
        ns = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        ns = []
    if not ns or any(not 1 <= n <= NORM_ELEMENTS for n in ns):
        raise argparse.ArgumentTypeError(
            f"takes comma-separated row lengths from 1 to {NORM_ELEMENTS}, got {text!r}")
    return ns


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=byte_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=_csv_list(tuple(CASES), "op"), default=list(CASES),
                        help="comma-separated ops to run (default all): " + ", ".join(CASES))
    parser.add_argument("--paths", type=_csv_list(PATHS, "path"), default=list(PATHS),
                        help="comma-separated paths (default all): " + ", ".join(PATHS))
    parser.add_argument("--quick", action="store_true",
                        help="only the standard shape of each op (no norm sweep, no V=256000)")
    parser.add_argument("--norm-ns", type=_row_lengths, default=(), metavar="N,...",
                        help="the norm sweeps at these row lengths instead of 1K-64K, each at "
                             f"{NORM_ELEMENTS // 2**20}M elements (M = {NORM_ELEMENTS} // N): a "
                             "model's hidden size, say (with --quick too)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."),
                        help="directory for kernels.csv, the plots and kernels_targets.txt "
                             "(default: $OUT, else .)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16",
                        help="dtype of inputs (default bf16); the matmul ceiling uses it too")
    parser.add_argument("--warmup-ms", type=float, default=10.0,
                        help="do_bench warm-up time per timing (default 10)")
    parser.add_argument("--rep-ms", type=float, default=50.0,
                        help="do_bench repeat time per timing (default 50; cross-entropy "
                             "at least 300, fused linear cross-entropy at least 500)")
    parser.add_argument("--graphs", action="store_true",
                        help="also time each path from CUDA-graph replays (columns *_graph_*, "
                             "targets marked [CUDA-graph replays]): GPU time without the "
                             "host time a fast op's Python can add to the eager timings")
    parser.add_argument("--smoke", action="store_true",
                        help="run on the CPU at tiny shapes (liger-aot and Liger-Kernel through "
                             "Triton's interpreter): checks the script end to end; its "
                             "timings mean nothing")
    return parser


def main(argv=None) -> list:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smoke and args.norm_ns:
        parser.error("--norm-ns: the smoke run's shapes are fixed")
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run on the GPU machine, or --smoke on a CPU")
        os.environ.pop("TRITON_INTERPRET", None)
    os.makedirs(args.out, exist_ok=True)
    started = time.perf_counter()
    dtype = DTYPES[args.dtype]
    bench = Bench(device, args.warmup_ms, args.rep_ms)
    copy_bw, mm_rate = copy_bandwidth(bench), matmul_rate(bench, dtype)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (--smoke)"
    print(f"{name}: copy {copy_bw / 1e12:.2f} TB/s, {args.dtype} matmul "
          f"{mm_rate / 1e12:.0f} TFLOP/s; torch {torch.__version__}, {liger_kernel_version()}",
          flush=True)
    print(table_header(), flush=True)
    rows = []
    for op in args.ops:
        case = CASES[op]
        for shape in select_shapes(case, args.quick, args.smoke, args.norm_ns):
            t0 = time.perf_counter()
            try:
                rows += run_shape(case, shape, args.paths, dtype, device, bench, copy_bw,
                                  mm_rate, log=lambda s: print(s, flush=True),
                                  graphs=args.graphs)
            except Exception as e:  # noqa: BLE001 - e.g. the reference itself ran out of memory
                print(f"{op} {case.label(shape)}: {type(e).__name__}: {e}", flush=True)
                rows += [{"op": op, "shape": case.label(shape), "path": p, "status": "error",
                          "note": f"setup/reference: {type(e).__name__}: {e}"}
                         for p in args.paths]
            finally:
                if device == "cuda":
                    torch.cuda.empty_cache()
            print(f"  ({case.label(shape)}: {time.perf_counter() - t0:.1f} s)", flush=True)
    csv_path = os.path.join(args.out, "kernels.csv")
    write_csv(rows, csv_path)
    print(f"\nwrote {csv_path}")
    try:
        for f in write_plots(rows, args.out):
            print(f"wrote {f}")
    except ImportError:
        print("matplotlib not installed: no plots")
    targets = evaluate_targets(rows)
    with open(os.path.join(args.out, "kernels_targets.txt"), "w") as f:
        f.write("\n".join(targets) + "\n")
    print("\nTargets (issue 5):")
    for line in targets:
        print("  " + line)
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    return rows


if __name__ == "__main__":
    main()
