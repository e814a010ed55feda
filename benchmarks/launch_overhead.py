"""Host cost of launching, and first-call latency, on a GPU.

  python benchmarks/launch_overhead.py [--out DIR] [--iters N]

Needs LIGER_AOT_ARTIFACT_DIR (or an installed arch wheel / local build) for the device.
Prints three tables and writes launch_overhead.csv (and first_call.csv) to --out:

1. us per launch of the same kernel at a tiny shape: liger-aot's loader (whole Kernel call:
   variant lookup, alignment check, packing, cuLaunchKernel), the bare pre-resolved launcher,
   and Triton's JIT launch `fn[grid](...)`, warm.
2. us per whole op call at 1 x 4096 bf16: liger-aot against torch eager, timed in
   alternating rounds (best round of each).
3. first-call latency per op in a fresh process (module load included), against the second.
Host-bound timings: many calls between two synchronizes, wall clock per call.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def per_call_us(fn, iters: int) -> float:
    return best_per_call_us((fn,), iters, rounds=5)[0]


def best_per_call_us(fns, iters: int, rounds: int) -> list:
    """us per call of each callable: the best of `rounds` rounds of `iters` calls (host
    timing noise only ever adds). Several callables alternate round by round: the host's
    state (clocks, other processes) drifts between runs by up to 2x, and alternating gives
    each the same share of it."""
    for fn in fns:
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
            best[i] = min(best[i], (time.perf_counter() - start) / iters * 1e6)
    return best


def launch_table(iters: int) -> list:
    from liger_aot.kernel_src.rms_norm import spec
    from liger_aot.runtime import Kernel

    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    rstd = torch.empty(1, device="cuda", dtype=torch.float32)
    config = spec.select_config(4096)
    options = (("CASTING", 0),)
    kernel = Kernel(spec.FWD)
    # no residual: S/R point at y/x and are never read (has_residual=0)
    args = (y, x, w, rstd, 1, 4096, 4096, 4096, 1e-6, 0.0, y, x, 4096, 4096, 0, 1)

    def aot_call():
        kernel((1,), *args, dtype=torch.bfloat16, config=config, options=options)

    aot_call()
    (launcher,) = kernel._launchers.values()
    values = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]

    def bare_launch():
        launcher((1,), values, args)

    rows = [("liger-aot Kernel call (lookup + pack + launch)", per_call_us(aot_call, iters)),
            ("liger-aot pre-resolved launcher (pack + launch)", per_call_us(bare_launch, iters))]

    os.environ.pop("TRITON_INTERPRET", None)
    from liger_aot.kernel_src import triton_function

    fn = triton_function(spec.FWD)
    constexprs = dict(options, **config.constexprs)

    def jit_call():
        fn[(1,)](*args, **constexprs, num_warps=config.num_warps, num_stages=config.num_stages)

    jit_call()
    torch.cuda.synchronize()
    rows.append(("Triton JIT fn[grid](...), warm", per_call_us(jit_call, iters)))
    ref = y.clone()
    aot_call()
    torch.cuda.synchronize()
    assert torch.equal(ref, y), "AOT and JIT launches of one kernel disagree"
    return rows


def op_table(iters: int) -> list:
    import liger_aot.transformers.functional as ops

    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    a = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)

    def eager_rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    cases = {
        "RMSNorm forward (no grad)": (lambda: ops.liger_rms_norm(x.detach(), w.detach()),
                                      lambda: eager_rms(x.detach(), w.detach())),
        "RMSNorm forward+backward": (lambda: ops.liger_rms_norm(x, w).backward(g),
                                     lambda: eager_rms(x, w).backward(g)),
        "SwiGLU forward+backward": (lambda: ops.liger_swiglu(a, b).backward(g),
                                    lambda: (F.silu(a) * b).backward(g)),
    }
    return [(name, *best_per_call_us(pair, iters, rounds=9)) for name, pair in cases.items()]


FIRST_CALL_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t_torch = time.perf_counter()
import torch.nn.functional as F
EAGER = len(sys.argv) > 1 and sys.argv[1] == "eager"
if EAGER:
    class ops:  # the same math in torch eager, for a like-for-like first call
        @staticmethod
        def liger_rms_norm(x, w):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
        @staticmethod
        def liger_swiglu(a, b):
            return F.silu(a) * b
        @staticmethod
        def liger_rotary_pos_emb(q, k, cos, sin):
            def rot(t):
                h = t.shape[-1] // 2
                return torch.cat((-t[..., h:], t[..., :h]), dim=-1)
            c, s = cos.unsqueeze(1), sin.unsqueeze(1)
            return q * c + rot(q) * s, k * c + rot(k) * s
        @staticmethod
        def liger_cross_entropy(x, t):
            return F.cross_entropy(x.float(), t)
    loader_s = [0.0]
else:
    import liger_aot.transformers.functional as ops
    import liger_aot.runtime.registry as registry
    loader_s = [0.0]
    _find = registry.find_variant
    def timed_find(*a, **k):
        s = time.perf_counter()
        try:
            return _find(*a, **k)
        finally:
            loader_s[0] += time.perf_counter() - s
    registry.find_variant = timed_find
t_import = time.perf_counter()
dt = torch.bfloat16
x = torch.randn(8, 4096, device="cuda", dtype=dt, requires_grad=True)
w = torch.randn(4096, device="cuda", dtype=dt, requires_grad=True)
q = torch.randn(1, 32, 64, 128, device="cuda", dtype=dt, requires_grad=True)
k = torch.randn(1, 8, 64, 128, device="cuda", dtype=dt, requires_grad=True)
cos = torch.randn(1, 64, 128, device="cuda", dtype=dt); sin = torch.randn_like(cos)
logits = torch.randn(8, 32000, device="cuda", dtype=dt, requires_grad=True)
t = torch.randint(0, 32000, (8,), device="cuda")
calls = {
  "rms_norm": lambda: ops.liger_rms_norm(x, w).sum().backward(),
  "swiglu": lambda: ops.liger_swiglu(x, x).sum().backward(),
  "rope": lambda: sum(o.sum() for o in ops.liger_rotary_pos_emb(q, k, cos, sin)).backward(),
  "cross_entropy": lambda: ops.liger_cross_entropy(logits, t).backward(),
}
out = {"torch_init_s": t_torch - t0, "import_s": t_import - t_torch}
for name, fn in calls.items():
    times = []
    for _ in range(2):
        s = time.perf_counter(); fn(); torch.cuda.synchronize(); times.append(time.perf_counter() - s)
    out[name] = times
out["triton_imported"] = "triton" in sys.modules
out["loader_s"] = loader_s[0]
print(json.dumps(out))
"""


