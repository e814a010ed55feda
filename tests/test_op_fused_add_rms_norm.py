import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from liger_aot.ops import rms_norm as rms_mod
from liger_aot.ops.rms_norm import fused_add_rms_norm
from liger_aot.transformers.norms import LigerFusedAddRMSNorm

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def reference(x, r, w, eps, offset):
    s = x.double() + r.double()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * (offset + w.double()), s


def check(x, r, w, eps=1e-6, offset=0.0, casting_mode="llama", in_place=True,
          use=("y", "s")):
    """Forward and backward of fused_add_rms_norm against float64 PyTorch; `use` names the
    outputs the loss depends on."""
    dtype = x.dtype
    x, r, w = (t.detach().requires_grad_() for t in (x, r, w))
    y, s = fused_add_rms_norm(x, r, w, eps, offset, casting_mode, in_place=in_place)
    assert y.shape == x.shape and s.shape == x.shape and y.dtype == s.dtype == dtype
    gy = torch.randn(y.shape, dtype=dtype)
    gs = torch.randn(s.shape, dtype=dtype)
    outs = [o for name, o in (("y", y), ("s", s)) if name in use]
    grads = [g.clone() for name, g in (("y", gy), ("s", gs)) if name in use]
    torch.autograd.backward(outs, grads)
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    y64, s64 = reference(x64, r64, w64, eps, offset)
    outs64 = [o for name, o in (("y", y64), ("s", s64)) if name in use]
    torch.autograd.backward(outs64, [g.double() for name, g in (("y", gy), ("s", gs))
                                     if name in use])
    tol = TOL[dtype]
    assert rel_err(y, y64) < tol
    assert rel_err(s, s64) < tol
    assert rel_err(x.grad, x64.grad) < tol
    assert rel_err(r.grad, r64.grad) < tol
    if "y" in use:
        assert rel_err(w.grad, w64.grad) < tol
    elif w.grad is not None:
        assert not w.grad.any()
    assert x.grad.dtype == r.grad.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["llama", "gemma", "none"])
@pytest.mark.parametrize("shape", [(7, 100), (2, 3, 300)])
def test_fused_add_rms_norm(shape, mode, dtype):
    torch.manual_seed(0)
    n = shape[-1]
    check(torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype),
          torch.randn(n, dtype=dtype), 1e-6, 0.0, mode)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_add_rms_norm_offset(dtype):
    torch.manual_seed(1)
    check(torch.randn(5, 64, dtype=dtype), torch.randn(5, 64, dtype=dtype),
          torch.randn(64, dtype=dtype) * 0.1, 1e-5, 1.0, "gemma")


# 5000: whole-row forward, looped backward (residual gradient); 9000: both looped;
# 3000: whole-row both
@pytest.mark.parametrize("n", [3000, 5000, 9000])
def test_fused_add_rms_norm_long_rows(n):
    torch.manual_seed(2)
    check(torch.randn(2, n), torch.randn(2, n), torch.randn(n))


@pytest.mark.parametrize("use", [("y",), ("s",)])
def test_fused_add_rms_norm_one_output_used(use):
    torch.manual_seed(3)
    check(torch.randn(4, 48), torch.randn(4, 48), torch.randn(48), use=use)


@pytest.mark.parametrize("in_place", [True, False])
def test_fused_add_rms_norm_in_place(in_place):
    torch.manual_seed(4)
    check(torch.randn(6, 64), torch.randn(6, 64), torch.randn(64), in_place=in_place)
    x, r, w = (torch.randn(6, 64, requires_grad=True), torch.randn(6, 64, requires_grad=True),
               torch.randn(64, requires_grad=True))
    y, s = fused_add_rms_norm(x, r, w, in_place=in_place)
    gy = torch.randn_like(y)
    gy_before = gy.clone()
    torch.autograd.backward([y, s], [gy, torch.randn_like(s)])
    assert torch.equal(gy, x.grad) if in_place else torch.equal(gy, gy_before)


