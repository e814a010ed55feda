import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import (assert_compile_matches_eager, check_op, check_row_layouts, opcheck_rowwise,
                         rel_err, seeded_randn)
from liger_aot.ops.sparsemax import sparsemax

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def err(out, ref):
    """Relative error; absolute when the reference is zero (e.g. a one-element support)."""
    return rel_err(out, ref, floor=1.0)


def reference(x, dim=-1):
    """Sort-based sparsemax (Martins & Astudillo 2016), differentiable through autograd."""
    x = x.movedim(dim, -1)
    z, _ = torch.sort(x, dim=-1, descending=True)
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)
    cs = z.cumsum(-1)
    kk = (1 + k * z > cs).sum(-1, keepdim=True)
    tau = (cs.gather(-1, kk - 1) - 1) / kk
    d = x - tau
    # support {y > 0}: an entry tied with tau (bf16 inputs make ties likely) is outside it,
    # where clamp's gradient would count it in; both are subgradients, this is the usual one
    return torch.where(d > 0, d, torch.zeros_like(d)).movedim(-1, dim)


def check(x, dim=-1):
    y, _, _ = check_op(lambda x: sparsemax(x, dim), lambda x: reference(x, dim), (x,), TOL, err)
    if y.dtype == torch.float32:
        torch.testing.assert_close(y.sum(dim), torch.ones_like(y.sum(dim)))


# Shapes cover both whole-row configs and the looped one; scales give supports from one
# element (30) to most of the row (0.05).
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 37), (3, 300), (2, 3000), (2, 9000)])
@pytest.mark.parametrize("scale", [0.05, 1.0, 30.0])
def test_sparsemax(shape, scale, dtype):
    torch.manual_seed(0)
    check((torch.randn(shape) * scale).to(dtype))


def test_sparsemax_ties_and_uniform():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 0.0, -5.0], [0.5, 0.5, 0.5, 3.0]])
    y = sparsemax(x)
    torch.testing.assert_close(y, reference(x.double()).float())
    assert torch.equal(y[0], torch.full((4,), 0.25))
    check(x)
    # looped, the whole row is the support: y = 0.3 - tau = 1/5000 loses digits to
    # cancellation in fp32 (relative error ~eps * 0.3 / 2e-4 if tau were not shifted)
    check(torch.full((2, 5000), 0.3))
    check(torch.full((2, 5000), 300.0) + torch.arange(5000) * 1e-3)


@pytest.mark.parametrize("dim", [0, 1, -3])
def test_sparsemax_dims(dim):
    torch.manual_seed(1)
    check(torch.randn(4, 6, 10), dim=dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparsemax_noncontiguous_misaligned(dtype):
    torch.manual_seed(2)
    check_row_layouts(check, dtype)
    check(torch.randn(2 * 5000 + 1, dtype=dtype)[1:].view(2, 5000) * 0.1)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("n", [6, 5000])
def test_sparsemax_inf_nan(n):
    x = torch.randn(4, n)
    x[0, :3] = float("-inf")
    x[1, 1] = float("nan")
    x[2, 2] = float("inf")
    with torch.no_grad():
        y = sparsemax(x)
    torch.testing.assert_close(y[0], reference(x[:1].double())[0].float())
    assert y[0, :3].eq(0).all()
    assert y[1].isnan().all() and y[2].isnan().all()
    torch.testing.assert_close(y[3], reference(x[3:].double())[0].float())


@pytest.mark.parametrize("shape", [(0, 10), (3, 0), ()])
def test_sparsemax_empty_and_scalar(shape):
    x = torch.randn(shape, requires_grad=True)
    y = sparsemax(x)
    assert y.shape == x.shape
    if x.numel():
        assert y.item() == 1.0
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_sparsemax_bad_inputs():
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match="x must be float32"):
        sparsemax(x.int())
    with pytest.raises(ValueError, match=r"dim must be an int in \[-2, 1\]"):
        sparsemax(x, -3)


def test_sparsemax_torch_compile_matches_eager():
    torch.manual_seed(3)
    x = torch.randn(3, 4, 50)

    def f(x):
        return sparsemax(x) * 2.0 + sparsemax(x, 0)

    assert_compile_matches_eager(f, (x,), seeded_randn)


def test_sparsemax_opcheck():
    from liger_aot.ops.sparsemax import sparsemax_bwd_op, sparsemax_fwd_op

    opcheck_rowwise(sparsemax_fwd_op, sparsemax_bwd_op, reference)


def test_sparsemax_module():
    from liger_aot.transformers.softmax import LigerSparsemax

    x = torch.randn(4, 9, 3)
    module = LigerSparsemax(dim=1)
    assert module.dim == 1 and "dim=1" in repr(module)
    torch.testing.assert_close(module(x), reference(x.double(), 1).float())
    assert LigerSparsemax().dim == -1