def first_call_table(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["LIGER_AOT_STRICT"] = "1"
    proc = subprocess.run([sys.executable, "-c", FIRST_CALL_CHILD, mode], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def profile_ops(iters: int, out_dir: str):
    """cProfile of whole op calls, to see where host time goes."""
    import cProfile
    import pstats

    import liger_aot.transformers.functional as ops

    a = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    ops.liger_swiglu(a, b).backward(g)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        ops.liger_swiglu(a, b).backward(g)
    torch.cuda.synchronize()
    prof.disable()
    path = os.path.join(out_dir, "swiglu_profile.txt")
    with open(path, "w") as f:
        pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(25)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="CSV directory")
    parser.add_argument("--iters", type=int, default=2000, help="calls per timing")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("launch_overhead.py needs a GPU")
    os.makedirs(args.out, exist_ok=True)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")

    first = first_call_table("aot")  # fresh processes, before this one warms anything
    eager_first = first_call_table("eager")
    launches = launch_table(args.iters)
    op_rows = op_table(args.iters // 4)
    profile_ops(200, args.out)

    print("\nhost cost of one launch (rms_norm_fwd, 1x4096 bf16)")
    print(f"{'path':<52} {'us/launch':>10}")
    for name, us in launches:
        print(f"{name:<52} {us:>10.1f}")
    print("\nwhole op call at 1x4096 bf16 (host bound)")
    print(f"{'op':<28} {'liger-aot us':>13} {'torch eager us':>15}")
    for name, ours, eager in op_rows:
        print(f"{name:<28} {ours:>13.1f} {eager:>15.1f}")
    print("\nfirst call (forward+backward) in a fresh process, ms: first / second call")
    print(f"torch CUDA init {first['torch_init_s'] * 1e3:.0f} ms, "
          f"import liger_aot.ops {first['import_s'] * 1e3:.0f} ms, "
          f"triton imported: {first['triton_imported']}, "
          f"variant lookup + module loads: {first['loader_s'] * 1e3:.1f} ms in all")
    print(f"{'op':<16} {'liger-aot':>18} {'torch eager':>18}")
    for name in ("rms_norm", "swiglu", "rope", "cross_entropy"):
        (a, b), (c, d) = first[name], eager_first[name]
        print(f"{name:<16} {a * 1e3:8.2f} {b * 1e3:8.2f} {c * 1e3:8.2f} {d * 1e3:8.2f}")

    with open(os.path.join(args.out, "launch_overhead.csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["measure", "path", "us"])
        for name, us in launches:
            wr.writerow(["launch", name, f"{us:.2f}"])
        for name, ours, eager in op_rows:
            wr.writerow(["op_call", f"liger-aot {name}", f"{ours:.2f}"])
            wr.writerow(["op_call", f"torch eager {name}", f"{eager:.2f}"])
    with open(os.path.join(args.out, "first_call.csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["op", "path", "first_call_ms", "second_call_ms"])
        for name in ("rms_norm", "swiglu", "rope", "cross_entropy"):
            for path, table in (("liger-aot", first), ("torch eager", eager_first)):
                wr.writerow([name, path, f"{table[name][0] * 1e3:.3f}",
                             f"{table[name][1] * 1e3:.3f}"])


if __name__ == "__main__":
    main()
