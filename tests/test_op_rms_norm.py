import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import launched_weight_grad_modes
from liger_aot.kernel_src.rms_norm import spec
from liger_aot.ops import rms_norm as rms_mod
from liger_aot.ops.rms_norm import rms_norm
from liger_aot.transformers.norms import (LigerRMSNorm, LigerRMSNormForGemma,
                                          LigerRMSNormForGemma2, LigerRMSNormForGemma3)

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def reference(x, w, eps, offset):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + w.double())


def check(x, w, eps=1e-6, offset=0.0, casting_mode="llama", in_place=True):
    """Forward and backward of rms_norm against float64 PyTorch."""
    dtype = x.dtype
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    y = rms_norm(x, w, eps, offset, casting_mode, in_place=in_place)
    assert y.shape == x.shape and y.dtype == dtype
    g = torch.randn(y.shape, dtype=dtype)
    y.backward(g.clone())
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    ref = reference(x64, w64, eps, offset)
    ref.backward(g.double())
    tol = TOL[dtype]
    assert rel_err(y, ref) < tol
    assert rel_err(x.grad, x64.grad) < tol
    assert rel_err(w.grad, w64.grad) < tol
    assert x.grad.shape == x.shape and x.grad.dtype == dtype
    assert w.grad.shape == w.shape and w.grad.dtype == w.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["llama", "gemma", "none"])
@pytest.mark.parametrize("shape", [(7, 100), (2, 3, 300), (3, 5120)])
def test_rms_norm(shape, mode, dtype):
    torch.manual_seed(0)
    n = shape[-1]
    check(torch.randn(shape, dtype=dtype), torch.randn(n, dtype=dtype), 1e-6, 0.0, mode)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_offset_and_dtypes(dtype):
    torch.manual_seed(1)
    check(torch.randn(9, 77, dtype=dtype), torch.randn(77, dtype=dtype) * 0.1, 1e-5, 1.0,
          "gemma")
    check(torch.randn(9, 77, dtype=dtype), torch.randn(77, dtype=dtype), 1e-5, 0.5, "llama")


@pytest.mark.parametrize("n", [9000, 16500])  # looped backward; looped forward and backward
def test_rms_norm_long_rows(n):
    torch.manual_seed(2)
    check(torch.randn(3, n), torch.randn(n), casting_mode="llama")


