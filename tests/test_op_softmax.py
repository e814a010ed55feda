import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import (assert_compile_matches_eager, check_op, check_row_layouts, opcheck_rowwise,
                         rel_err, seeded_randn)
from liger_aot.kernel_src.softmax import spec
from liger_aot.ops.softmax import softmax

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def check(x, dim=-1, scale=1.0):
    check_op(lambda x: softmax(x, dim), lambda x: torch.softmax(x, dim), (x,), TOL)


# Shapes cover each whole-row config, the looped config with one program per row (enough
# rows) and split over several programs (few rows; the interpreter counts 4 SMs).
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 37), (3, 300), (2, 3000), (2, 9000), (17, 16400),
                                   (3, 20000)])
def test_softmax(shape, dtype):
    torch.manual_seed(0)
    check(torch.randn(shape, dtype=dtype) * 4)


def test_softmax_plans():
    assert not spec.select_config(16384).constexprs["LOOP"]
    assert spec.select_config(16385).constexprs["LOOP"]
    assert spec.split(17, 16400, 16) == (20480, 1)
    assert spec.split(3, 20000, 16) == (4096, 5)
    assert spec.split(9, 20000, 16) == (12288, 2)
    assert spec.split(1, 262144, 528) == (4096, 64)


def test_softmax_long_row():
    torch.manual_seed(1)
    check(torch.randn(1, 262144) * 8)


@pytest.mark.parametrize("dim", [0, 1, -3])
def test_softmax_dims(dim):
    torch.manual_seed(2)
    check(torch.randn(4, 6, 10), dim=dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_noncontiguous_misaligned(dtype):
    torch.manual_seed(3)
    check_row_layouts(check, dtype)
    x = torch.randn(3 * 17000 + 1, dtype=dtype)[1:].view(3, 17000)
    check(x)


def test_softmax_grad_output_expanded():
    x = torch.randn(3, 40, requires_grad=True)
    (softmax(x) * torch.arange(40.0)).sum().backward()
    x64 = x.detach().double().requires_grad_()
    (torch.softmax(x64, -1) * torch.arange(40.0)).sum().backward()
    assert rel_err(x.grad, x64.grad) < 1e-5


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on inf - inf
@pytest.mark.parametrize("n", [5, 20000])
def test_softmax_inf_nan(n):
    x = torch.randn(5, n)
    x[0, 1] = float("inf")
    x[1, :3] = float("-inf")
    x[2] = float("-inf")
    x[3, 2] = float("nan")
    with torch.no_grad():
        torch.testing.assert_close(softmax(x), torch.softmax(x, -1), equal_nan=True)


@pytest.mark.parametrize("shape", [(0, 10), (3, 0), ()])
def test_softmax_empty_and_scalar(shape):
    x = torch.randn(shape, requires_grad=True)
    y = softmax(x)
    ref = torch.softmax(x.detach(), -1)
    assert y.shape == ref.shape
    torch.testing.assert_close(y.detach(), ref)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_softmax_bad_inputs():
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match="x must be float32"):
        softmax(x.long())
    with pytest.raises(ValueError, match=r"dim must be an int in \[-2, 1\]"):
        softmax(x, 2)
    with pytest.raises(ValueError, match="dim must be an int"):
        softmax(x, 1.0)


def test_softmax_torch_compile_matches_eager():
    torch.manual_seed(4)
    x = torch.randn(3, 4, 50)

    def f(x):
        return softmax(x) * 2.0 + softmax(x, 1)

    assert_compile_matches_eager(f, (x,), seeded_randn)


def test_softmax_opcheck():
    from liger_aot.ops.softmax import softmax_bwd_op, softmax_fwd_op

    opcheck_rowwise(softmax_fwd_op, softmax_bwd_op, lambda x: torch.softmax(x, -1))


def test_softmax_module():
    from liger_aot.transformers.softmax import LigerSoftmax

    x = torch.randn(4, 9)
    assert rel_err(LigerSoftmax()(x), torch.softmax(x, -1)) < 1e-6
