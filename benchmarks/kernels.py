"""Kernel benchmarks, side by side: liger-aot, torch eager, torch.compile and Liger-Kernel.

  python benchmarks/kernels.py [--out DIR] [--ops rms_norm,swiglu,...]

For each op at a standard shape (bf16): check every path against torch eager first, then the
median of triton.testing.do_bench for forward and forward+backward, achieved bandwidth against
the measured copy ceiling (or the matmul ceiling for the fused linear loss), and the peak
memory beyond the inputs. Prints a table; writes kernels.csv and kernels.png to --out.
Liger-Kernel is used when importable (carry its wheel); a path that fails prints its error.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DEV, BF16 = "cuda", torch.bfloat16


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second."""
    from triton.testing import do_bench

    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), return_mode="median")
    return 2 * x.numel() / (ms * 1e-3)


def matmul_rate() -> float:
    from triton.testing import do_bench

    a = torch.randn(8192, 8192, device=DEV, dtype=BF16)
    b = torch.randn(8192, 8192, device=DEV, dtype=BF16)
    ms = do_bench(lambda: a @ b, return_mode="median")
    return 2 * 8192**3 / (ms * 1e-3)


def _liger():
    try:
        import liger_kernel.transformers.functional as lf
        return lf
    except Exception as e:  # reported in the table as n/a
        return e


