import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

from _op_helpers import (assert_compile_matches_eager, check_glu_bad_inputs, check_glu_empty,
                         check_module_grads, check_op, rel_err, seeded_randn)
from liger_aot.ops.swiglu import swiglu

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]


def check(a, b, dtype):
    """Forward and backward of swiglu(a, b) against float64 PyTorch."""
    assert a.dtype == dtype
    check_op(swiglu, lambda a, b: F.silu(a) * b, (a, b), TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 100), (2, 3, 100), (3, 5120), (5, 64), (1, 1)])
def test_swiglu(shape, dtype):
    torch.manual_seed(0)
    check(torch.randn(shape, dtype=dtype) * 3, torch.randn(shape, dtype=dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_strided_rows(dtype):
    # gate and up halves of one fused projection: row stride 2 * n, read in place
    torch.manual_seed(1)
    x = torch.randn(2, 5, 2 * 96, dtype=dtype)
    a, b = x.chunk(2, dim=-1)
    assert not a.is_contiguous()
    check(a, b, dtype)


def test_swiglu_transposed_last_dim():
    torch.manual_seed(2)
    a = torch.randn(48, 6).t()  # last dim stride 6: copied
    b = torch.randn(6, 48)
    check(a, b, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_misaligned(dtype):
    torch.manual_seed(3)
    a = torch.randn(4 * 100 + 1, dtype=dtype)[1:].view(4, 100)
    b = torch.randn(4 * 100 + 1, dtype=dtype)[1:].view(4, 100)
    assert a.data_ptr() % 16 != 0
    check(a, b, dtype)


def test_swiglu_grad_output_noncontiguous():
    torch.manual_seed(4)
    a = torch.randn(3, 40, requires_grad=True)
    b = torch.randn(3, 40, requires_grad=True)
    swiglu(a, b).sum().backward()  # grad_output is an expanded (stride 0) tensor
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (F.silu(a64) * b64).sum().backward()
    assert rel_err(a.grad, a64.grad) < 1e-5
    assert rel_err(b.grad, b64.grad) < 1e-5


@pytest.mark.parametrize("shape", [(0, 100), (3, 0), (2, 0, 8)])
def test_swiglu_empty(shape):
    check_glu_empty(swiglu, shape)


def test_swiglu_bad_inputs():
    check_glu_bad_inputs(swiglu, torch.bfloat16)
    a = torch.randn(4, 8)
    with pytest.raises(TypeError, match="b must be float32"):
        swiglu(a, torch.ones(4, 8, dtype=torch.int32))
    with pytest.raises(TypeError, match="a must be a torch.Tensor"):
        swiglu([1.0], a)


def test_swiglu_torch_compile_matches_eager():
    torch.manual_seed(5)
    x = torch.randn(3, 5, 2 * 40)

    def f(x):
        a, b = x.chunk(2, dim=-1)  # strided halves, as Phi-3's gate_up_proj
        return swiglu(a, b) * 2.0

    assert_compile_matches_eager(f, (x,), seeded_randn)


@pytest.mark.parametrize("act", [0, 1])
def test_glu_opcheck(act):
    from liger_aot.ops.swiglu import glu_bwd_op, glu_fwd_op

    a = torch.randn(3, 20, requires_grad=True)
    b = torch.randn(3, 20, requires_grad=True)
    torch.library.opcheck(glu_fwd_op, (a, b, act))
    torch.library.opcheck(glu_bwd_op, (torch.randn(3, 20), a.detach(), b.detach(), act))


class _Config:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _mlp_reference(module, x, names):
    gate, up, down = (getattr(module, n) for n in names)
    return down(F.silu(gate(x)) * up(x))


@pytest.mark.parametrize("cls,names", [
    ("LigerSwiGLUMLP", ("gate_proj", "up_proj", "down_proj")),
    ("LigerBlockSparseTop2MLP", ("w1", "w3", "w2")),
    ("LigerQwen3MoeSwiGLUMLP", ("gate_proj", "up_proj", "down_proj")),
])
def test_swiglu_mlp_modules(cls, names):
    from liger_aot.transformers import activations

    torch.manual_seed(6)
    config = _Config(hidden_size=24, intermediate_size=40, hidden_act="silu")
    module = getattr(activations, cls)(config)
    check_module_grads(module, lambda x: _mlp_reference(module, x, names),
                       torch.randn(2, 3, 24, requires_grad=True))
    with pytest.raises(ValueError, match="not supported"):
        getattr(activations, cls)(_Config(hidden_size=8, intermediate_size=8, hidden_act="gelu"))


def test_swiglu_mlp_module_variants():
    from liger_aot.transformers.activations import LigerPhi3SwiGLUMLP, LigerQwen3MoeSwiGLUMLP

    torch.manual_seed(7)
    config = _Config(hidden_size=16, intermediate_size=24, hidden_act="swish")
    assert LigerQwen3MoeSwiGLUMLP(config, intermediate_size=8).up_proj.out_features == 8
    phi3 = LigerPhi3SwiGLUMLP(config)
    assert phi3.gate_up_proj.out_features == 48
    x = torch.randn(5, 16)
    gate, up = phi3.gate_up_proj(x).chunk(2, dim=-1)
    assert rel_err(phi3(x), phi3.down_proj(F.silu(gate) * up)) < 1e-5
