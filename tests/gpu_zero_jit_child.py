"""Run by tests/test_gpu.py in a fresh process: every op forward and backward on AOT kernels
only, with `import triton` made impossible, no C compiler and an empty Triton cache dir.

Prints one line per case and exits non-zero on any mismatch or if triton got imported.
"""
import importlib.abc
import importlib.util
import os
import sys


ATTEMPTS = []


class _BlockTriton(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets code ask whether triton exists (torch does, at CUDA init) but fails and records
    any actual import of it."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        ATTEMPTS.append(spec.name)
        raise ImportError(f"zero-JIT test: import of {spec.name} is forbidden")

    def exec_module(self, module):  # never reached: create_module raises
        raise ImportError("zero-JIT test: triton is forbidden")


sys.meta_path.insert(0, _BlockTriton())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import liger_aot.transformers.functional as ops  # noqa: E402

DEVICE = "cuda"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def misaligned(shape, dtype):
    """A tensor whose data pointer is 2 or 4 bytes past a 16-byte boundary."""
    n = 1
    for s in shape:
        n *= s
    return torch.randn(n + 1, dtype=dtype, device=DEVICE)[1:].view(shape)


def leaf(t):
    return t.detach().requires_grad_()


def check_rms_norm(shape, dtype, offset_storage):
    x = misaligned(shape, dtype) if offset_storage else torch.randn(shape, dtype=dtype, device=DEVICE)
    w = torch.randn(shape[-1], dtype=dtype, device=DEVICE)
    x, w = leaf(x), leaf(w)
    y = ops.liger_rms_norm(x, w, 1e-6)
    g = torch.randn_like(y)
    y.backward(g)
    xr, wr = leaf(x.double()), leaf(w.double())
    yr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr
    yr.backward(g.double())
    return {"y": rel(y, yr), "dx": rel(x.grad, xr.grad), "dw": rel(w.grad, wr.grad)}


def check_swiglu(shape, dtype, offset_storage):
    make = misaligned if offset_storage else (lambda s, d: torch.randn(s, dtype=d, device=DEVICE))
    a, b = leaf(make(shape, dtype)), leaf(make(shape, dtype))
    c = ops.liger_swiglu(a, b)
    g = torch.randn_like(c)
    c.backward(g)
    ar, br = leaf(a.double()), leaf(b.double())
    (F.silu(ar) * br).backward(g.double())
    return {"c": rel(c, F.silu(ar) * br), "da": rel(a.grad, ar.grad), "db": rel(b.grad, br.grad)}


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def check_rope(shape, dtype, offset_storage):
    batch, n_q, n_k, seq, dim = shape
    make = misaligned if offset_storage else (lambda s, d: torch.randn(s, dtype=d, device=DEVICE))
    q, k = leaf(make((batch, n_q, seq, dim), dtype)), leaf(make((batch, n_k, seq, dim), dtype))
    angle = torch.rand(1, seq, dim // 2, device=DEVICE, dtype=torch.float64) * 6.28
    angle = torch.cat([angle, angle], dim=-1)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    qo, ko = ops.liger_rotary_pos_emb(q, k, cos, sin)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    torch.autograd.backward((qo, ko), (gq, gk))
    qr, kr = leaf(q.double()), leaf(k.double())
    c, s = cos.double().unsqueeze(1), sin.double().unsqueeze(1)
    qor, kor = qr * c + _rotate_half(qr) * s, kr * c + _rotate_half(kr) * s
    torch.autograd.backward((qor, kor), (gq.double(), gk.double()))
    return {"q": rel(qo, qor), "k": rel(ko, kor), "dq": rel(q.grad, qr.grad),
            "dk": rel(k.grad, kr.grad)}


def check_cross_entropy(shape, dtype, offset_storage):
    rows, vocab = shape
    x = misaligned(shape, dtype) if offset_storage else torch.randn(shape, dtype=dtype, device=DEVICE)
    x = leaf(x.mul_(3))  # in place: keeps the misaligned storage offset
    t = torch.randint(0, vocab, (rows,), device=DEVICE)
    t[::5] = -100
    loss = ops.liger_cross_entropy(x, t)
    loss.backward()
    xr = leaf(x.double())
    lr = F.cross_entropy(xr, t, ignore_index=-100)
    lr.backward()
    return {"loss": rel(loss, lr), "dx": rel(x.grad, xr.grad)}


CASES = [
    (check_rms_norm, [((4, 4096), False), ((3, 37, 5120), False), ((5, 2880), True)]),
    (check_swiglu, [((8, 14336), False), ((3, 5, 5120), False), ((7, 2880), True)]),
    (check_rope, [((2, 32, 8, 128, 128), False), ((1, 5, 1, 37, 64), False),
                  ((1, 3, 1, 9, 128), True)]),
    (check_cross_entropy, [((64, 32000), False), ((8, 128256), False), ((9, 5001), True)]),
]


def main():
    failures = 0
    for check, shapes in CASES:
        for shape, offset_storage in shapes:
            for dtype in (torch.float32, torch.bfloat16):
                torch.manual_seed(0)
                errors = check(shape, dtype, offset_storage)
                ok = all(e == e and e < TOL[dtype] for e in errors.values())
                failures += not ok
                detail = " ".join(f"{k}={v:.2e}" for k, v in errors.items())
                print(f"{'ok  ' if ok else 'FAIL'} {check.__name__[6:]:<14} {str(shape):<24} "
                      f"{'misaligned' if offset_storage else 'aligned':<10} "
                      f"{str(dtype)[6:]:<9} {detail}", flush=True)
    torch.cuda.synchronize()
    imported = sorted(m for m in sys.modules if m == "triton" or m.startswith("triton."))
    cache = os.environ.get("TRITON_CACHE_DIR", "")
    print(f"triton modules imported: {imported or 'none'}; import attempts: "
          f"{ATTEMPTS or 'none'}")
    print(f"TRITON_CACHE_DIR {cache} exists: {os.path.exists(cache)}")
    if imported or ATTEMPTS or (cache and os.path.exists(cache)) or failures:
        print(f"FAILED: {failures} mismatching case(s)")
        return 1
    print("zero-JIT run passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
