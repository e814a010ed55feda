import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

from liger_aot.ops.geglu import geglu

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def reference(a, b):
    return F.gelu(a, approximate="tanh") * b


def check(a, b, dtype):
    a = a.detach().requires_grad_()
    b = b.detach().requires_grad_()
    c = geglu(a, b)
    assert c.shape == a.shape and c.dtype == dtype
    g = torch.randn(c.shape, dtype=dtype)
    c.backward(g)
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    ref = reference(a64, b64)
    ref.backward(g.double())
    tol = TOL[dtype]
    assert rel_err(c, ref) < tol
    assert rel_err(a.grad, a64.grad) < tol
    assert rel_err(b.grad, b64.grad) < tol
    assert a.grad.shape == a.shape and a.grad.dtype == dtype


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
    a = torch.randn(shape, requires_grad=True)
    b = torch.randn(shape, requires_grad=True)
    c = geglu(a, b)
    assert c.shape == a.shape
    c.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


def test_geglu_bad_inputs():
    a = torch.randn(4, 8)
    with pytest.raises(ValueError, match="one shape"):
        geglu(a, torch.randn(4, 9))
    with pytest.raises(TypeError, match="one dtype"):
        geglu(a, torch.randn(4, 8, dtype=torch.float16))
    with pytest.raises(TypeError, match="a must be float32"):
        geglu(a.long(), a)
    with pytest.raises(ValueError, match="one device"):
        geglu(a, torch.randn(4, 8, device="meta"))
    with pytest.raises(ValueError, match="at least one dimension"):
        geglu(torch.tensor(1.0), torch.tensor(2.0))


def test_geglu_torch_compile_matches_eager():
    torch.manual_seed(2)
    a, b = torch.randn(3, 50), torch.randn(3, 50)

    def f(a, b):
        return geglu(a, b) * 2.0

    results = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        al, bl = a.detach().requires_grad_(), b.detach().requires_grad_()
        c = fn(al, bl)
        c.backward(torch.ones_like(c))
        results.append((c, al.grad, bl.grad))
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)
    torch._dynamo.reset()


def test_geglu_mlp_module():
    from liger_aot.transformers.activations import LigerGEGLUMLP

    class Config:
        hidden_size, intermediate_size, hidden_act = 24, 40, "gelu_pytorch_tanh"

    torch.manual_seed(3)
    mlp = LigerGEGLUMLP(Config())
    x = torch.randn(2, 3, 24, requires_grad=True)
    y = mlp(x)
    y.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    ref = mlp.down_proj(reference(mlp.gate_proj(x), mlp.up_proj(x)))
    ref.sum().backward()
    assert rel_err(y, ref) < 1e-5 and rel_err(grad, x.grad) < 1e-5
