import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

from _op_helpers import (assert_compile_matches_eager, check_glu_bad_inputs, check_glu_empty,
                         check_module_grads, check_op, ones_like)
from liger_aot.ops.geglu import geglu

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference(a, b):
    return F.gelu(a, approximate="tanh") * b


def check(a, b, dtype):
    assert a.dtype == dtype
    check_op(geglu, reference, (a, b), TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 100), (2, 3, 100), (3, 3000), (1, 1)])
def test_geglu(shape, dtype):
    torch.manual_seed(0)
    check(torch.randn(shape, dtype=dtype) * 3, torch.randn(shape, dtype=dtype), dtype)


def test_geglu_saturation():
    # large |a|: tanh saturates to +-1 without overflow (gelu -> a or 0)
    a = torch.tensor([[-60.0, -12.0, -3.0, -1e-4, 0.0, 1e-4, 3.0, 12.0, 60.0]])
    check(a, torch.ones_like(a), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_geglu_strided_rows_and_misaligned(dtype):
    torch.manual_seed(1)
    x = torch.randn(2, 5, 2 * 96, dtype=dtype)
    a, b = x.chunk(2, dim=-1)  # row stride 2n, read in place
    check(a, b, dtype)
    a = torch.randn(4 * 100 + 1, dtype=dtype)[1:].view(4, 100)
    b = torch.randn(4, 100, dtype=dtype)
    assert a.data_ptr() % 16 != 0
    check(a, b, dtype)
    check(torch.randn(48, 6, dtype=dtype).t(), torch.randn(6, 48, dtype=dtype), dtype)


@pytest.mark.parametrize("shape", [(0, 100), (3, 0)])
def test_geglu_empty(shape):
    check_glu_empty(geglu, shape)


def test_geglu_bad_inputs():
    check_glu_bad_inputs(geglu, torch.float16)
    a = torch.randn(4, 8)
    with pytest.raises(TypeError, match="a must be float32"):
        geglu(a.long(), a)


def test_geglu_torch_compile_matches_eager():
    torch.manual_seed(2)
    a, b = torch.randn(3, 50), torch.randn(3, 50)

    def f(a, b):
        return geglu(a, b) * 2.0

    assert_compile_matches_eager(f, (a, b), ones_like)


def test_geglu_mlp_module():
    from liger_aot.transformers.activations import LigerGEGLUMLP

    class Config:
        hidden_size, intermediate_size, hidden_act = 24, 40, "gelu_pytorch_tanh"

    torch.manual_seed(3)
    mlp = LigerGEGLUMLP(Config())
    check_module_grads(mlp, lambda x: mlp.down_proj(reference(mlp.gate_proj(x), mlp.up_proj(x))),
                       torch.randn(2, 3, 24, requires_grad=True))


def test_geglu_eager_path_is_gated_function():
    from liger_aot.ops.swiglu import GatedFunction

    a = torch.randn(3, 40, requires_grad=True)
    c = geglu(a, torch.randn(3, 40))
    assert type(c.grad_fn) is GatedFunction._backward_cls
