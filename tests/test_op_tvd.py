import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import assert_compile_matches_eager, check_op, ones_like, rel_err
from liger_aot.ops.tvd import tvd, tvd_bwd_op, tvd_fwd_op
from liger_aot.transformers.losses_distill import LigerTVDLoss

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}
REDUCTIONS = ["batchmean", "sum", "mean", "none"]


def reference(p, q, labels=None, reduction="batchmean", ignore_index=-100):
    """0.5 |p - q| with ignored rows zeroed; batchmean / mean divide by the number of kept
    rows (times the vocab size for mean)."""
    loss = 0.5 * (p - q).abs()
    if labels is None:
        n_valid = p.shape[0]
    else:
        keep = labels != ignore_index
        loss = loss * keep[:, None]
        n_valid = keep.sum()
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / (n_valid * p.shape[1])
    return loss.sum() / n_valid


def make(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = (torch.randn(shape, generator=g) * 2).softmax(-1).to(dtype)
    q = (torch.randn(shape, generator=g) * 2).softmax(-1).to(dtype)
    return p, q


def check(p, q, labels=None, reduction="batchmean", ignore_index=-100):
    out, _, _ = check_op(lambda p: tvd(p, q, labels, reduction, ignore_index),
                         lambda p: reference(p, q.double(), labels, reduction, ignore_index),
                         (p,), TOL, like_input=False)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(7, 100), (3, 3001)])
def test_tvd(shape, reduction, dtype):
    check(*make(shape, dtype), reduction=reduction)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_tvd_labels(reduction):
    p, q = make((9, 515), torch.float32, seed=1)
    labels = torch.tensor([3, -100, 7, 7, -100, 0, 5, -100, 1])
    check(p, q, labels, reduction)
    check(p, q, torch.where(labels == 7, 9, labels), reduction, ignore_index=9)


def test_tvd_fp16():
    check(*make((4, 700), torch.float16, seed=2), torch.tensor([1, -100, 2, 3]))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_tvd_all_ignored(reduction):
    p, q = make((4, 64), torch.float32, seed=3)
    p.requires_grad_()
    out = tvd(p, q, torch.full((4,), -100), reduction)
    ref = reference(p.detach(), q, torch.full((4,), -100), reduction)
    torch.testing.assert_close(out, ref.float(), equal_nan=True)  # nan for (batch)mean
    out.sum().backward()
    assert torch.equal(p.grad, torch.zeros_like(p))  # 0, not nan


def test_tvd_ties_and_nan():
    p, q = make((3, 40), torch.float32, seed=4)
    q[0] = p[0]  # equal rows: gradient 0, as PyTorch's abs
    check(p, q, reduction="sum")
    p = p.clone()
    p[1, 5] = float("nan")
    assert torch.isnan(tvd(p, q, reduction="sum"))


def test_tvd_large_vocab():
    check(*make((2, 262144), torch.float32, seed=5), torch.tensor([-100, 4]), "mean")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tvd_noncontiguous_and_misaligned(dtype):
    p, q = make((6, 2 * 300), dtype, seed=6)
    ps = p[:, 300:]  # row stride 600
    flat = torch.cat([torch.zeros(1, dtype=dtype), q[:, :300].reshape(-1)])
    qm = flat[1:].view(6, 300)
    assert not ps.is_contiguous() and qm.data_ptr() % 16 != 0
    check(ps, qm, reduction="batchmean")
    check(ps, qm, reduction="none")
    check(p.t().contiguous().t(), q, reduction="mean")  # column-major: last dim copied


def test_tvd_none_sum_backward_expanded_grad():
    p, q = make((5, 130), torch.float32, seed=7)
    p.requires_grad_()
    labels = torch.tensor([0, -100, 1, 2, 3])
    tvd(p, q, labels, "none").sum().backward()  # grad_output has stride 0
    p64 = p.detach().double().requires_grad_()
    reference(p64, q.double(), labels, "none").sum().backward()
    assert rel_err(p.grad, p64.grad) < 1e-5


@pytest.mark.parametrize("shape", [(0, 10), (3, 0)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_tvd_empty(shape, reduction):
    p = torch.rand(shape, requires_grad=True)
    q = torch.rand(shape)
    out = tvd(p, q, reduction=reduction)
    ref = reference(p.detach(), q, None, reduction)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, equal_nan=True)
    out.sum().backward()
    assert p.grad.shape == p.shape


def test_tvd_module():
    p, q = make((5, 77), torch.float32, seed=8)
    labels = torch.tensor([0, -1, 2, 3, -1])
    assert LigerTVDLoss().reduction == "batchmean"
    assert rel_err(LigerTVDLoss()(p, q), reference(p, q)) < 1e-5
    mod = LigerTVDLoss(reduction="sum", ignore_index=-1)
    assert rel_err(mod(p, q, labels), reference(p, q, labels, "sum", -1)) < 1e-5
    with pytest.raises(ValueError, match="reduction must be one of"):
        LigerTVDLoss(reduction="avg")


def test_tvd_functional_default_is_mean():
    p, q = make((5, 77), torch.float32, seed=9)
    assert rel_err(tvd(p, q), reference(p, q, reduction="mean")) < 1e-5


def test_tvd_compile_matches_eager():
    p, q = make((6, 333), torch.float32, seed=10)
    labels = torch.tensor([1, 2, -100, 4, 5, 6])

    def fn(a, b, lab):
        return tvd(a, b, lab, "batchmean") + tvd(a, b, None, "none").sum() * 0.5

    assert_compile_matches_eager(fn, (p,), ones_like, args=(q, labels), tol=1e-6)


def test_tvd_opcheck():
    p, q = make((3, 40), torch.float32, seed=11)
    p.requires_grad_()
    labels = torch.tensor([1, -100, 2])
    torch.library.opcheck(tvd_fwd_op.custom_op, (p, q, labels, "batchmean", -100))
    torch.library.opcheck(tvd_fwd_op.custom_op, (p, q, None, "none", -100))
    torch.library.opcheck(tvd_bwd_op.custom_op, (torch.tensor(0.5), p.detach(), q, labels, "mean", -100))
    torch.library.opcheck(tvd_bwd_op.custom_op, (torch.randn(3, 40), p.detach(), q, None, "none", -100))


def test_tvd_bad_inputs():
    p, q = make((4, 8), torch.float32)
    with pytest.raises(ValueError, match="reduction must be one of"):
        tvd(p, q, reduction="avg")
    with pytest.raises(ValueError, match="one shape"):
        tvd(p, torch.rand(4, 9))
    with pytest.raises(TypeError, match="one dtype"):
        tvd(p, q.half())
    with pytest.raises(TypeError, match="target must be float32"):
        tvd(p, q.to(torch.int64))
    with pytest.raises(ValueError, match="one device"):
        tvd(p, q.to("meta"))
    with pytest.raises(ValueError, match=r"must be 2-D \(BT, V\)"):
        tvd(p[None], q[None])
    with pytest.raises(TypeError, match="shift_labels must be int64"):
        tvd(p, q, torch.zeros(4))
    with pytest.raises(ValueError, match=r"shift_labels must have shape \(4,\)"):
        tvd(p, q, torch.zeros(2, 2, dtype=torch.int64))
