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
    torch.library.opcheck(glu_fwd_op.custom_op, (a, b, act))
    torch.library.opcheck(glu_bwd_op.custom_op, (torch.randn(3, 20), a.detach(), b.detach(), act))


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


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_in_place_backward(dtype):
    """in_place: the gradients land in a's and b's own buffers and equal the out-of-place
    ones; leaves, overlapping inputs and a retained graph get new buffers."""
    torch.manual_seed(9)
    a_leaf = (torch.randn(6, 96) * 3).to(dtype).requires_grad_()
    b_leaf = torch.randn(6, 96).to(dtype).requires_grad_()
    dc = torch.randn(6, 96).to(dtype)
    ref = torch.autograd.grad(swiglu(a_leaf, b_leaf), (a_leaf, b_leaf), dc)
    a, b = a_leaf * 1, b_leaf * 1  # non-leaves the caller owns, as an MLP's projections
    buffers, seen = (a.data_ptr(), b.data_ptr()), []
    a.register_hook(lambda g: seen.append(g.data_ptr()))
    b.register_hook(lambda g: seen.append(g.data_ptr()))
    swiglu(a, b, in_place=True).backward(dc)
    assert sorted(seen) == sorted(buffers)
    assert torch.equal(a_leaf.grad, ref[0]) and torch.equal(b_leaf.grad, ref[1])
    # leaves: never overwritten (their .grad would alias their data)
    a0 = a_leaf.detach().clone()
    grads = torch.autograd.grad(swiglu(a_leaf, b_leaf, in_place=True), (a_leaf, b_leaf), dc)
    assert torch.equal(a_leaf, a0) and grads[0].data_ptr() != a_leaf.data_ptr()
    # retain_graph: the second backward reads the same a and b
    a, b = a_leaf * 1, b_leaf * 1
    c = swiglu(a, b, in_place=True)
    first = torch.autograd.grad(c, (a, b), dc, retain_graph=True)
    second = torch.autograd.grad(c, (a, b), dc)
    assert all(torch.equal(x, y) for x, y in zip(first, second))
    assert torch.equal(first[0], ref[0])
    # the same tensor twice: one buffer cannot take both gradients
    s = a_leaf * 1
    g = torch.autograd.grad(swiglu(s, s, in_place=True), a_leaf, dc)[0]
    assert torch.equal(g, torch.autograd.grad(swiglu(a_leaf, a_leaf), a_leaf, dc)[0])


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


# -- the eager call path: direct C++ apply, forward plan reused by the backward ---------------

def test_swiglu_eager_path_is_gated_function(monkeypatch):
    """swiglu calls GatedFunction's C++ apply directly; with that unavailable it calls
    GatedFunction.apply: same node type, same outputs and gradients bit for bit."""
    from liger_aot.ops import swiglu as mod

    torch.manual_seed(8)
    a0, b0, g = torch.randn(3, 40), torch.randn(3, 40), torch.randn(3, 40)
    results = []
    for direct in (True, False):
        if not direct:
            monkeypatch.setattr(mod, "_gated_apply", None)
        a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
        c = swiglu(a, b)
        assert type(c.grad_fn) is mod.GatedFunction._backward_cls
        c.backward(g)
        results.append((c.detach(), a.grad, b.grad))
    for x, y in zip(*results):
        assert torch.equal(x, y)


def test_swiglu_under_functorch_unchanged():
    """Under a functorch transform the call goes through Function.apply, which refuses an
    autograd Function without setup_context: the same error as before the direct path."""
    from liger_aot.ops.swiglu import GatedFunction

    a, b = torch.randn(2, 8), torch.randn(2, 8)
    errors = []
    for f in (lambda a: swiglu(a, b).sum(), lambda a: GatedFunction.apply(a, b, 0).sum()):
        with pytest.raises(RuntimeError, match="setup_context") as info:
            torch.func.grad(f)(a)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("direction", ["to_contiguous", "to_strided"])
def test_swiglu_saved_tensor_hooks_change_layout(direction):
    """A saved-tensor hook may hand the backward other strides than the forward saw (e.g.
    offloading copies): the backward reads the strides of what it gets back."""
    torch.manual_seed(9)
    if direction == "to_contiguous":
        x = torch.randn(2, 5, 2 * 48)
        a, b = (t.detach().requires_grad_() for t in x.chunk(2, dim=-1))  # row stride 2n

        def pack(t):  # an offloading-like copy: contiguous
            return t.contiguous().clone()

        def unpack(t):
            return t
    else:
        a = torch.randn(2, 5, 48, requires_grad=True)
        b = torch.randn(2, 5, 48, requires_grad=True)

        def pack(t):
            return t

        def unpack(t):  # the same values, rows 2n apart (a large filler between them)
            return torch.cat([t, torch.full_like(t, 1e4)], -1)[..., :t.shape[-1]]
    g = torch.randn(2, 5, 48)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        c = swiglu(a, b)
    c.backward(g)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (F.silu(a64) * b64).backward(g.double())
    assert rel_err(c, F.silu(a64) * b64) < 1e-5
    assert rel_err(a.grad, a64.grad) < 1e-5 and rel_err(b.grad, b64.grad) < 1e-5


def test_swiglu_parameter_inputs():
    """Inputs that are not plain Tensors (nn.Parameter) take the checked path: same result."""
    torch.manual_seed(10)
    a, b = torch.nn.Parameter(torch.randn(3, 24)), torch.nn.Parameter(torch.randn(3, 24))
    c = swiglu(a, b)
    assert type(c) is torch.Tensor
    c.sum().backward()
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (F.silu(a64) * b64).sum().backward()
    assert rel_err(c, F.silu(a64) * b64) < 1e-5 and rel_err(a.grad, a64.grad) < 1e-5
