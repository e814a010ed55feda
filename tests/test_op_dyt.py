import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import assert_compile_matches_eager, check_op
from liger_aot.kernel_src.dyt import spec
from liger_aot.ops import dyt as dyt_mod
from liger_aot.ops.dyt import dyt
from liger_aot.transformers.norms import LigerDyT

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def check(x, alpha, gamma, beta):
    """Forward and backward of dyt against float64 PyTorch."""
    _, (_, alpha, _, _), _ = check_op(
        dyt, lambda x, a, g, b: g * torch.tanh(a * x) + (b if b is not None else 0),
        (x, alpha, gamma, beta), TOL)
    assert alpha.grad.shape == alpha.shape and alpha.grad.dtype == alpha.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("beta", [True, False])
@pytest.mark.parametrize("shape", [(7, 100), (2, 3, 300), (3, 2500)])
def test_dyt(shape, beta, dtype):
    torch.manual_seed(0)
    n = shape[-1]
    check(torch.randn(shape, dtype=dtype) * 2, torch.tensor([0.7], dtype=dtype),
          torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype) if beta else None)


def test_dyt_tanh_accuracy():
    # small arguments (polynomial branch), the branch boundary, saturation, inf and nan
    z = torch.tensor([0.0, 1e-7, -1e-3, 0.1, 0.2499, 0.25, 0.2501, -0.7, 3.0, 12.0, -30.0,
                      100.0, float("inf"), float("-inf"), float("nan")])
    y = dyt(z, torch.ones(1), torch.ones(len(z)))
    ref = torch.tanh(z.double())
    finite = (ref != 0) & ~ref.isnan()
    assert ((y.double() - ref).abs()[finite] / ref.abs()[finite]).max() < 3e-7
    assert y[0] == 0 and torch.isnan(y[-1])


def test_dyt_many_rows():
    torch.manual_seed(1)
    # more rows than the persistent grid's programs: several rows per program
    check(torch.randn(301, 40), torch.tensor(0.5), torch.randn(40), torch.randn(40))


def test_dyt_strided_transposed_misaligned():
    torch.manual_seed(2)
    check(torch.randn(5, 2 * 96)[:, :96], torch.tensor([0.5]), torch.randn(96), torch.randn(96))
    check(torch.randn(40, 6).t(), torch.tensor([0.5]), torch.randn(40), None)
    x = torch.randn(4 * 100 + 1, dtype=torch.bfloat16)[1:].view(4, 100)
    gamma = torch.randn(101, dtype=torch.bfloat16)[1:]
    assert x.data_ptr() % 16 != 0
    check(x, torch.tensor([0.5], dtype=torch.bfloat16), gamma, None)


def test_dyt_mixed_param_dtype():
    torch.manual_seed(3)
    x = torch.randn(6, 64, dtype=torch.bfloat16, requires_grad=True)
    alpha, gamma = torch.tensor([0.5], requires_grad=True), torch.randn(64, requires_grad=True)
    beta = torch.randn(64, requires_grad=True)
    dyt(x, alpha, gamma, beta).sum().backward()
    assert alpha.grad.dtype == gamma.grad.dtype == beta.grad.dtype == torch.float32


@pytest.mark.parametrize("shape", [(0, 64), (3, 0)])
def test_dyt_empty(shape):
    x = torch.randn(shape, requires_grad=True)
    alpha = torch.tensor([0.5], requires_grad=True)
    gamma, beta = (torch.randn(shape[-1], requires_grad=True) for _ in range(2))
    y = dyt(x, alpha, gamma, beta)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert alpha.grad.item() == 0 and torch.equal(gamma.grad, torch.zeros_like(gamma))


def test_dyt_bad_inputs():
    x, a, g = torch.randn(4, 8), torch.tensor([0.5]), torch.randn(8)
    with pytest.raises(ValueError, match="alpha must have one element"):
        dyt(x, torch.ones(2), g)
    with pytest.raises(ValueError, match="gamma must have shape"):
        dyt(x, a, torch.randn(9))
    with pytest.raises(ValueError, match="beta must have shape"):
        dyt(x, a, g, torch.randn(4, 8))
    with pytest.raises(TypeError, match="gamma must be float32"):
        dyt(x, a, g.int())
    with pytest.raises(ValueError, match="one device"):
        dyt(x, a, torch.randn(8, device="meta"))
    with pytest.raises(ValueError, match="at least one dimension"):
        dyt(torch.tensor(1.0), a, g)


def test_dyt_compile_matches_eager():
    torch.manual_seed(4)
    x, a, g, b = torch.randn(2, 5, 72), torch.tensor([0.6]), torch.randn(72), torch.randn(72)
    dy = torch.randn(2, 5, 72)
    assert_compile_matches_eager(dyt, (x, a, g, b), lambda y: dy, tol=1e-6)


def test_dyt_opcheck():
    torch.manual_seed(5)
    x, a, g, b = (torch.randn(3, 40, requires_grad=True), torch.tensor([0.5], requires_grad=True),
                  torch.randn(40, requires_grad=True), torch.randn(40, requires_grad=True))
    torch.library.opcheck(dyt_mod.dyt_fwd_op.custom_op, (x, a, g, b))
    torch.library.opcheck(dyt_mod.dyt_fwd_op.custom_op, (x, a, g, None))
    torch.library.opcheck(dyt_mod.dyt_bwd_op.custom_op,
                          (torch.randn(3, 40), x.detach(), a.detach(), g.detach()))


def test_dyt_variants():
    assert sum(len(list(s.variants())) for s in spec.SPECS) == 24


def test_liger_dyt_module():
    torch.manual_seed(6)
    m = LigerDyT(64)
    assert m.alpha.shape == (1,) and m.alpha.item() == 0.5
    assert torch.equal(m.gamma, torch.ones(64)) and torch.equal(m.beta, torch.zeros(64))
    assert LigerDyT(8, beta=False, init_alpha=0.2).beta is None
    x = torch.randn(3, 64)
    torch.testing.assert_close(m(x), torch.tanh(0.5 * x))
