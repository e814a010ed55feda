import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import assert_compile_matches_eager, check_op, ones_like, rel_err
from liger_aot.ops.jsd import jsd, jsd_bwd_op, jsd_fwd_op
from liger_aot.transformers.losses_distill import LigerJSD

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}
BETAS = [0.0, 0.3, 0.5, 1.0]


def xlogy_like(w, a):
    """w * a with 0 where the weight w is 0 (a may be -inf there)."""
    return torch.where(w == 0, torch.zeros_like(a), w * a)


def reference(x, y, beta, labels=None, ignore_index=-100):
    """Generalized JSD from its definition on log-probabilities x (student), y (teacher):
    beta KL(P||M) + (1-beta) KL(Q||M), M = beta P + (1-beta) Q; beta 0 / 1: KL(P||Q) /
    KL(Q||P). Summed over the vocab, averaged over non-ignored rows (0 if none)."""
    p, q = y.exp(), x.exp()
    if beta == 0:
        loss = xlogy_like(p, y - x)
    elif beta == 1:
        loss = xlogy_like(q, x - y)
    else:
        log_m = (beta * p + (1 - beta) * q).log()
        loss = xlogy_like(beta * p, y - log_m) + xlogy_like((1 - beta) * q, x - log_m)
    loss = loss.sum(-1).reshape(-1)
    if labels is None:
        return loss.sum() / max(loss.shape[0], 1)
    keep = labels.reshape(-1) != ignore_index
    return (loss * keep).sum() / keep.sum().clamp_min(1)


def make(shape, dtype, seed=0, spread=2.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).log_softmax(-1).to(dtype)
    y = (torch.randn(shape, generator=g) * spread).log_softmax(-1).to(dtype)
    return x, y


def check(x, y, beta, labels=None, ignore_index=-100, grad_scale=1.7):
    out, _, _ = check_op(lambda x: jsd(x, y, labels, beta, ignore_index),
                         lambda x: reference(x, y.double(), beta, labels, ignore_index),
                         (x,), TOL, grad=lambda out: torch.full_like(out, grad_scale),
                         like_input=False)
    assert out.shape == () and out.dtype == x.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("shape", [(7, 100), (5, 3001)])
def test_jsd(shape, beta, dtype):
    x, y = make(shape, dtype)
    check(x, y, beta)


@pytest.mark.parametrize("beta", BETAS)
def test_jsd_labels(beta):
    x, y = make((9, 515), torch.float32, seed=1)
    labels = torch.tensor([3, -100, 7, 7, -100, 0, 5, -100, 1])
    check(x, y, beta, labels)
    check(x, y, beta, torch.where(labels == 7, 9, labels), ignore_index=9)


def test_jsd_fp16():
    x, y = make((4, 700), torch.float16, seed=2)
    check(x, y, 0.5, torch.tensor([1, -100, 2, 3]))


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_jsd_all_ignored(beta):
    x, y = make((4, 64), torch.float32, seed=3)
    x.requires_grad_()
    out = jsd(x, y, torch.full((4,), -100), beta)
    assert out.item() == 0.0  # Liger-Kernel: 0, not nan
    out.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_jsd_3d_input_and_label_shape():
    x, y = make((2, 3, 130), torch.float32, seed=4)
    labels = torch.tensor([[1, -100, 2], [3, 4, -100]])
    check(x, y, 0.4, labels)
    check(x, y, 0.4, labels.reshape(-1))


def test_jsd_large_vocab():
    x, y = make((2, 262144), torch.float32, seed=5)
    check(x, y, 0.5, torch.tensor([-100, 4]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_jsd_noncontiguous_and_misaligned(dtype):
    x, y = make((6, 2 * 300), dtype, seed=6)
    xs = x[:, 300:]  # row stride 600, storage offset 300
    flat = torch.cat([torch.zeros(1, dtype=dtype), y[:, :300].reshape(-1)])
    ym = flat[1:].view(6, 300)
    assert not xs.is_contiguous() and ym.data_ptr() % 16 != 0
    check(xs, ym, 0.5)
    check(x.t().contiguous().t(), y, 0.0)  # column-major: last dim copied


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # interpreter: discarded lanes
def test_jsd_minus_inf_teacher():
    # masked vocab entries: teacher probability 0 (log-prob -inf) contributes 0, not nan
    x, y = make((3, 80), torch.float32, seed=7)
    y = y.clone()
    y[:, :5] = float("-inf")
    y = y.log_softmax(-1)
    for beta in (0.0, 0.3, 0.5):
        check(x, y, beta)
    assert torch.isinf(jsd(x, y, beta=1.0))  # reverse KL(Q || P) with P = 0 < Q is infinite


def test_jsd_nan_propagates():
    x, y = make((3, 40), torch.float32, seed=8)
    x[1, 2] = float("nan")
    assert torch.isnan(jsd(x, y))


@pytest.mark.parametrize("shape", [(0, 10), (3, 0)])
def test_jsd_empty(shape):
    x = torch.randn(shape, requires_grad=True)
    out = jsd(x, torch.randn(shape))
    assert out.item() == 0.0
    out.backward()
    assert x.grad.shape == x.shape


def test_jsd_module():
    x, y = make((5, 77), torch.float32, seed=9)
    labels = torch.tensor([0, -1, 2, 3, -1])
    mod = LigerJSD(beta=0.2, ignore_index=-1)
    assert rel_err(mod(x, y, labels), reference(x.double(), y.double(), 0.2, labels, -1)) < 1e-5
    assert rel_err(LigerJSD()(x, y), reference(x.double(), y.double(), 0.5)) < 1e-5
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        LigerJSD(beta=1.5)


def test_jsd_compile_matches_eager():
    x, y = make((6, 333), torch.float32, seed=10)
    labels = torch.tensor([1, 2, -100, 4, 5, 6])

    def fn(a, b, lab):
        return jsd(a, b, lab, beta=0.3) + 2 * jsd(a, b, beta=1.0)

    assert_compile_matches_eager(fn, (x,), ones_like, args=(y, labels), tol=1e-6)


def test_jsd_opcheck():
    x, y = make((3, 40), torch.float32, seed=11)
    x.requires_grad_()
    labels = torch.tensor([1, -100, 2])
    torch.library.opcheck(jsd_fwd_op.custom_op, (x, y, labels, 0.5, -100))
    torch.library.opcheck(jsd_fwd_op.custom_op, (x, y, None, 0.0, -100))
    torch.library.opcheck(jsd_bwd_op.custom_op, (torch.tensor(0.5), x.detach(), y, labels, 0.3, -100))


def test_jsd_bad_inputs():
    x, y = make((4, 8), torch.float32)
    with pytest.raises(ValueError, match="one shape"):
        jsd(x, torch.randn(4, 9))
    with pytest.raises(TypeError, match="one dtype"):
        jsd(x, y.bfloat16())
    with pytest.raises(TypeError, match="input must be float32"):
        jsd(x.to(torch.int32), y)
    with pytest.raises(ValueError, match="one device"):
        jsd(x, y.to("meta"))
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        jsd(x, y, beta=-0.1)
    with pytest.raises(TypeError, match="shift_labels must be int64"):
        jsd(x, y, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"shift_labels must have shape \(4,\)"):
        jsd(x, y, torch.zeros(5, dtype=torch.int64))
    with pytest.raises(TypeError, match="shift_labels must be a torch.Tensor"):
        jsd(x, y, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="at least one dimension"):
        jsd(torch.tensor(0.0), torch.tensor(0.0))