# Each case: (inputs factory, {path: fn(*inputs) -> output tensor or loss}, bytes fwd,
# bytes fwd+bwd, flops fwd+bwd or 0). fn outputs are reduced with a fixed random cotangent.
def case_rms_norm():
    M, N = 16384, 4096
    from liger_aot.ops.rms_norm import rms_norm

    def inputs():
        return (torch.randn(M, N, device=DEV, dtype=BF16), torch.randn(N, device=DEV, dtype=BF16))

    def eager(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    lf = _liger()
    paths = {"liger-aot": lambda x, w: rms_norm(x, w, 1e-6, in_place=False), "eager": eager,
             "torch.compile": torch.compile(eager)}
    if not isinstance(lf, Exception):
        paths["liger-kernel"] = lambda x, w: lf.liger_rms_norm(x, w, 1e-6, in_place=False)
    return inputs, paths, 2 * M * N * 2, 5 * M * N * 2, 0


def case_swiglu():
    M, N = 8192, 14336
    from liger_aot.ops.swiglu import swiglu

    def inputs():
        return (torch.randn(M, N, device=DEV, dtype=BF16), torch.randn(M, N, device=DEV, dtype=BF16))

    eager = lambda a, b: F.silu(a) * b  # noqa: E731
    lf = _liger()
    paths = {"liger-aot": swiglu, "eager": eager, "torch.compile": torch.compile(eager)}
    if not isinstance(lf, Exception):
        paths["liger-kernel"] = lf.liger_swiglu
    return inputs, paths, 3 * M * N * 2, 8 * M * N * 2, 0


def case_cross_entropy():
    M, V = 8192, 128256
    from liger_aot.ops.cross_entropy import cross_entropy
    target = torch.randint(0, V, (M,), device=DEV)

    def inputs():
        return (torch.randn(M, V, device=DEV, dtype=BF16),)

    eager = lambda x: F.cross_entropy(x.float(), target)  # noqa: E731
    lf = _liger()
    paths = {"liger-aot": lambda x: cross_entropy(x, target), "eager": eager,
             "torch.compile": torch.compile(eager)}
    if not isinstance(lf, Exception):
        paths["liger-kernel"] = lambda x: lf.liger_cross_entropy(x, target)
    return inputs, paths, M * V * 2, 2 * M * V * 2, 0


def case_rope():
    B, H, KH, S, D = 4, 32, 8, 4096, 128
    from liger_aot.ops.rope import liger_rotary_pos_emb
    angle = torch.rand(1, S, D // 2, device=DEV) * 6.28
    angle = torch.cat([angle, angle], -1)
    cos, sin = angle.cos().to(BF16), angle.sin().to(BF16)

    def inputs():
        return (torch.randn(B, H, S, D, device=DEV, dtype=BF16),
                torch.randn(B, KH, S, D, device=DEV, dtype=BF16))

    def rot(t):
        return torch.cat((-t[..., D // 2:], t[..., :D // 2]), -1)

    def eager(q, k):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return torch.cat([(q * c + rot(q) * s).flatten(), (k * c + rot(k) * s).flatten()])

    def cat(pair):
        return torch.cat([t.flatten() for t in pair])

    lf = _liger()
    paths = {"liger-aot": lambda q, k: cat(liger_rotary_pos_emb(q, k, cos, sin)),
             "eager": eager, "torch.compile": torch.compile(eager)}
    if not isinstance(lf, Exception):
        paths["liger-kernel"] = lambda q, k: cat(lf.liger_rope(q, k, cos, sin))
    elems = B * (H + KH) * S * D
    return inputs, paths, 2 * elems * 2, 4 * elems * 2, 0


def case_fused_linear_cross_entropy():
    T, H, V = 8192, 4096, 128256
    from liger_aot.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
    target = torch.randint(0, V, (T,), device=DEV)

    def inputs():
        return (torch.randn(T, H, device=DEV, dtype=BF16),
                torch.randn(V, H, device=DEV, dtype=BF16) * 0.02)

    eager = lambda x, w: F.cross_entropy((x @ w.t()).float(), target)  # noqa: E731
    lf = _liger()
    paths = {"liger-aot": lambda x, w: fused_linear_cross_entropy(x, w, target), "eager": eager}
    if not isinstance(lf, Exception):
        paths["liger-kernel"] = lambda x, w: lf.liger_fused_linear_cross_entropy(x, w, target)
    return inputs, paths, 0, 0, 3 * 2 * T * H * V


CASES = {"rms_norm": case_rms_norm, "swiglu": case_swiglu, "rope": case_rope,
         "cross_entropy": case_cross_entropy,
         "fused_linear_cross_entropy": case_fused_linear_cross_entropy}


def run_case(name, factory, bandwidth, flops_rate):
    from triton.testing import do_bench

    inputs, paths, bytes_fwd, bytes_all, flops = factory()
    base = [t.requires_grad_() for t in inputs()]
    ref = paths["eager"](*base)
    cot = torch.randn_like(ref) if ref.dim() else torch.ones_like(ref)
    ref.backward(cot)
    ref_grads = [t.grad.float() for t in base]
    rows = []
    for path, fn in paths.items():
        try:
            xs = [t.detach().clone().requires_grad_() for t in base]
            out = fn(*xs)
            out.backward(cot)
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            gerr = max(((x.grad.float() - g).norm() / g.norm()).item()
                       for x, g in zip(xs, ref_grads))
            if not (err < 3e-2 and gerr < 3e-2):
                raise AssertionError(f"mismatch: out {err:.1e}, grad {gerr:.1e}")
            with torch.no_grad():
                fwd_ms = do_bench(lambda: fn(*xs), return_mode="median")
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()

            def step():
                for x in xs:
                    x.grad = None
                fn(*xs).backward(cot)

            step()
            peak = torch.cuda.max_memory_allocated() - before
            all_ms = do_bench(step, return_mode="median")
            rate = (f"{flops / (all_ms * 1e-3) / flops_rate:.0%} of matmul" if flops else
                    f"{bytes_all / (all_ms * 1e-3) / bandwidth:.0%} of copy")
            fwd_rate = f"{bytes_fwd / (fwd_ms * 1e-3) / bandwidth:.0%}" if bytes_fwd else "-"
            rows.append((name, path, fwd_ms, all_ms, fwd_rate, rate, peak / 2**30, ""))
        except Exception as e:  # keep the other paths' numbers
            rows.append((name, path, float("nan"), float("nan"), "-", "-", float("nan"),
                         f"{type(e).__name__}: {str(e)[:80]}"))
        torch.cuda.empty_cache()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--ops", default=",".join(CASES), help="comma-separated: " + ",".join(CASES))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bandwidth, flops_rate = copy_bandwidth(), matmul_rate()
    print(f"{torch.cuda.get_device_name()}: copy {bandwidth / 1e12:.2f} TB/s, "
          f"bf16 matmul {flops_rate / 1e12:.0f} TFLOP/s")
    rows = []
    for name in args.ops.split(","):
        rows += run_case(name, CASES[name], bandwidth, flops_rate)
    header = ("op", "path", "fwd ms", "fwd+bwd ms", "fwd of copy", "fwd+bwd rate",
              "peak GiB fwd+bwd", "note")
    print(f"{header[0]:<27} {header[1]:<14} {header[2]:>8} {header[3]:>11} {header[4]:>11} "
          f"{header[5]:>16} {header[6]:>9}")
    for r in rows:
        print(f"{r[0]:<27} {r[1]:<14} {r[2]:>8.3f} {r[3]:>11.3f} {r[4]:>11} {r[5]:>16} "
              f"{r[6]:>9.2f} {r[7]}")
    with open(os.path.join(args.out, "kernels.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ops = list(dict.fromkeys(r[0] for r in rows))
        paths = list(dict.fromkeys(r[1] for r in rows))
        fig, ax = plt.subplots(figsize=(10, 4))
        width = 0.8 / len(paths)
        for i, path in enumerate(paths):
            values = [next((r[3] for r in rows if r[0] == op and r[1] == path), float("nan"))
                      for op in ops]
            ax.bar([j + i * width for j in range(len(ops))], values, width, label=path)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ops))], ops, fontsize=8)
        ax.set_ylabel("fwd+bwd ms (median)")
        ax.set_yscale("log")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "kernels.png"), dpi=120)
    except ImportError:
        print("matplotlib not installed: no plot")


if __name__ == "__main__":
    main()