@pytest.mark.parametrize("n", [64, 16500])  # rows over 16K: the interleaved layout
@pytest.mark.parametrize("in_place", [True, False])
def test_rms_norm_in_place(in_place, n):
    """in_place writes dx into the gradient's buffer, except with the interleaved backward,
    whose column programs read dy after other programs wrote dx: a buffer of its own there."""
    torch.manual_seed(3)
    x = torch.randn(6, n, requires_grad=True)
    w = torch.randn(n, requires_grad=True)
    y = rms_norm(x, w, in_place=in_place)
    g = torch.randn_like(y)
    g_before = g.clone()
    y.backward(g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    reference(x64, w64, 1e-6, 0.0).backward(g_before.double())
    assert rel_err(x.grad, x64.grad) < 1e-5
    assert rel_err(w.grad, w64.grad) < 1e-5
    if in_place and n == 64:  # dx went into the gradient's own buffer
        assert torch.equal(g, x.grad)
        assert g.data_ptr() == x.grad.data_ptr()
    else:
        assert torch.equal(g, g_before)


def test_rms_norm_in_place_expanded_grad():
    # sum().backward() hands an expanded (stride 0) gradient: never written in place
    torch.manual_seed(4)
    x = torch.randn(4, 48, requires_grad=True)
    w = torch.randn(48, requires_grad=True)
    rms_norm(x, w, in_place=True).sum().backward()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    reference(x64, w64, 1e-6, 0.0).sum().backward()
    assert rel_err(x.grad, x64.grad) < 1e-5
    assert rel_err(w.grad, w64.grad) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_strided_rows(dtype):
    torch.manual_seed(5)
    x = torch.randn(5, 2 * 96, dtype=dtype)[:, :96]  # row stride 192, read in place
    assert not x.is_contiguous()
    check(x, torch.randn(96, dtype=dtype))


def test_rms_norm_transposed():
    torch.manual_seed(6)
    x = torch.randn(40, 6).t()  # last dim stride 6: copied
    check(x, torch.randn(40))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_misaligned(dtype):
    torch.manual_seed(7)
    x = torch.randn(4 * 100 + 1, dtype=dtype)[1:].view(4, 100)
    w = torch.randn(101, dtype=dtype)[1:]
    assert x.data_ptr() % 16 != 0 and w.data_ptr() % 16 != 0
    check(x, w)


def test_rms_norm_mixed_weight_dtype():
    # fp32 master weight with bf16 activations: weight gradient comes back in fp32
    torch.manual_seed(8)
    x = torch.randn(6, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    y = rms_norm(x, w)
    assert y.dtype == torch.bfloat16
    g = torch.randn_like(y)
    y.backward(g.clone())
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = reference(x64, w64, 1e-6, 0.0)
    ref.backward(g.double())
    assert rel_err(y, ref) < 2e-2
    assert w.grad.dtype == torch.float32
    assert rel_err(w.grad, w64.grad) < 2e-2
    assert rel_err(x.grad, x64.grad) < 2e-2


@pytest.mark.parametrize("shape", [(0, 64), (3, 0), (2, 0, 8)])
def test_rms_norm_empty(shape):
    x = torch.randn(shape, requires_grad=True)
    w = torch.randn(shape[-1], requires_grad=True)
    y = rms_norm(x, w)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros_like(w))


def test_rms_norm_nan_propagates():
    x = torch.randn(3, 32)
    x[1, 5] = float("nan")
    y = rms_norm(x, torch.ones(32))
    assert torch.isnan(y[1]).all()
    assert not torch.isnan(y[0]).any() and not torch.isnan(y[2]).any()


def test_rms_norm_bad_inputs():
    x = torch.randn(4, 8)
    w = torch.randn(8)
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm(x, torch.randn(9))
    with pytest.raises(TypeError, match="weight must be float32"):
        rms_norm(x, torch.ones(8, dtype=torch.int32))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        rms_norm([1.0], w)
    with pytest.raises(ValueError, match="one device"):
        rms_norm(x, torch.randn(8, device="meta"))
    with pytest.raises(ValueError, match="casting_mode must be one of"):
        rms_norm(x, w, casting_mode="bogus")
    with pytest.raises(ValueError, match="at least one dimension"):
        rms_norm(torch.tensor(1.0), w)


def test_rms_norm_variant_budget():
    # the residual path rides on runtime flags: no more variants than before (306 per arch),
    # plus the interleaved backward's config (18: 3 dtypes x 2 alignments x 3 casting modes)
    # and the grouped backward and forward (12 each: bf16 / fp16, aligned, 3 casting modes,
    # with and without the residual (gradient); sm90 only)
    assert sum(len(list(s.variants())) for s in spec.SPECS) <= 306 + 18 + 12 + 12
    assert not list(spec.BWD_GROUPED.variants("sm80"))
    assert not list(spec.FWD_GROUPED.variants("sm80"))


def test_rms_norm_compile_matches_eager():
    torch.manual_seed(9)
    x = torch.randn(2, 5, 72)
    w = torch.randn(72)
    g = torch.randn(2, 5, 72)

    def fn(x, w):
        return rms_norm(x, w, 1e-6, 0.5, "gemma")

    results = []
    for f in (fn, torch.compile(fn, fullgraph=True, backend="aot_eager")):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = f(xr, wr)
        y.backward(g.clone())  # eager in_place writes dx into the gradient
        results.append((y.detach(), xr.grad, wr.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_rms_norm_opcheck():
    torch.manual_seed(10)
    x = torch.randn(3, 40, requires_grad=True)
    w = torch.randn(40, requires_grad=True)
    torch.library.opcheck(rms_mod.rms_norm_fwd_op.custom_op, (x, w, 1e-6, 0.0, 0))
    y, rstd = rms_mod.rms_norm_fwd_op(x.detach(), w.detach(), 1e-6, 0.0, 0)
    torch.library.opcheck(rms_mod.rms_norm_bwd_op.custom_op,
                          (torch.randn(3, 40), x.detach(), w.detach(), rstd, 0.0, 0))


def test_liger_rms_norm_module():
    torch.manual_seed(11)
    m = LigerRMSNorm(64)
    assert torch.equal(m.weight, torch.ones(64)) and m.in_place and m.casting_mode == "llama"
    x = torch.randn(3, 64)
    torch.testing.assert_close(m(x), reference(x, m.weight.detach(), 1e-6, 0.0).float())
    gemma = LigerRMSNormForGemma(64)
    assert torch.equal(gemma.weight, torch.zeros(64)) and gemma.offset == 1.0
    torch.testing.assert_close(gemma(x), reference(x, gemma.weight.detach(), 1e-6, 1.0).float())
    assert not LigerRMSNormForGemma2(64).in_place
    assert LigerRMSNormForGemma3(16).weight.shape == (16,)
    plain = LigerRMSNorm(64, elementwise_affine=False)
    assert plain.weight is None
    xr = x.clone().requires_grad_()
    plain(xr).sum().backward()
    torch.testing.assert_close(plain(x), reference(x, torch.ones(64), 1e-6, 0.0).float())
    assert xr.grad.shape == x.shape
    with pytest.raises(ValueError, match="init_fn"):
        LigerRMSNorm(8, init_fn="normal")


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [100, 5120, 9000, 20000])  # whole rows (2), looped, interleaved
def test_rms_norm_weight_grad_reduction(monkeypatch, n, dtype, deterministic):
    """Whole-row and interleaved backwards sum dw with atomic adds in the kernel (the last
    program, per column block when interleaved, writes it) unless torch's deterministic mode
    is on; the persistent looped layout always writes per-program partials. 37 rows spread
    over several programs, so the sums really combine partials."""
    torch.manual_seed(4)
    modes = launched_weight_grad_modes(
        monkeypatch, rms_mod._bwd, deterministic,
        lambda: check(torch.randn(37, n, dtype=dtype), torch.randn(n, dtype=dtype)))
    config = spec.select_bwd_config(n)
    persistent_looped = config.constexprs["LOOP"] and not config.constexprs["CHUNK_ROWS"]
    assert modes == [0 if deterministic or persistent_looped else 1]
