import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import pytest
import torch
import torch.nn.functional as F

import liger_aot.ops.fused_linear_cross_entropy as flce_module
from liger_aot.ops.cross_entropy import CrossEntropyOutput
from liger_aot.ops.fused_linear_cross_entropy import (chunk_rows, fused_linear_cross_entropy,
                                                      fused_linear_cross_entropy_bwd_op,
                                                      fused_linear_cross_entropy_fwd_op,
                                                      liger_fused_linear_cross_entropy)
from liger_aot.transformers.losses_ce import LigerFusedLinearCrossEntropyLoss

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def reference(x, weight, target, bias=None, ce_weight=None, ignore_index=-100,
              lse_square_scale=0.0, label_smoothing=0.0, reduction="mean", softcap=None,
              token_scaling=False):
    """Float64: logits = x @ W^T + b, F.cross_entropy plus Liger's z-loss and token scaling.
    Returns (loss, z_loss)."""
    logits = x.double() @ weight.double().t()
    if bias is not None:
        logits = logits + bias.double()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    cw = None if ce_weight is None else ce_weight.double()
    rows = F.cross_entropy(logits, target, weight=cw, ignore_index=ignore_index,
                           reduction="none", label_smoothing=label_smoothing)
    valid = target != ignore_index
    lse = torch.logsumexp(logits, -1)
    z_rows = lse_square_scale * lse * lse * valid
    if token_scaling:
        p = torch.exp(logits.gather(1, target.clamp(min=0)[:, None])[:, 0] - lse).detach()
        rows, z_rows = rows * p * valid, z_rows * p
    if reduction == "none":
        return rows + z_rows, z_rows
    if reduction == "sum":
        return rows.sum() + z_rows.sum(), z_rows.sum()
    denom = valid.sum() if cw is None else (cw[target.clamp(min=0)] * valid).sum()
    return rows.sum() / denom + z_rows.sum() / valid.sum(), z_rows.sum() / valid.sum()


def make(n_rows, hidden, vocab, dtype, seed=0, bias=False, n_ignored=2, ignore_index=-100):
    torch.manual_seed(seed)
    x = torch.randn(n_rows, hidden).to(dtype)
    w = (torch.randn(vocab, hidden) / hidden ** 0.5 * 3).to(dtype)
    b = torch.randn(vocab).to(dtype) if bias else None
    target = torch.randint(0, vocab, (n_rows,))
    target[torch.randperm(n_rows)[:n_ignored]] = ignore_index
    return x, w, target, b


def check(x, w, target, b=None, tol=None, grads=(True, True, True), **options):
    """Loss and gradients of input, weight and bias against float64 PyTorch."""
    dtype = x.dtype
    tol = tol or TOL[dtype]
    ts = options.pop("use_token_scaling", False)
    xs = [x.detach().requires_grad_(grads[0]), w.detach().requires_grad_(grads[1]),
          None if b is None else b.detach().requires_grad_(grads[2])]
    loss = fused_linear_cross_entropy(xs[0], xs[1], target, xs[2], use_token_scaling=ts,
                                      **options)
    assert loss.dtype == torch.float32
    rs = [t.detach().double().requires_grad_(t.requires_grad) if t is not None else None
          for t in xs]
    ref_opts = {k: v for k, v in options.items() if k not in ("chunk_size", "accum_dtype")}
    ref, _ = reference(rs[0], rs[1], target, rs[2], token_scaling=ts, **ref_opts)
    assert loss.shape == ref.shape
    assert rel_err(loss, ref) < (1e-5 if dtype == torch.float32 else 5e-3)
    g = torch.rand(ref.shape) + 0.5
    loss.backward(g)
    ref.backward(g.double())
    for name, ours, theirs in zip(("input", "weight", "bias"), xs, rs):
        if ours is None or not ours.requires_grad:
            continue
        assert ours.grad.dtype == dtype and ours.grad.shape == ours.shape, name
        assert rel_err(ours.grad, theirs.grad) < tol, name
    return loss, xs


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_flce(reduction, bias):
    # 13 tokens in chunks of 4: three full chunks and a partial one
    x, w, target, b = make(13, 24, 70, torch.float32, bias=bias)
    check(x, w, target, b, reduction=reduction, chunk_size=4)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_flce_every_option(reduction):
    x, w, target, b = make(11, 16, 90, torch.float32, seed=1, bias=True, ignore_index=5)
    ce_weight = torch.rand(90) + 0.25
    check(x, w, target, b, reduction=reduction, chunk_size=3, ce_weight=ce_weight,
          ignore_index=5, lse_square_scale=1e-2, label_smoothing=0.1, softcap=3.0)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_flce_token_scaling(reduction):
    x, w, target, b = make(9, 16, 60, torch.float32, seed=2, bias=True)
    check(x, w, target, b, reduction=reduction, chunk_size=4, use_token_scaling=True,
          lse_square_scale=1e-2, label_smoothing=0.05)


