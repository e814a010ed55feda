"""The norm forwards' row statistics (RMSNorm's rstd, LayerNorm's mean and rstd) are written
only when a backward will read them: under torch.no_grad, or with no input requiring grad,
the ops launch with store_stats 0 and hand the kernel a placeholder it must leave alone.
Interpreter, against the same op in grad mode (same kernel and config, so the same bits) and
float64 PyTorch; whole-row rows (300 columns) and looped ones (9000), fp32 and bf16."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

from _op_helpers import rel_err
from liger_aot.ops import layer_norm as ln_mod
from liger_aot.ops import rms_norm as rms_mod
from liger_aot.ops.layer_norm import layer_norm
from liger_aot.ops.rms_norm import fused_add_rms_norm, rms_norm

EPS = 1e-6
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
SENTINEL = -123.0
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
COLS = [pytest.param(300, id="whole_row"), pytest.param(9000, id="looped")]


@pytest.fixture
def placeholder(monkeypatch):
    """The placeholder the ops pass for unwritten statistics, filled with SENTINEL, and the
    number of launches that took it."""
    # room for every test row: a kernel that wrote them anyway would show, not corrupt
    taken = {"calls": 0, "tensor": torch.full((64,), SENTINEL)}

    def unused(device):
        taken["calls"] += 1
        return taken["tensor"]
    for module in (ln_mod, rms_mod):
        monkeypatch.setattr(module, "unused_stats", unused)
    return taken


def _inputs(n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(6, n, generator=gen) + 2).to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=gen)).to(dtype)
    b = (0.1 * torch.randn(n, generator=gen)).to(dtype)
    return x, w, b


def _assert_untouched(placeholder, launches):
    assert placeholder["calls"] == launches
    assert (placeholder["tensor"] == SENTINEL).all(), "the kernel wrote the statistics"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", COLS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_layer_norm_without_a_backward_skips_its_statistics(placeholder, n, dtype, bias):
    x, w, b = _inputs(n, dtype)
    b = b if bias else None
    w_leaf = w.clone().requires_grad_()
    with torch.no_grad():
        y = layer_norm(x, w_leaf, b, EPS)  # a parameter, but grad mode is off
    assert y.grad_fn is None
    _assert_untouched(placeholder, 1)
    y_grad_mode = layer_norm(x, w_leaf, b, EPS)  # stores them: a backward may follow
    assert y_grad_mode.grad_fn is not None and placeholder["calls"] == 1
    assert torch.equal(y, y_grad_mode.detach())
    ref = F.layer_norm(x.double(), (n,), w.double(), None if b is None else b.double(), EPS)
    assert rel_err(y, ref) < TOL[dtype]
    # nothing requires grad: no backward can follow, in grad mode too
    assert torch.equal(layer_norm(x, w, b, EPS), y)
    _assert_untouched(placeholder, 2)
    _, _, mean, rstd = ln_mod.layer_norm_forward(x, w, b, EPS, stats=False)
    assert mean is None and rstd is None
    _assert_untouched(placeholder, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", COLS)
def test_rms_norm_without_a_backward_skips_its_statistics(placeholder, n, dtype):
    x, w, _ = _inputs(n, dtype)
    with torch.no_grad():
        y = rms_norm(x, w.clone().requires_grad_(), EPS)
    _assert_untouched(placeholder, 1)
    assert torch.equal(y, rms_norm(x, w.clone().requires_grad_(), EPS).detach())
    x64 = x.double()
    ref = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)).to(dtype) * w
    assert rel_err(y, ref.double()) < TOL[dtype]
    y2, _, rstd = rms_mod._forward(x, w, EPS, 0.0, 0, stats=False)
    assert rstd is None and torch.equal(y2, y)
    _assert_untouched(placeholder, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", COLS)
def test_fused_add_rms_norm_without_a_backward_skips_its_statistics(placeholder, n, dtype):
    x, w, _ = _inputs(n, dtype)
    r, _, _ = _inputs(n, dtype, seed=1)
    with torch.no_grad():
        y, s = fused_add_rms_norm(x, r, w, EPS)
    _assert_untouched(placeholder, 1)
    assert y.shape == x.shape and s.shape == x.shape
    y_grad_mode, s_grad_mode = fused_add_rms_norm(x, r.clone().requires_grad_(), w, EPS)
    assert torch.equal(y, y_grad_mode.detach()) and torch.equal(s, s_grad_mode.detach())
    assert rel_err(s, x.double() + r.double()) < TOL[dtype]


@pytest.mark.parametrize("n", COLS)
@pytest.mark.parametrize("wanted", ["x", "weight", "bias"])
def test_norms_store_statistics_when_any_input_wants_a_gradient(placeholder, n, wanted):
    """One input requiring grad is enough: the forward stores its statistics and the
    backward gives that input its gradient (float64 PyTorch's)."""
    x, w, b = _inputs(n, torch.float32)
    leaves = {"x": x.clone(), "weight": w.clone(), "bias": b.clone()}
    leaves[wanted].requires_grad_()
    y = layer_norm(leaves["x"], leaves["weight"], leaves["bias"], EPS)
    g = torch.randn_like(y)
    y.backward(g)
    ref_leaves = {k: v.detach().double().requires_grad_(k == wanted)
                  for k, v in leaves.items()}
    F.layer_norm(ref_leaves["x"], (n,), ref_leaves["weight"], ref_leaves["bias"],
                 EPS).backward(g.double())
    assert rel_err(leaves[wanted].grad, ref_leaves[wanted].grad) < TOL[torch.float32]
    if wanted != "bias":  # RMSNorm's gradient, from its own backward alone
        leaves[wanted].grad = ref_leaves[wanted].grad = None
        rms_norm(leaves["x"], leaves["weight"], EPS).backward(g)
        x64, w64 = ref_leaves["x"], ref_leaves["weight"]
        (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w64).backward(g.double())
        assert rel_err(leaves[wanted].grad, ref_leaves[wanted].grad) < TOL[torch.float32]
    assert placeholder["calls"] == 0
