import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import pytest
import torch
import torch.nn.functional as F

import liger_aot.ops.cross_entropy as ce_module
from liger_aot.kernel_src.cross_entropy import spec as ce_spec
from liger_aot.ops.cross_entropy import (CrossEntropyOutput, cross_entropy,
                                         cross_entropy_fwd_op, liger_cross_entropy)
from liger_aot.transformers.losses_ce import LigerCrossEntropyLoss

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def reference(x, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
              lse_square_scale=0.0, softcap=None):
    """Float64 reference: F.cross_entropy on the soft-capped logits plus Liger's z-loss
    (unweighted; "mean" divides it by the non-ignored count). Returns (loss, z_loss)."""
    x = x.double()
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    loss = F.cross_entropy(x, target, weight=None if weight is None else weight.double(),
                           ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    valid = target != ignore_index
    z_rows = lse_square_scale * torch.logsumexp(x, -1) ** 2 * valid
    if reduction == "none":
        z = z_rows
    elif reduction == "sum":
        z = z_rows.sum()
    else:
        z = z_rows.sum() / valid.sum()
    return loss + z, z


def check(logits, target, reduction="mean", label_smoothing=0.0, ignore_index=-100,
          weight=None, lse_square_scale=0.0, softcap=None, fn=cross_entropy):
    """Loss and gradient against float64 PyTorch; loss must come back as float32."""
    dtype = logits.dtype
    x = logits.detach().requires_grad_()
    loss = fn(x, target, ignore_index=ignore_index, reduction=reduction,
              label_smoothing=label_smoothing, weight=weight,
              lse_square_scale=lse_square_scale, softcap=softcap)
    assert loss.dtype == torch.float32
    x64 = logits.detach().double().requires_grad_()
    ref, _ = reference(x64, target, weight, ignore_index, reduction, label_smoothing,
                       lse_square_scale, softcap)
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


def class_weight(vocab, seed=0):
    torch.manual_seed(seed + 100)
    return torch.rand(vocab) + 0.25


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


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_class_weights(reduction, label_smoothing):
    # weighted mean divides by the sum of the weights of the non-ignored targets (PyTorch)
    logits, target = make(7, 777, torch.float32, seed=2)
    check(logits, target, reduction, label_smoothing, weight=class_weight(777))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_z_loss(reduction):
    logits, target = make(6, 1000, torch.float32, seed=3)
    check(logits, target, reduction, lse_square_scale=1e-2)
    x = logits.clone().requires_grad_()
    loss, z = cross_entropy(x, target, reduction=reduction, lse_square_scale=1e-2,
                            return_z_loss=True)
    ref_loss, ref_z = reference(logits, target, reduction=reduction, lse_square_scale=1e-2)
    assert rel_err(loss, ref_loss) < 1e-5 and rel_err(z, ref_z) < 1e-5
    assert loss.requires_grad and not z.requires_grad  # z-loss is for logging


def test_cross_entropy_return_z_loss_without_scale():
    logits, target = make(4, 100, torch.float32)
    loss, z = cross_entropy(logits, target, return_z_loss=True)
    assert torch.equal(z, torch.zeros(()))
    assert rel_err(loss, F.cross_entropy(logits.double(), target)) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_softcap(reduction, dtype):
    logits, target = make(5, 3001, dtype, seed=4)
    logits[0, :7] = torch.tensor([0.0, 1e-3, -2e-2, 0.1, -0.3, 60.0, -200.0]).to(dtype)
    check(logits, target, reduction, softcap=5.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_every_option(reduction, dtype):
    logits, target = make(6, 2500, dtype, seed=5, ignore_index=7)
    check(logits, target, reduction, label_smoothing=0.1, ignore_index=7,
          weight=class_weight(2500, 1), lse_square_scale=1e-3, softcap=8.0)


def test_cross_entropy_multi_chunk_rows():
    # vocab 9000 spans many BLOCK_V chunks and a partial last one; the row maximum sits in a
    # late chunk, so the running max and the rescaled sums must be right
    logits, target = make(3, 9000, torch.float32, seed=2, n_ignored=0)
    logits[:, 8500] += 30.0
    target[0] = 8500
    check(logits, target, "mean", label_smoothing=0.05)


def test_cross_entropy_one_warp_config_multi_chunk(monkeypatch):
    # few rows and gradients pick the wide config; force the one-warp one on a long row
    monkeypatch.setattr(ce_spec, "select_config", lambda *args, **kwargs: ce_spec.ROW_CONFIG)
    logits, target = make(3, 5000, torch.bfloat16, seed=6, n_ignored=1)
    check(logits, target, "mean", label_smoothing=0.1, weight=class_weight(5000),
          softcap=10.0, lse_square_scale=1e-3)


def test_cross_entropy_rule():
    sms = 132
    # loss only: one warp per row when rows are plenty, four warps when they are few
    assert ce_spec.select_config(8192, 128256, sms) is ce_spec.ROW_CONFIG
    assert ce_spec.select_config(1024, 128256, sms) is ce_spec.WIDE_CONFIG
    # with the gradient: four warps for long rows, one warp for short ones
    assert ce_spec.select_config(8192, 128256, sms, grad=True) is ce_spec.WIDE_CONFIG
    assert ce_spec.select_config(8192, 1000, sms, grad=True) is ce_spec.ROW_CONFIG


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("value", [1.0, 2.5])
def test_scale_grad_skips_only_in_place_ones(in_place, value):
    # 40 x 5000 spans more tiles than programs (4 per SM x 4 "SMs" in the interpreter x
    # 4096 per tile), so programs stride; in place with grad_output 1 must leave it as is
    torch.manual_seed(0)
    grad = torch.randn(40, 5000).to(torch.bfloat16)
    keep = grad.clone()
    out = ce_module.scale_grad(grad, torch.tensor(value), per_row=False, in_place=in_place)
    assert (out.data_ptr() == grad.data_ptr()) == in_place
    # one bf16 rounding (the interpreter's fp32 -> bf16 conversion truncates)
    close = dict(rtol=2 ** -7, atol=0.0)
    assert torch.allclose(out.float(), keep.float() * value, **close)
    if value == 1.0:
        assert torch.equal(out, keep)
    if not in_place:
        assert torch.equal(grad, keep)
    rows = torch.rand(40) + 0.5  # per row: never skipped, even where a row's value is 1
    rows[0] = 1.0
    out = ce_module.scale_grad(keep.clone(), rows, per_row=True, in_place=in_place)
    assert torch.allclose(out.float(), keep.float() * rows[:, None], **close)
    assert not torch.allclose(out.float(), keep.float(), **close)


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
    x.grad = None
    loss = cross_entropy(x, target, weight=class_weight(100), label_smoothing=0.1,
                         lse_square_scale=0.1)
    assert math.isnan(loss.item())
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
    check(logits, target, "mean", weight=class_weight(300), softcap=3.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_misaligned(dtype):
    torch.manual_seed(6)
    n_rows, vocab = 4, 1000
    logits = (torch.randn(n_rows * vocab + 1) * 3).to(dtype)[1:].view(n_rows, vocab)
    target = torch.randint(0, vocab, (n_rows + 1,))[1:]
    assert logits.data_ptr() % 16 != 0 and target.data_ptr() % 16 != 0
    check(logits, target, "mean", label_smoothing=0.1)
    weight = torch.rand(vocab + 1)[1:] + 0.5
    check(logits, target, "mean", label_smoothing=0.1, weight=weight)


def test_cross_entropy_no_grad_and_retain_graph(monkeypatch):
    seen = []
    forward = ce_module.cross_entropy_forward

    def spy(*args):
        seen.append(args[10])  # need_grad
        return forward(*args)

    monkeypatch.setattr(ce_module, "cross_entropy_forward", spy)
    logits, target = make(4, 500, torch.float32)
    with torch.no_grad():
        loss = cross_entropy(logits.requires_grad_(), target)
    assert not loss.requires_grad
    assert seen == [False]  # no gradient pass under no_grad
    assert rel_err(loss, F.cross_entropy(logits.double(), target)) < 1e-5
    x = logits.detach().requires_grad_()
    loss = cross_entropy(x, target)
    loss.backward(retain_graph=True)  # the stored gradient must survive this one
    first = x.grad.clone()
    loss.backward(torch.tensor(3.0))
    assert torch.allclose(x.grad, 4 * first)


def test_cross_entropy_backward_scales_in_place_without_retain():
    logits, target = make(4, 300, torch.float32)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, target, reduction="none")
    g = torch.rand(4) + 0.5
    loss.backward(g)
    x64 = logits.double().requires_grad_()
    F.cross_entropy(x64, target, reduction="none").backward(g.double())
    assert rel_err(x.grad, x64.grad) < 1e-5


def test_cross_entropy_in_place():
    logits, target = make(5, 400, torch.float32, seed=7)
    w = torch.randn(400, 400) / 20
    h = logits @ torch.linalg.inv(w)  # logits = h @ w, a non-leaf whose values mm won't need
    h.requires_grad_()
    ref_h = h.detach().clone().requires_grad_()
    F.cross_entropy((ref_h @ w).double(), target, label_smoothing=0.1).backward()
    y = h @ w
    ref_loss = F.cross_entropy(y.detach().double(), target, label_smoothing=0.1)
    loss = cross_entropy(y, target, label_smoothing=0.1, in_place=True)
    assert rel_err(loss, ref_loss) < 1e-5  # every logit is read before it is overwritten
    loss.backward()
    assert rel_err(h.grad, ref_h.grad) < 1e-5
    # the logits buffer now holds d loss / d logits
    y64 = (ref_h.detach() @ w).double().requires_grad_()
    F.cross_entropy(y64, target, label_smoothing=0.1).backward()
    assert rel_err(y.detach(), y64.grad) < 1e-5


def test_cross_entropy_in_place_ignored_for_leaf():
    logits, target = make(4, 300, torch.float32)
    x = logits.clone().requires_grad_()
    cross_entropy(x, target, in_place=True).backward()
    assert torch.equal(x.detach(), logits)  # a leaf (the caller's data) is never overwritten


def test_cross_entropy_in_place_detects_saved_logits():
    # exp saves its output for backward: overwriting it would give a wrong gradient, so the
    # kernel bumps the version counter and autograd refuses
    logits, target = make(4, 300, torch.float32)
    h = (logits / 8).requires_grad_()
    y = h.exp()
    loss = cross_entropy(y, target, in_place=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_token_accuracy(reduction):
    logits, target = make(9, 700, torch.float32, seed=8, n_ignored=2)
    argmax = logits.argmax(-1)
    valid = target != -100
    target[valid.nonzero()[:3, 0]] = argmax[valid][:3]  # some hits
    logits[0, 650] = logits[0].max()  # a tie: torch.argmax takes the first index
    target[0] = 650
    logits[1, 0] = logits[1].max()  # a tie won by the target
    target[1] = 0
    valid = target != -100
    assert 0 < ((logits.argmax(-1) == target) & valid).sum() < valid.sum()
    out = cross_entropy(logits, target, reduction=reduction, return_token_accuracy=True,
                        lse_square_scale=1e-3)
    assert isinstance(out, CrossEntropyOutput)
    hits = ((logits.argmax(-1) == target) & valid).float()
    ref_acc = hits if reduction == "none" else hits.sum() / valid.sum()
    assert torch.allclose(out.token_accuracy, ref_acc)
    ref_loss, ref_z = reference(logits, target, reduction=reduction, lse_square_scale=1e-3)
    assert rel_err(out.loss, ref_loss) < 1e-5
    assert out.z_loss is None
    out = cross_entropy(logits, target, reduction=reduction, return_token_accuracy=True,
                        return_z_loss=True, lse_square_scale=1e-3, softcap=4.0)
    capped = 4.0 * torch.tanh(logits.double() / 4.0)
    hits = ((capped.argmax(-1) == target) & valid).float()
    ref_acc = hits if reduction == "none" else hits.sum() / valid.sum()
    assert torch.allclose(out.token_accuracy, ref_acc.float())
    assert rel_err(out.z_loss, reference(logits, target, reduction=reduction,
                                         lse_square_scale=1e-3, softcap=4.0)[1]) < 1e-5


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
    out = cross_entropy(x, target, reduction=reduction, weight=torch.ones(100),
                        lse_square_scale=0.1, return_token_accuracy=True, return_z_loss=True)
    assert out.loss.shape == ref.shape and out.z_loss.shape == ref.shape


def test_liger_cross_entropy_signature():
    logits, target = make(6, 500, torch.float32, seed=9)
    weight = class_weight(500)
    x = logits.clone().requires_grad_()
    # Liger-Kernel's positional order: input, target, weight, size_average, ignore_index, ...
    loss = liger_cross_entropy(x, target, weight, None, -100, None, "sum", 0.1, 1e-3, 6.0)
    ref, _ = reference(logits, target, weight, -100, "sum", 0.1, 1e-3, 6.0)
    assert rel_err(loss, ref) < 1e-5
    loss, z = liger_cross_entropy(logits, target, return_z_loss=True, lse_square_scale=1e-2)
    assert rel_err(z, reference(logits, target, lse_square_scale=1e-2)[1]) < 1e-5
    with pytest.warns(UserWarning):  # PyTorch's deprecated size_average/reduce
        loss = liger_cross_entropy(logits, target, size_average=False)
    assert rel_err(loss, F.cross_entropy(logits.double(), target, reduction="sum")) < 1e-5


def test_liger_cross_entropy_loss_module():
    logits, target = make(6, 500, torch.float32, seed=10, ignore_index=3)
    weight = class_weight(500)
    module = LigerCrossEntropyLoss(weight=weight, ignore_index=3, lse_square_scale=1e-3,
                                   label_smoothing=0.1, reduction="mean", softcap=7.0)
    assert "weight" not in module.state_dict()
    x = logits.clone().requires_grad_()
    loss = module(x, target)
    x64 = logits.double().requires_grad_()
    ref, _ = reference(x64, target, weight, 3, "mean", 0.1, 1e-3, 7.0)
    assert rel_err(loss, ref) < 1e-5
    loss.backward()
    ref.backward()
    assert rel_err(x.grad, x64.grad) < 1e-5
    assert rel_err(LigerCrossEntropyLoss()(logits, target.clamp(min=0)),
                   F.cross_entropy(logits.double(), target.clamp(min=0))) < 1e-5
    loss, z = LigerCrossEntropyLoss(return_z_loss=True, lse_square_scale=1e-2)(logits, target)
    assert isinstance(LigerCrossEntropyLoss(return_token_accuracy=True)(logits, target),
                      CrossEntropyOutput)
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        LigerCrossEntropyLoss(label_smoothing=-0.1)
    with pytest.raises(ValueError, match="reduction must be one of"):
        LigerCrossEntropyLoss(reduction="batchmean")
    with pytest.raises(ValueError, match="softcap must be None or"):
        LigerCrossEntropyLoss(softcap=0.0)


def test_cross_entropy_compile_matches_eager():
    logits, target = make(5, 600, torch.float32, seed=11)
    weight = class_weight(600)

    def fn(x, t, w):
        out = cross_entropy(x, t, weight=w, label_smoothing=0.1, lse_square_scale=1e-3,
                            softcap=5.0, return_token_accuracy=True, return_z_loss=True)
        loss_none = cross_entropy(x * 2, t, reduction="none")
        return out.loss + 0.01 * loss_none.sum(), out.z_loss, out.token_accuracy

    x_e = logits.clone().requires_grad_()
    x_c = logits.clone().requires_grad_()
    eager = fn(x_e, target, weight)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(x_c, target, weight)
    for a, b in zip(eager, compiled):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    eager[0].backward()
    compiled[0].backward()
    assert torch.allclose(x_e.grad, x_c.grad, rtol=1e-6, atol=1e-9)


def test_cross_entropy_opcheck():
    logits, target = make(4, 50, torch.float32, seed=12)
    x = logits.requires_grad_()
    weight = class_weight(50)
    torch.library.opcheck(cross_entropy_fwd_op.custom_op,
                          (x, target, None, -100, "mean", 0.0, 0.0, 0.0, False, False, True))
    torch.library.opcheck(cross_entropy_fwd_op.custom_op,
                          (x, target, weight, -100, "none", 0.1, 1e-2, 4.0, True, True, True))
    torch.library.opcheck(cross_entropy_fwd_op.custom_op,
                          (x.detach(), target, None, 3, "sum", 0.0, 0.0, 0.0, True, False,
                           False))


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
    with pytest.raises(ValueError, match=r"weight must have shape \(10,\)"):
        cross_entropy(logits, target, weight=torch.ones(9))
    with pytest.raises(TypeError, match="weight must be a floating point tensor"):
        cross_entropy(logits, target, weight=torch.ones(10, dtype=torch.long))
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        cross_entropy(logits, target, weight=[1.0] * 10)
    with pytest.raises(ValueError, match="one device"):
        cross_entropy(logits, target, weight=torch.ones(10, device="meta"))
    with pytest.raises(ValueError, match="softcap must be None or a finite number > 0"):
        cross_entropy(logits, target, softcap=-1.0)
    with pytest.raises(ValueError, match="lse_square_scale must be finite"):
        cross_entropy(logits, target, lse_square_scale=float("nan"))
    with pytest.raises(TypeError, match="return_z_loss must be a bool"):
        cross_entropy(logits, target, return_z_loss=1)
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        cross_entropy(logits, target, ignore_index=1.5)


# --- GPU (pytest -m gpu): 64-bit offsets at full size --------------------------------------

@pytest.mark.gpu
def test_cross_entropy_64bit_offsets_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    n_rows, vocab = 16384, 262144  # 2^32 logits: row * V overflows int32
    torch.manual_seed(0)
    logits = torch.empty(n_rows, vocab, dtype=torch.bfloat16, device="cuda")
    logits.normal_(0, 2)
    target = torch.randint(0, vocab, (n_rows,), device="cuda")
    target[::7] = -100
    rows = torch.tensor([0, 1, 8191, 8192, 16382, 16383], device="cuda")
    sample = logits[rows].double()
    y = logits.clone().requires_grad_()
    z = y * 1  # a non-leaf: the gradient goes into its buffer
    loss = cross_entropy(z, target, reduction="sum", label_smoothing=0.1, in_place=True)
    loss.backward()
    s = sample.requires_grad_()
    F.cross_entropy(s, target[rows], reduction="sum", label_smoothing=0.1).backward()
    assert rel_err(y.grad[rows], s.grad) < 2e-2
    per_row = cross_entropy(logits, target, reduction="none")
    ref = F.cross_entropy(sample, target[rows], reduction="none", label_smoothing=0.0)
    assert rel_err(per_row[rows], ref) < 1e-5


# -- the one-program kernels around the row kernel (reduction_scales, reduce_loss_rows) ----

def _targets(n_rows, n_classes, seed):
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, n_classes, (n_rows,), generator=g)
    target[::5] = -100  # ignored
    if n_rows > 3:
        target[3] = n_classes + 7  # out of range: the weighted gather clamps it
    return target


@pytest.mark.parametrize("n_rows", [0, 1, 37, 4096, 9001])
@pytest.mark.parametrize("weighted", [False, True])
def test_reduction_scales_kernel_matches_torch(n_rows, weighted):
    # 9001 rows: three blocks of the 4096-row loop, the last partial
    n_classes = 5000 if weighted else 11  # 5000 classes: the weight sum loops too
    target = _targets(n_rows, n_classes, seed=n_rows)
    weight = torch.rand(n_classes, generator=torch.Generator().manual_seed(1)) \
        if weighted else None
    got = ce_module.reduction_scales(target, -100, weight)
    want = ce_module._reduction_scales_torch(target, -100, weight)
    assert got.shape == (3,) and got.dtype == torch.float32
    if n_rows == 0:
        assert torch.isinf(got[:2]).all()  # a mean over nothing comes out nan, as in torch
        torch.testing.assert_close(got[2], want[2])
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        n_valid = (target != -100).sum(dtype=torch.float32)
        assert got[1] == n_valid.reciprocal()  # rounded as torch rounds it, not approximated


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("with_z,with_acc", [(False, False), (True, False), (True, True),
                                             (False, True)])
@pytest.mark.parametrize("n_rows", [1, 4097, 9001])
def test_reduce_rows_kernel_matches_torch(reduction, with_z, with_acc, n_rows):
    g = torch.Generator().manual_seed(n_rows)
    loss_rows = torch.rand(n_rows, generator=g) * 10
    z_rows = torch.rand(n_rows, generator=g) if with_z else None
    acc_rows = (torch.rand(n_rows, generator=g) > 0.5).float() if with_acc else None
    scales = torch.tensor([1 / 3000, 1 / 2900, 0.0]) if reduction == "mean" or with_acc \
        else None
    got = ce_module.reduce_rows(loss_rows, z_rows, acc_rows, reduction, scales)
    want = ce_module._reduce_rows_torch(loss_rows, z_rows, acc_rows, reduction, scales)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == () and a.dtype == torch.float32
            torch.testing.assert_close(a, b, rtol=1e-5, atol=0)


def test_long_batches_keep_torch_reductions(monkeypatch):
    # past spec.SMALL_MAX_ROWS rows one program would be slow: torch's reductions run instead
    monkeypatch.setattr(ce_spec, "SMALL_MAX_ROWS", 8)

    def refuse(*args, **kwargs):
        raise AssertionError("one-program kernel launched past SMALL_MAX_ROWS")

    monkeypatch.setattr(ce_module._reduction_scales, "launch", refuse)
    monkeypatch.setattr(ce_module._reduce_rows, "launch", refuse)
    x = torch.randn(9, 13, requires_grad=True)
    target = _targets(9, 13, seed=2)
    target[3] = 4
    for reduction in ("mean", "sum"):
        loss = cross_entropy(x, target, reduction=reduction)
        torch.testing.assert_close(loss.double(), reference(x.detach(), target,
                                                            reduction=reduction)[0])