def test_fused_add_rms_norm_noncontiguous_and_misaligned():
    torch.manual_seed(5)
    x = torch.randn(5, 2 * 96)[:, :96]  # strided rows
    r = torch.randn(96, 5).t()  # transposed: copied
    w = torch.randn(97)[1:]  # misaligned
    check(x, r, w)
    xm = torch.randn(4 * 100 + 1, dtype=torch.bfloat16)[1:].view(4, 100)
    rm = torch.randn(4 * 100 + 1, dtype=torch.bfloat16)[1:].view(4, 100)
    assert xm.data_ptr() % 16 != 0
    check(xm, rm, torch.randn(100, dtype=torch.bfloat16))


@pytest.mark.parametrize("shape", [(0, 64), (3, 0)])
def test_fused_add_rms_norm_empty(shape):
    x = torch.randn(shape, requires_grad=True)
    r = torch.randn(shape, requires_grad=True)
    w = torch.randn(shape[-1], requires_grad=True)
    y, s = fused_add_rms_norm(x, r, w)
    assert y.shape == s.shape == x.shape
    (y.sum() + s.sum()).backward()
    assert x.grad.shape == r.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros_like(w))


def test_fused_add_rms_norm_bad_inputs():
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8)
    with pytest.raises(ValueError, match="one shape"):
        fused_add_rms_norm(x, torch.randn(4, 9), w)
    with pytest.raises(TypeError, match="one dtype"):
        fused_add_rms_norm(x, r.bfloat16(), w)
    with pytest.raises(TypeError, match="residual must be float32"):
        fused_add_rms_norm(x, r.int(), w)
    with pytest.raises(ValueError, match="one device"):
        fused_add_rms_norm(x, torch.randn(4, 8, device="meta"), w)
    with pytest.raises(ValueError, match="weight must have shape"):
        fused_add_rms_norm(x, r, torch.randn(4))
    with pytest.raises(ValueError, match="casting_mode must be one of"):
        fused_add_rms_norm(x, r, w, casting_mode="llama3")


def test_fused_add_rms_norm_compile_matches_eager():
    torch.manual_seed(6)
    x, r, w = torch.randn(2, 5, 72), torch.randn(2, 5, 72), torch.randn(72)
    gy, gs = torch.randn(2, 5, 72), torch.randn(2, 5, 72)

    def fn(x, r, w):
        return fused_add_rms_norm(x, r, w, 1e-6, 0.0, "llama")

    results = []
    for f in (fn, torch.compile(fn, fullgraph=True, backend="aot_eager")):
        xr, rr, wr = (t.clone().requires_grad_() for t in (x, r, w))
        y, s = f(xr, rr, wr)
        torch.autograd.backward([y, s], [gy.clone(), gs.clone()])
        results.append((y.detach(), s.detach(), xr.grad, rr.grad, wr.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_fused_add_rms_norm_opcheck():
    torch.manual_seed(7)
    x, r, w = (torch.randn(3, 40, requires_grad=True), torch.randn(3, 40, requires_grad=True),
               torch.randn(40, requires_grad=True))
    torch.library.opcheck(rms_mod.fused_add_rms_norm_fwd_op.custom_op, (x, r, w, 1e-6, 0.0, 1))
    _, s, rstd = rms_mod.fused_add_rms_norm_fwd_op(x.detach(), r.detach(), w.detach(), 1e-6,
                                                   0.0, 1)
    dy, ds = torch.randn(3, 40), torch.randn(3, 40)
    for grad_s in (ds, None):
        torch.library.opcheck(rms_mod.fused_add_rms_norm_bwd_op.custom_op,
                              (dy, grad_s, s, w.detach(), rstd, 0.0, 1))


def test_liger_fused_add_rms_norm_module():
    torch.manual_seed(8)
    m = LigerFusedAddRMSNorm(32)
    assert torch.equal(m.weight, torch.ones(32)) and not m.in_place
    x, r = torch.randn(3, 32), torch.randn(3, 32)
    y, s = m(x, r)
    y64, s64 = reference(x, r, m.weight.detach(), 1e-6, 0.0)
    torch.testing.assert_close(y, y64.float())
    torch.testing.assert_close(s, s64.float())
    assert torch.equal(LigerFusedAddRMSNorm(8, init_fn="zeros").weight, torch.zeros(8))