@pytest.mark.parametrize("accum_dtype", [None, torch.float32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flce_half(dtype, accum_dtype):
    x, w, target, b = make(20, 32, 100, dtype, seed=3, bias=True)
    check(x, w, target, b, reduction="mean", chunk_size=6, accum_dtype=accum_dtype,
          label_smoothing=0.1)


def test_flce_bf16_every_option_none():
    x, w, target, b = make(10, 32, 80, torch.bfloat16, seed=4, bias=True)
    check(x, w, target, b, reduction="none", chunk_size=4, accum_dtype=torch.float32,
          ce_weight=torch.rand(80) + 0.5, lse_square_scale=1e-3, softcap=5.0)


def test_flce_accum_fp32_without_out_dtype(monkeypatch):
    # the fallback that accumulates a product temporary (what non-CUDA devices use)
    monkeypatch.setattr(flce_module, "_mm_out_dtype_works", {"cpu": False})
    x, w, target, b = make(12, 16, 40, torch.bfloat16, seed=5, bias=True)
    check(x, w, target, b, chunk_size=5, accum_dtype=torch.float32)


def test_flce_three_dim_input():
    x, w, target, b = make(12, 16, 50, torch.float32, seed=6, bias=True)
    x3, t2 = x.view(3, 4, 16), target.view(3, 4)
    xs = x3.clone().requires_grad_()
    loss = fused_linear_cross_entropy(xs, w, t2, b, reduction="none", chunk_size=5)
    assert loss.shape == (3, 4)
    ref, _ = reference(x, w, target, b, reduction="none")
    assert rel_err(loss.reshape(-1), ref) < 1e-5
    loss.sum().backward()
    x64 = x.double().requires_grad_()
    reference(x64, w, target, b, reduction="none")[0].sum().backward()
    assert xs.grad.shape == (3, 4, 16) and rel_err(xs.grad.reshape(12, 16), x64.grad) < 1e-5


def test_flce_noncontiguous_and_misaligned():
    torch.manual_seed(7)
    x = torch.randn(16, 10).t()  # (10, 16), last dim strided
    w = torch.randn(40 * 16 + 1)[1:].view(40, 16)  # misaligned storage
    b = torch.randn(41)[1:]
    target = torch.randint(0, 40, (11,))[1:]
    assert not x.is_contiguous() and w.data_ptr() % 16 != 0
    check(x, w, target, b, chunk_size=3, label_smoothing=0.1)


def test_flce_partial_requires_grad_and_no_grad(monkeypatch):
    x, w, target, b = make(9, 16, 30, torch.float32, seed=8, bias=True)
    check(x, w, target, b, grads=(False, True, False), chunk_size=4)
    check(x, w, target, b, grads=(True, False, False), chunk_size=4, reduction="none")
    calls = []
    original = flce_module._chunk_grads
    monkeypatch.setattr(flce_module, "_chunk_grads",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    with torch.no_grad():
        loss = fused_linear_cross_entropy(x.requires_grad_(), w, target, b)
    assert not loss.requires_grad and not calls  # forward only: no gradient GEMMs
    assert rel_err(loss, reference(x, w, target, b)[0]) < 1e-5


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_flce_retain_graph(reduction):
    x, w, target, b = make(8, 16, 30, torch.float32, seed=9, bias=True)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss = fused_linear_cross_entropy(xs, ws, target, b, reduction=reduction, chunk_size=3)
    loss.sum().backward(retain_graph=True)  # the stored gradients must survive this one
    first = xs.grad.clone(), ws.grad.clone()
    loss.sum().backward()
    assert torch.allclose(xs.grad, 2 * first[0]) and torch.allclose(ws.grad, 2 * first[1])


def test_flce_autocast_fp32_master_weights():
    # bf16 activations, fp32 weight and bias under autocast: computed in bf16 like F.linear,
    # gradients come back in the parameters' dtypes
    x, w, target, b = make(10, 16, 40, torch.float32, seed=17, bias=True)
    xs = x.bfloat16().requires_grad_()
    ws, bs = w.clone().requires_grad_(), b.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = fused_linear_cross_entropy(xs, ws, target, bs, chunk_size=4,
                                          accum_dtype=torch.float32)
    loss.backward()
    refs = [x.bfloat16().double().requires_grad_(), w.bfloat16().double().requires_grad_(),
            b.bfloat16().double().requires_grad_()]
    ref, _ = reference(*refs[:2], target, refs[2])
    ref.backward()
    assert rel_err(loss, ref) < 5e-3
    assert ws.grad.dtype == torch.float32 and bs.grad.dtype == torch.float32
    assert xs.grad.dtype == torch.bfloat16
    for ours, theirs in zip((xs, ws, bs), refs):
        assert rel_err(ours.grad, theirs.grad) < 2e-2


def test_flce_chunk_rows(monkeypatch):
    assert chunk_rows(10, 100, 2, 4) == 4
    assert chunk_rows(3, 100, 2, 4) == 3
    assert chunk_rows(100000, 262144, 2) == 2048  # 1 GiB of bf16 logits
    assert chunk_rows(8192, 128256, 2) == 4096  # two balanced chunks, not 4186 + 4006
    assert chunk_rows(100000, 128256, 2) == 4176  # 24 chunks, rounded to 16 within 1 GiB
    assert chunk_rows(4000, 128256, 2) == 4000  # one chunk
    assert chunk_rows(7, 262144, 2) == 7
    for n_rows, n_cols in ((100000, 128256), (5000, 151936), (12345, 256000)):
        rows = chunk_rows(n_rows, n_cols, 2)
        assert rows * n_cols * 2 <= flce_module.CHUNK_BYTES and rows % 16 == 0
    # the automatic size, forced small: 8 rows of 50 fp32 logits -> chunks of 2 rows
    monkeypatch.setattr(flce_module, "CHUNK_BYTES", 2 * 50 * 4)
    x, w, target, b = make(7, 8, 50, torch.float32, seed=10, bias=True)
    check(x, w, target, b, label_smoothing=0.1)


def test_flce_z_loss_and_token_accuracy():
    x, w, target, b = make(10, 16, 40, torch.float32, seed=11, bias=True)
    loss, z = fused_linear_cross_entropy(x, w, target, b, lse_square_scale=1e-2,
                                         return_z_loss=True, chunk_size=3)
    ref_loss, ref_z = reference(x, w, target, b, lse_square_scale=1e-2)
    assert rel_err(loss, ref_loss) < 1e-5 and rel_err(z, ref_z) < 1e-5
    for reduction in ("mean", "none"):
        out = fused_linear_cross_entropy(x, w, target, b, reduction=reduction, softcap=2.0,
                                         return_token_accuracy=True, chunk_size=4)
        assert isinstance(out, CrossEntropyOutput) and out.z_loss is None
        logits = x.double() @ w.double().t() + b.double()
        valid = target != -100
        hits = ((logits.argmax(-1) == target) & valid).float()
        ref_acc = hits if reduction == "none" else hits.sum() / valid.sum()
        assert torch.allclose(out.token_accuracy, ref_acc.float())


def test_flce_all_ignored_and_empty():
    x, w, target, b = make(5, 8, 20, torch.float32, seed=12, bias=True, n_ignored=5)
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    loss = fused_linear_cross_entropy(xs, ws, target, bs, chunk_size=2)
    assert math.isnan(loss.item())
    loss.backward()
    assert not xs.grad.any() and not ws.grad.any() and not bs.grad.any()
    xs = torch.randn(0, 8, requires_grad=True)
    ws = w.clone().requires_grad_()
    bs = b.clone().requires_grad_()
    empty_t = torch.zeros(0, dtype=torch.long)
    loss = fused_linear_cross_entropy(xs, ws, empty_t, bs)
    assert math.isnan(loss.item())
    loss.backward()
    assert xs.grad.shape == (0, 8) and not ws.grad.any() and not bs.grad.any()
    for reduction in ("sum", "none"):
        ws.grad = None
        loss = fused_linear_cross_entropy(xs, ws, empty_t, bs, reduction=reduction)
        assert loss.shape == ((0,) if reduction == "none" else ())
        loss.sum().backward()
        assert ws.grad is None or not ws.grad.any()


def test_liger_fused_linear_cross_entropy_loss_module():
    x, w, target, b = make(9, 16, 50, torch.float32, seed=13, bias=True)
    ce_weight = torch.rand(50) + 0.5
    module = LigerFusedLinearCrossEntropyLoss(ce_weight=ce_weight, lse_square_scale=1e-3,
                                              label_smoothing=0.1, softcap=4.0, chunk_size=4)
    assert "ce_weight" not in module.state_dict()
    ws = w.clone().requires_grad_()
    loss = module(ws, x, target, b)  # Liger's order: (lin_weight, _input, target, bias)
    w64 = w.double().requires_grad_()
    ref, _ = reference(x, w64, target, b, ce_weight, lse_square_scale=1e-3,
                       label_smoothing=0.1, softcap=4.0)
    assert rel_err(loss, ref) < 1e-5
    loss.backward()
    ref.backward()
    assert rel_err(ws.grad, w64.grad) < 1e-5
    out = LigerFusedLinearCrossEntropyLoss(return_z_loss=True)(w, x, target)
    assert isinstance(out, tuple) and len(out) == 2
    with pytest.raises(ValueError, match="accum_dtype must be None or one of"):
        LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.int32)
    with pytest.raises(ValueError, match="reduction must be one of"):
        LigerFusedLinearCrossEntropyLoss(reduction="avg")


def test_liger_fused_linear_cross_entropy_signature():
    x, w, target, b = make(6, 8, 30, torch.float32, seed=14, bias=True)
    ce_weight = torch.rand(30) + 0.5
    # Liger-Kernel's positional order: input, weight, target, bias, ce_weight, ignore_index,
    # lse_square_scale, label_smoothing, reduction, softcap, ...
    loss = liger_fused_linear_cross_entropy(x, w, target, b, ce_weight, -100, 1e-3, 0.1,
                                            "sum", 5.0)
    ref, _ = reference(x, w, target, b, ce_weight, -100, 1e-3, 0.1, "sum", 5.0)
    assert rel_err(loss, ref) < 1e-5


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_flce_compile_matches_eager(reduction):
    x, w, target, b = make(9, 16, 40, torch.float32, seed=15, bias=True)
    ce_weight = torch.rand(40) + 0.5

    def fn(x, w, b, t):
        loss, z = fused_linear_cross_entropy(x, w, t, b, ce_weight, reduction=reduction,
                                             lse_square_scale=1e-3, label_smoothing=0.1,
                                             softcap=4.0, return_z_loss=True, chunk_size=4)
        return loss.sum() * 2, z

    eager_in = [t.clone().requires_grad_() for t in (x, w, b)]
    comp_in = [t.clone().requires_grad_() for t in (x, w, b)]
    eager = fn(*eager_in, target)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*comp_in, target)
    for a, c in zip(eager, compiled):
        assert torch.allclose(a, c, rtol=1e-6, atol=1e-7)
    eager[0].backward()
    compiled[0].backward()
    for a, c in zip(eager_in, comp_in):
        assert torch.allclose(a.grad, c.grad, rtol=1e-6, atol=1e-7)


def test_flce_opcheck():
    x, w, target, b = make(5, 8, 20, torch.float32, seed=16, bias=True)
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    cw = torch.rand(20) + 0.5
    torch.library.opcheck(fused_linear_cross_entropy_fwd_op,
                          (xs, ws, target, bs, None, -100, 0.0, 0.0, "mean", 0.0, False,
                           False, None, False, True, True, True, 2))
    torch.library.opcheck(fused_linear_cross_entropy_fwd_op,
                          (xs, ws, target, None, cw, -100, 1e-2, 0.1, "none", 3.0, True,
                           True, torch.float32, True, True, True, False, 0))
    torch.library.opcheck(fused_linear_cross_entropy_bwd_op,
                          (torch.rand(5), x, w, target, b, cw, -100, 1e-2, 0.1, 3.0, None,
                           False, True, True, True, 2))


def test_flce_bad_inputs():
    x, w, target, b = make(4, 8, 10, torch.float32)
    with pytest.raises(TypeError, match="target must be int64"):
        fused_linear_cross_entropy(x, w, target.int())
    with pytest.raises(TypeError, match="input must be float32"):
        fused_linear_cross_entropy(x.long(), w, target)
    with pytest.raises(TypeError, match="one dtype"):
        fused_linear_cross_entropy(x, w.bfloat16(), target)
    with pytest.raises(ValueError, match=r"weight must have shape \(vocab, 8\)"):
        fused_linear_cross_entropy(x, w[:, :7], target)
    with pytest.raises(ValueError, match=r"target must have shape \(4,\)"):
        fused_linear_cross_entropy(x, w, target[:3])
    with pytest.raises(ValueError, match=r"bias must have shape \(10,\)"):
        fused_linear_cross_entropy(x, w, target, torch.zeros(9))
    with pytest.raises(ValueError, match="one device"):
        fused_linear_cross_entropy(x, w.to("meta"), target)
    with pytest.raises(ValueError, match=r"ce_weight must have shape \(10,\)"):
        fused_linear_cross_entropy(x, w, target, ce_weight=torch.ones(3))
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        fused_linear_cross_entropy(x, w, target, label_smoothing=2.0)
    with pytest.raises(ValueError, match="softcap must be None or"):
        fused_linear_cross_entropy(x, w, target, softcap=0.0)
    with pytest.raises(ValueError, match="chunk_size must be None or a positive int"):
        fused_linear_cross_entropy(x, w, target, chunk_size=0)
    with pytest.raises(ValueError, match="accum_dtype must be None or one of"):
        fused_linear_cross_entropy(x, w, target, accum_dtype=torch.float64)
    with pytest.raises(TypeError, match="use_token_scaling must be a bool"):
        fused_linear_cross_entropy(x, w, target, use_token_scaling=None)
    with pytest.raises(ValueError, match="at least one row"):
        fused_linear_cross_entropy(x, w[:0], target)


# --- GPU (pytest -m gpu): cuBLAS paths, fp32 accumulation of bf16 products ------------------

@pytest.mark.gpu
@pytest.mark.parametrize("accum_dtype", [None, torch.float32])
def test_flce_gpu_bf16(accum_dtype):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    torch.manual_seed(0)
    n, h, v = 4099, 512, 32003
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(v, h, device="cuda") / h ** 0.5 * 3).bfloat16()
    b = torch.randn(v, device="cuda").bfloat16()
    target = torch.randint(0, v, (n,), device="cuda")
    target[::5] = -100
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    loss = fused_linear_cross_entropy(xs, ws, target, bs, accum_dtype=accum_dtype,
                                      label_smoothing=0.1, lse_square_scale=1e-4,
                                      chunk_size=1000)
    loss.backward()
    refs = [t.float().requires_grad_() for t in (x, w, b)]
    ref, _ = reference(*refs[:2], target, refs[2], lse_square_scale=1e-4,
                       label_smoothing=0.1)
    ref.backward()
    assert rel_err(loss, ref) < 5e-3
    for ours, theirs in zip((xs, ws, bs), refs):
        assert rel_err(ours.grad, theirs.grad) < 2e-2
