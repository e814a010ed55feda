import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import assert_compile_matches_eager, check_op, rel_err
from liger_aot.kernel_src.poly_norm import spec
from liger_aot.ops import poly_norm as poly_mod
from liger_aot.ops.poly_norm import poly_norm
from liger_aot.transformers.norms import LigerPolyNorm

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def reference(x, w, b, eps):
    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)

    return w[0] * norm(x ** 3) + w[1] * norm(x ** 2) + w[2] * norm(x) + b


def check(x, w, b, eps=1e-6, in_place=True):
    """Forward and backward of poly_norm against float64 PyTorch."""
    _, (x, w, b), _ = check_op(lambda x, w, b: poly_norm(x, w, b, eps, in_place=in_place),
                               lambda x, w, b: reference(x, w, b, eps), (x, w, b), TOL,
                               clone_grad=True)
    assert w.grad.dtype == w.dtype and b.grad.shape == b.shape and b.grad.dtype == b.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 100), (2, 3, 300), (3, 3000)])
def test_poly_norm(shape, dtype):
    torch.manual_seed(0)
    check(torch.randn(shape, dtype=dtype), torch.randn(3, dtype=dtype),
          torch.randn((), dtype=dtype))


def test_poly_norm_long_rows():
    torch.manual_seed(1)
    check(torch.randn(3, 5000), torch.randn(3), torch.randn(1))  # looped, bias shape (1,)


@pytest.mark.parametrize("in_place", [True, False])
def test_poly_norm_in_place(in_place):
    torch.manual_seed(2)
    x = torch.randn(6, 64, requires_grad=True)
    w, b = torch.randn(3, requires_grad=True), torch.randn((), requires_grad=True)
    y = poly_norm(x, w, b, in_place=in_place)
    g = torch.randn_like(y)
    g_before = g.clone()
    y.backward(g)
    x64 = x.detach().double().requires_grad_()
    reference(x64, w.detach().double(), b.detach().double(), 1e-6).backward(g_before.double())
    assert rel_err(x.grad, x64.grad) < 1e-5
    assert torch.equal(g, x.grad) if in_place else torch.equal(g, g_before)
    # an expanded gradient is never written in place
    x.grad = None
    poly_norm(x, w, b, in_place=True).sum().backward()
    x64.grad = None
    reference(x64, w.detach().double(), b.detach().double(), 1e-6).sum().backward()
    assert rel_err(x.grad, x64.grad) < 1e-5


def test_poly_norm_strided_transposed_misaligned():
    torch.manual_seed(3)
    check(torch.randn(5, 2 * 96)[:, :96], torch.randn(3), torch.randn(()))
    check(torch.randn(40, 6).t(), torch.randn(3), torch.randn(()))
    x = torch.randn(4 * 100 + 1, dtype=torch.bfloat16)[1:].view(4, 100)
    w = torch.randn(4, dtype=torch.bfloat16)[1:]
    assert x.data_ptr() % 16 != 0 and w.data_ptr() % 16 != 0
    check(x, w, torch.randn((), dtype=torch.bfloat16))


def test_poly_norm_mixed_param_dtype():
    torch.manual_seed(4)
    x = torch.randn(6, 64, dtype=torch.bfloat16, requires_grad=True)
    w, b = torch.randn(3, requires_grad=True), torch.randn((), requires_grad=True)
    poly_norm(x, w, b).sum().backward()
    assert w.grad.dtype == b.grad.dtype == torch.float32


@pytest.mark.parametrize("shape", [(0, 64), (3, 0)])
def test_poly_norm_empty(shape):
    x = torch.randn(shape, requires_grad=True)
    w, b = torch.randn(3, requires_grad=True), torch.randn((), requires_grad=True)
    y = poly_norm(x, w, b)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros(3)) and b.grad.item() == 0


def test_poly_norm_bad_inputs():
    x, w, b = torch.randn(4, 8), torch.randn(3), torch.randn(())
    with pytest.raises(ValueError, match="weight must have shape \\(3,\\)"):
        poly_norm(x, torch.randn(4), b)
    with pytest.raises(ValueError, match="bias must have one element"):
        poly_norm(x, w, torch.randn(2))
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        poly_norm(x, w, 1.0)
    with pytest.raises(TypeError, match="x must be float32"):
        poly_norm(x.long(), w, b)
    with pytest.raises(ValueError, match="one device"):
        poly_norm(x, torch.randn(3, device="meta"), b)


def test_poly_norm_compile_matches_eager():
    torch.manual_seed(5)
    x, w, b, g = torch.randn(2, 5, 72), torch.randn(3), torch.randn(()), torch.randn(2, 5, 72)
    # eager in_place writes dx into the gradient: each run gets a copy
    assert_compile_matches_eager(poly_norm, (x, w, b), lambda y: g.clone(), args=(1e-6,),
                                 tol=1e-5)


def test_poly_norm_opcheck():
    torch.manual_seed(6)
    x, w, b = (torch.randn(3, 40, requires_grad=True), torch.randn(3, requires_grad=True),
               torch.randn((), requires_grad=True))
    torch.library.opcheck(poly_mod.poly_norm_fwd_op.custom_op, (x, w, b, 1e-6))
    _, rstd = poly_mod.poly_norm_fwd_op(x.detach(), w.detach(), b.detach(), 1e-6)
    torch.library.opcheck(poly_mod.poly_norm_bwd_op.custom_op,
                          (torch.randn(3, 40), x.detach(), w.detach(), b.detach(), rstd))


def test_poly_norm_variants():
    assert sum(len(list(s.variants())) for s in spec.SPECS) == 36


def test_liger_poly_norm_module():
    torch.manual_seed(7)
    m = LigerPolyNorm()
    assert torch.allclose(m.weight, torch.full((3,), 1 / 3)) and m.bias.item() == 1.0
    assert m.in_place and m.variance_epsilon == 1e-6
    x = torch.randn(3, 64)
    torch.testing.assert_close(m(x), reference(x.double(), m.weight.detach().double(),
                                               m.bias.detach().double(), 1e-6).float())
