import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

from _op_helpers import assert_compile_matches_eager, check_op, launched_weight_grad_modes
from liger_aot.kernel_src.layer_norm import spec
from liger_aot.ops import layer_norm as ln_mod
from liger_aot.ops.layer_norm import layer_norm
from liger_aot.transformers.norms import LigerLayerNorm

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def check(x, w, b, eps=1e-5):
    """Forward and backward of layer_norm against float64 PyTorch."""
    _, (x, w, b), _ = check_op(lambda x, w, b: layer_norm(x, w, b, eps),
                               lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps),
                               (x, w, b), TOL)
    assert w.grad.dtype == w.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 100), (2, 3, 300), (3, 3000)])
def test_layer_norm(shape, bias, dtype):
    torch.manual_seed(0)
    n = shape[-1]
    check(torch.randn(shape, dtype=dtype) + 2, torch.randn(n, dtype=dtype),
          torch.randn(n, dtype=dtype) if bias else None)


@pytest.mark.parametrize("bias", [True, False])  # the looped forward has a loop for each
@pytest.mark.parametrize("n", [300, 9000, 17000])  # whole rows; looped backward; both looped
def test_layer_norm_large_mean(n, bias):
    torch.manual_seed(1)
    # a large mean: the forward's shifted sums must not cancel
    check(torch.randn(2, n) * 0.5 + 50, torch.randn(n), torch.randn(n) if bias else None)


def test_layer_norm_strided_transposed_misaligned():
    torch.manual_seed(2)
    check(torch.randn(5, 2 * 96)[:, :96], torch.randn(96), torch.randn(96))
    check(torch.randn(40, 6).t(), torch.randn(40), None)
    x = torch.randn(4 * 100 + 1, dtype=torch.bfloat16)[1:].view(4, 100)
    w = torch.randn(101, dtype=torch.bfloat16)[1:]
    b = torch.randn(101, dtype=torch.bfloat16)[1:]
    assert x.data_ptr() % 16 != 0
    check(x, w, b)


def test_layer_norm_mixed_param_dtype():
    torch.manual_seed(3)
    x = torch.randn(6, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    b = torch.randn(64, requires_grad=True)
    layer_norm(x, w, b).sum().backward()
    assert w.grad.dtype == b.grad.dtype == torch.float32


@pytest.mark.parametrize("shape", [(0, 64), (3, 0)])
def test_layer_norm_empty(shape):
    x = torch.randn(shape, requires_grad=True)
    w = torch.randn(shape[-1], requires_grad=True)
    b = torch.randn(shape[-1], requires_grad=True)
    y = layer_norm(x, w, b)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.ones_like(b)
                                                                    * shape[0])


def test_layer_norm_nan_propagates():
    x = torch.randn(3, 32)
    x[1, 5] = float("nan")
    y = layer_norm(x, torch.ones(32), torch.zeros(32))
    assert torch.isnan(y[1]).all() and not torch.isnan(y[0]).any()


def test_layer_norm_bad_inputs():
    x, w = torch.randn(4, 8), torch.randn(8)
    with pytest.raises(ValueError, match="weight must have shape"):
        layer_norm(x, torch.randn(9))
    with pytest.raises(ValueError, match="bias must have shape"):
        layer_norm(x, w, torch.randn(2, 8))
    with pytest.raises(TypeError, match="bias must be float32"):
        layer_norm(x, w, torch.ones(8, dtype=torch.int64))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        layer_norm(None, w)
    with pytest.raises(ValueError, match="one device"):
        layer_norm(x, torch.randn(8, device="meta"))
    with pytest.raises(ValueError, match="at least one dimension"):
        layer_norm(torch.tensor(1.0), w)


def test_layer_norm_compile_matches_eager():
    torch.manual_seed(4)
    x, w, b, g = torch.randn(2, 5, 72), torch.randn(72), torch.randn(72), torch.randn(2, 5, 72)
    assert_compile_matches_eager(layer_norm, (x, w, b), lambda y: g, args=(1e-5,), tol=1e-6)


def test_layer_norm_opcheck():
    torch.manual_seed(5)
    x, w, b = (torch.randn(3, 40, requires_grad=True), torch.randn(40, requires_grad=True),
               torch.randn(40, requires_grad=True))
    torch.library.opcheck(ln_mod.layer_norm_fwd_op.custom_op, (x, w, b, 1e-5))
    torch.library.opcheck(ln_mod.layer_norm_fwd_op.custom_op, (x, w, None, 1e-5))
    _, mean, rstd = ln_mod.layer_norm_fwd_op(x.detach(), w.detach(), b.detach(), 1e-5)
    torch.library.opcheck(ln_mod.layer_norm_bwd_op.custom_op,
                          (torch.randn(3, 40), x.detach(), w.detach(), mean, rstd))


def test_layer_norm_variants():
    # 54, plus the grouped backward's 2 and the grouped forward's 2 (bf16 / fp16, aligned;
    # sm90 only)
    assert sum(len(list(s.variants())) for s in spec.SPECS) == 58
    for grouped in (spec.BWD_GROUPED, spec.FWD_GROUPED):
        assert len(list(grouped.variants("sm90"))) == 2
        assert not list(grouped.variants("sm80"))


def test_liger_layer_norm_module():
    torch.manual_seed(6)
    m = LigerLayerNorm(64)
    assert torch.equal(m.weight, torch.ones(64)) and torch.equal(m.bias, torch.zeros(64))
    assert m.eps == 1e-6
    x = torch.randn(3, 64)
    torch.testing.assert_close(m(x), F.layer_norm(x, (64,), m.weight, m.bias, 1e-6))
    assert LigerLayerNorm(8, bias=True).bias.abs().sum() > 0
    assert torch.equal(LigerLayerNorm(8, init_fn="zeros").weight, torch.zeros(8))


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [100, 3000, 9000, 17000])  # whole rows (2), looped, interleaved
def test_layer_norm_weight_grad_reduction(monkeypatch, n, dtype, deterministic):
    """Whole-row and interleaved backwards sum dw and db with atomic adds in the kernel (the
    last program, per column block when interleaved, writes both) unless torch's
    deterministic mode is on; the persistent looped layout always writes per-program
    partials. 37 rows spread over several programs."""
    torch.manual_seed(4)
    modes = launched_weight_grad_modes(
        monkeypatch, ln_mod._bwd, deterministic,
        lambda: check(torch.randn(37, n, dtype=dtype) + 1, torch.randn(n, dtype=dtype),
                      torch.randn(n, dtype=dtype)))
    config = spec.select_bwd_config(n)
    persistent_looped = config.constexprs["LOOP"] and not config.constexprs["CHUNK_ROWS"]
    assert modes == [0 if deterministic or persistent_looped else 1]
