import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import assert_compile_matches_eager, check_op, ones_like
from liger_aot.ops.relu_squared import relu_squared

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def check(x):
    check_op(relu_squared, lambda x: torch.relu(x) ** 2, (x,), TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 100), (2, 3, 1000), (4099,), (1,), ()])
def test_relu_squared(shape, dtype):
    torch.manual_seed(0)
    check(torch.randn(shape, dtype=dtype) * 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu_squared_noncontiguous_misaligned(dtype):
    torch.manual_seed(1)
    check(torch.randn(30, 20, dtype=dtype).t())
    check(torch.randn(2, 5, 2 * 48, dtype=dtype).chunk(2, dim=-1)[1])
    x = torch.randn(4 * 100 + 1, dtype=dtype)[1:].view(4, 100)
    assert x.data_ptr() % 16 != 0
    check(x)


def test_relu_squared_nan_inf():
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), -1.0, 0.0, 2.0],
                     requires_grad=True)
    y = relu_squared(x)
    y.backward(torch.ones_like(y))
    xr = x.detach().clone().requires_grad_()
    ref = torch.relu(xr) ** 2
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(y, ref, equal_nan=True)
    torch.testing.assert_close(x.grad, xr.grad, equal_nan=True)


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2)])
def test_relu_squared_empty(shape):
    x = torch.randn(shape, requires_grad=True)
    y = relu_squared(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_relu_squared_bad_inputs():
    with pytest.raises(TypeError, match="x must be float32"):
        relu_squared(torch.ones(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        relu_squared([1.0, 2.0])


def test_relu_squared_torch_compile_matches_eager():
    torch.manual_seed(2)
    x = torch.randn(3, 50).t()

    def f(x):
        return relu_squared(x) * 2.0

    assert_compile_matches_eager(f, (x,), ones_like)


def test_relu_squared_opcheck():
    from liger_aot.ops.relu_squared import relu_squared_bwd_op, relu_squared_fwd_op

    x = torch.randn(3, 20, requires_grad=True)
    torch.library.opcheck(relu_squared_fwd_op.custom_op, (x,))
    torch.library.opcheck(relu_squared_bwd_op.custom_op, (torch.randn(3, 20), x.detach()))


def test_relu_squared_module():
    from liger_aot.transformers.activations import LigerReLUSquared

    x = torch.randn(4, 9)
    assert torch.equal(LigerReLUSquared()(x), torch.relu(x) ** 2)
