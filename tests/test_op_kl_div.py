import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

from _op_helpers import assert_compile_matches_eager, check_op, ones_like, rel_err
from liger_aot.ops.kl_div import kl_div, kl_div_bwd_op, kl_div_fwd_op
from liger_aot.transformers.losses_distill import LigerKLDIVLoss

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}
REDUCTIONS = ["batchmean", "sum", "mean", "none"]

pytestmark = pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")


def make(shape, dtype, log_target, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).log_softmax(-1).to(dtype)
    t = (torch.randn(shape, generator=g) * 2).softmax(-1)
    t = (t.log() if log_target else t).to(dtype)
    return x, t


def check(x, t, reduction, log_target, eps=1e-10):
    out, _, _ = check_op(
        lambda x: kl_div(x, t, reduction=reduction, log_target=log_target, eps=eps),
        lambda x: F.kl_div(x, t.double(), reduction=reduction, log_target=log_target),
        (x,), TOL, like_input=False)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("shape", [(7, 100), (3, 3001)])
def test_kl_div(shape, reduction, log_target, dtype):
    x, t = make(shape, dtype, log_target)
    check(x, t, reduction, log_target)


@pytest.mark.parametrize("reduction", ["batchmean", "none"])
def test_kl_div_fp16(reduction):
    x, t = make((5, 700), torch.float16, False)
    check(x, t, reduction, False)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_kl_div_3d_batchmean_divides_by_dim0(reduction):
    # PyTorch's batchmean divides by input.size(0), here 2, not by the 6 rows
    x, t = make((2, 3, 300), torch.float32, False, seed=1)
    check(x, t, reduction, False)


def test_kl_div_large_vocab():
    # 262144 columns: 128 column tiles per row
    x, t = make((2, 262144), torch.float32, True, seed=2)
    check(x, t, "batchmean", True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kl_div_noncontiguous_and_misaligned(dtype):
    x, t = make((6, 2 * 200), dtype, False, seed=3)
    xs = x[:, :200]  # row stride 400
    assert not xs.is_contiguous()
    flat = torch.cat([torch.zeros(1, dtype=dtype), t[:, :200].reshape(-1)])
    tm = flat[1:].view(6, 200)  # storage offset 1 element: not 16-byte aligned
    assert tm.data_ptr() % 16 != 0
    for reduction in ("sum", "none"):
        check(xs, tm, reduction, False)
    check(x.t(), t.t(), "mean", False)  # last dim not contiguous: copied


def test_kl_div_zero_target_and_eps():
    # zero probabilities contribute 0; eps only guards the log
    x, t = make((4, 50), torch.float32, False, seed=4)
    t[:, :10] = 0
    check(x, t, "batchmean", False, eps=1e-12)
    out = kl_div(x, t, reduction="sum", eps=0.5)
    ref = (t * (t.clamp_min(0.5).log() - x)).sum()
    assert rel_err(out, ref) < 1e-5


def test_kl_div_nan_propagates():
    x, t = make((3, 40), torch.float32, False, seed=5)
    x[1, 3] = float("nan")
    assert torch.isnan(kl_div(x, t, reduction="sum"))
    out = kl_div(x, t, reduction="none")
    assert torch.isnan(out[1, 3]) and torch.isfinite(out[0]).all()


def test_kl_div_none_sum_backward_expanded_grad():
    x, t = make((5, 130), torch.float32, True, seed=6)
    x.requires_grad_()
    kl_div(x, t, reduction="none", log_target=True).sum().backward()  # grad_output stride 0
    x64 = x.detach().double().requires_grad_()
    F.kl_div(x64, t.double(), reduction="none", log_target=True).sum().backward()
    assert rel_err(x.grad, x64.grad) < 1e-5


@pytest.mark.parametrize("shape", [(0, 10), (3, 0), (0,)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_kl_div_empty(shape, reduction):
    x = torch.randn(shape, requires_grad=True)
    t = torch.rand(shape)
    out = kl_div(x, t, reduction=reduction)
    ref = F.kl_div(x.detach(), t, reduction=reduction)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, equal_nan=True)
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_kl_div_module():
    x, t = make((4, 90), torch.float32, True, seed=7)
    for kwargs in ({}, {"reduction": "batchmean", "log_target": True},
                   {"eps": 1e-6, "reduction": "sum"}):
        mod = LigerKLDIVLoss(**kwargs)
        ref_mod = torch.nn.KLDivLoss(**{k: v for k, v in kwargs.items() if k != "eps"})
        tt = t if mod.log_target else t.exp()
        assert rel_err(mod(x, tt), ref_mod(x.double(), tt.double())) < 1e-5
    assert LigerKLDIVLoss().reduction == "mean" and LigerKLDIVLoss().eps == 1e-10


def test_kl_div_compile_matches_eager():
    x, t = make((6, 333), torch.float32, False, seed=8)

    def fn(a, b):
        return kl_div(a, b, reduction="batchmean") + kl_div(a, b, reduction="none").sum() * 0.5

    assert_compile_matches_eager(fn, (x,), ones_like, args=(t,), tol=1e-6)


def test_kl_div_opcheck():
    x, t = make((3, 40), torch.float32, False, seed=9)
    x.requires_grad_()
    for reduction in ("batchmean", "none"):
        torch.library.opcheck(kl_div_fwd_op.custom_op, (x, t, reduction, False, 1e-10))
    torch.library.opcheck(kl_div_bwd_op.custom_op, (torch.tensor(0.5), t, "mean", False))
    torch.library.opcheck(kl_div_bwd_op.custom_op, (torch.randn(3, 40), t, "none", True))


def test_kl_div_bad_inputs():
    x, t = torch.randn(4, 8), torch.rand(4, 8)
    with pytest.raises(ValueError, match="reduction must be one of"):
        kl_div(x, t, reduction="avg")
    with pytest.raises(ValueError, match="one shape"):
        kl_div(x, torch.rand(4, 9))
    with pytest.raises(TypeError, match="one dtype"):
        kl_div(x, t.bfloat16())
    with pytest.raises(TypeError, match="target must be float32"):
        kl_div(x, t.to(torch.int32))
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        kl_div([1.0], t)
    with pytest.raises(ValueError, match="one device"):
        kl_div(x, torch.rand(4, 8, device="meta"))
    with pytest.raises(ValueError, match="at least one dimension"):
        kl_div(torch.tensor(1.0), torch.tensor(0.5))
    with pytest.raises(ValueError, match="reduction must be one of"):
        LigerKLDIVLoss(reduction="avg")
