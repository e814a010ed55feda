import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import pytest
import torch
import torch.nn.functional as F

from liger_aot.ops.cross_entropy import cross_entropy

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(logits, target, reduction="mean", label_smoothing=0.0, ignore_index=-100):
    """Loss and gradient against float64 PyTorch; loss must come back as float32."""
    dtype = logits.dtype
    x = logits.detach().requires_grad_()
    loss = cross_entropy(x, target, ignore_index=ignore_index, reduction=reduction,
                         label_smoothing=label_smoothing)
    assert loss.dtype == torch.float32
    x64 = logits.detach().double().requires_grad_()
    ref = F.cross_entropy(x64, target, ignore_index=ignore_index, reduction=reduction,
                          label_smoothing=label_smoothing)
    assert loss.shape == ref.shape
    # the loss is computed in fp32 from the given logits, whatever their dtype
    assert rel_err(loss, ref) < 1e-5
    g = torch.rand(ref.shape, dtype=torch.float32) + 0.5
    loss.backward(g)
    ref.backward(g.double())
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    assert rel_err(x.grad, x64.grad) < TOL[dtype]
    return loss, x.grad


def make(n_rows, vocab, dtype, seed=0, n_ignored=2, ignore_index=-100):
    torch.manual_seed(seed)
    logits = (torch.randn(n_rows, vocab) * 4).to(dtype)
    target = torch.randint(0, vocab, (n_rows,))
    target[torch.randperm(n_rows)[:n_ignored]] = ignore_index
    return logits, target


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1000, 3001])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(vocab, reduction, dtype):
    logits, target = make(6, vocab, dtype)
    check(logits, target, reduction)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_label_smoothing(reduction, dtype):
    logits, target = make(5, 3001, dtype, seed=1)
    check(logits, target, reduction, label_smoothing=0.1)


def test_cross_entropy_multi_chunk_rows():
    # vocab 9000 spans many BLOCK_V chunks and a partial last one; the row maximum sits in a
    # late chunk, so the running max and the rescaled sums must be right
    logits, target = make(3, 9000, torch.float32, seed=2, n_ignored=0)
    logits[:, 8500] += 30.0
    target[0] = 8500
    check(logits, target, "mean", label_smoothing=0.05)


def test_cross_entropy_small_vocab_and_custom_ignore_index():
    logits, target = make(7, 37, torch.float32, seed=3, ignore_index=5)
    check(logits, target, "mean", ignore_index=5)


def test_cross_entropy_all_ignored():
    logits, target = make(4, 100, torch.float32, n_ignored=4)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, target)
    ref = F.cross_entropy(logits, target)
    assert math.isnan(loss.item()) and math.isnan(ref.item())
    loss.backward()
    assert torch.count_nonzero(x.grad) == 0
    for reduction in ("sum", "none"):
        x.grad = None
        loss = cross_entropy(x, target, reduction=reduction)
        assert torch.count_nonzero(loss) == 0
        loss.sum().backward()
        assert torch.count_nonzero(x.grad) == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_strided_rows(dtype):
    # rows read in place from a wider buffer (row stride 1100 > vocab 1000)
    logits, target = make(5, 1100, dtype, seed=4)
    logits = logits[:, :1000]
    target = target.clamp(max=999).masked_fill(target < 0, -100)
    assert not logits.is_contiguous()
    check(logits, target, "mean")


def test_cross_entropy_transposed_and_strided_target():
    torch.manual_seed(5)
    logits = torch.randn(300, 6).t()  # last dim not contiguous: copied
    target = torch.randint(0, 300, (12,))[::2]
    check(logits, target, "sum")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_misaligned(dtype):
    torch.manual_seed(6)
    n_rows, vocab = 4, 1000
    logits = (torch.randn(n_rows * vocab + 1) * 3).to(dtype)[1:].view(n_rows, vocab)
    target = torch.randint(0, vocab, (n_rows + 1,))[1:]
    assert logits.data_ptr() % 16 != 0 and target.data_ptr() % 16 != 0
    check(logits, target, "mean", label_smoothing=0.1)


def test_cross_entropy_no_grad_and_retain_graph(monkeypatch):
    import liger_aot.ops.cross_entropy as module

    seen = []
    forward = module.cross_entropy_forward

    def spy(*args):
        seen.append(args[-1])
        return forward(*args)

    monkeypatch.setattr(module, "cross_entropy_forward", spy)
    logits, target = make(4, 500, torch.float32)
    with torch.no_grad():
        loss = cross_entropy(logits.requires_grad_(), target)
    assert not loss.requires_grad
    assert seen == [False]  # no gradient pass under no_grad
    assert rel_err(loss, F.cross_entropy(logits.double(), target)) < 1e-5
    x = logits.detach().requires_grad_()
    loss = cross_entropy(x, target)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    assert torch.allclose(x.grad, 2 * first)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_empty(reduction):
    x = torch.randn(0, 100, requires_grad=True)
    target = torch.zeros(0, dtype=torch.long)
    loss = cross_entropy(x, target, reduction=reduction)
    ref = F.cross_entropy(x.detach(), target, reduction=reduction)
    assert loss.shape == ref.shape
    if reduction == "mean":
        assert math.isnan(loss.item())
    else:
        assert torch.equal(loss, ref)
    loss.sum().backward()
    assert x.grad.shape == x.shape


def test_cross_entropy_bad_inputs():
    logits, target = make(4, 10, torch.float32)
    with pytest.raises(TypeError, match="target must be int64"):
        cross_entropy(logits, target.int())
    with pytest.raises(TypeError, match="logits must be float32"):
        cross_entropy(logits.long(), target)
    with pytest.raises(TypeError, match="target must be a torch.Tensor"):
        cross_entropy(logits, [1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"target must have shape \(4,\)"):
        cross_entropy(logits, target[:3])
    with pytest.raises(ValueError, match="logits must be 2-D"):
        cross_entropy(logits[None], target)
    with pytest.raises(ValueError, match="one device"):
        cross_entropy(logits, target.to("meta"))
    with pytest.raises(ValueError, match="reduction must be one of"):
        cross_entropy(logits, target, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        cross_entropy(logits, target, label_smoothing=1.5)
    with pytest.raises(ValueError, match="at least one class"):
        cross_entropy(torch.randn(4, 0), target)
