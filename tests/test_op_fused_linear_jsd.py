import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from liger_aot.ops.fused_linear_jsd import (default_chunk_size, fused_linear_jsd,
                                            fused_linear_jsd_fwd_op)
from liger_aot.transformers.losses_distill import LigerFusedLinearJSD

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def jsd_reference(x, y, beta, labels=None, ignore_index=-100):
    """Generalized JSD from its definition on log-probabilities x (student), y (teacher),
    summed over the vocab and averaged over the non-ignored rows (0 if none)."""
    p, q = y.exp(), x.exp()
    if beta == 0:
        loss = p * (y - x)
    elif beta == 1:
        loss = q * (x - y)
    else:
        log_m = (beta * p + (1 - beta) * q).log()
        loss = beta * p * (y - log_m) + (1 - beta) * q * (x - log_m)
    loss = loss.sum(-1)
    if labels is None:
        return loss.sum() / max(loss.shape[0], 1)
    keep = labels != ignore_index
    return (loss * keep).sum() / keep.sum().clamp_min(1)


def reference(s_in, s_w, t_in, t_w, labels, beta, ignore_index, temperature):
    """Materialized float64 logits, log_softmax with temperature, then the JSD reference."""
    x = (s_in @ s_w.t() / temperature).log_softmax(-1)
    y = (t_in @ t_w.t() / temperature).log_softmax(-1)
    return jsd_reference(x, y, beta, labels, ignore_index)


def make(bt, h, ht, v, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    s_in = torch.randn(bt, h, generator=g).to(dtype)
    s_w = (torch.randn(v, h, generator=g) / h ** 0.5 * 2).to(dtype)
    t_in = torch.randn(bt, ht, generator=g).to(dtype)
    t_w = (torch.randn(v, ht, generator=g) / ht ** 0.5 * 2).to(dtype)
    return s_in, s_w, t_in, t_w


def check(s_in, s_w, t_in, t_w, labels=None, beta=0.5, ignore_index=-100, temperature=1.0,
          chunk_size=None, grad_scale=1.3, weight_grad=True, input_grad=True, tol=None):
    dtype = s_in.dtype
    s_in = s_in.detach().requires_grad_(input_grad)
    s_w = s_w.detach().requires_grad_(weight_grad)
    out = fused_linear_jsd(s_in, s_w, t_in, t_w, labels, beta, ignore_index, temperature,
                           chunk_size=chunk_size)
    assert out.shape == () and out.dtype == torch.float32
    (out * grad_scale).backward()
    a = s_in.detach().double().requires_grad_()
    b = s_w.detach().double().requires_grad_()
    ref = reference(a, b, t_in.double(), t_w.double(), labels, beta, ignore_index, temperature)
    (ref * grad_scale).backward()
    tol = tol or TOL[dtype]
    assert rel_err(out, ref) < tol
    if input_grad:
        assert s_in.grad.dtype == dtype and s_in.grad.shape == s_in.shape
        assert rel_err(s_in.grad, a.grad) < tol
    else:
        assert s_in.grad is None
    if weight_grad:
        assert s_w.grad.dtype == dtype and s_w.grad.shape == s_w.shape
        assert rel_err(s_w.grad, b.grad) < tol
    else:
        assert s_w.grad is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [0.0, 0.25, 0.5, 1.0])
def test_fused_linear_jsd(beta, dtype):
    # vocab 1100: the row kernel loops over three 512-column blocks, the last partial
    check(*make(6, 16, 24, 1100, dtype), beta=beta, chunk_size=4)


@pytest.mark.parametrize("chunk_size", [None, 1, 3, 7, 8, 64])
def test_fused_linear_jsd_chunk_boundaries(chunk_size):
    labels = torch.tensor([1, -100, 3, 4, 5, -100, 7, 8])
    check(*make(8, 16, 24, 300, torch.float32, seed=1), labels=labels, beta=0.3,
          temperature=2.0, chunk_size=chunk_size)


def test_fused_linear_jsd_default_chunk_size():
    assert default_chunk_size(4096 * 4, 4096, 32000) == 2048  # Liger-Kernel's example
    assert default_chunk_size(8, 16, 300) == 1
    assert default_chunk_size(0, 16, 300) == 1


@pytest.mark.parametrize("temperature", [0.5, 3.0])
@pytest.mark.parametrize("beta", [0.0, 0.7, 1.0])
def test_fused_linear_jsd_temperature_labels(beta, temperature):
    labels = torch.tensor([-100, 2, 3, -100, 5, 6, 7])
    check(*make(7, 16, 16, 129, torch.float32, seed=2), labels=labels, beta=beta,
          temperature=temperature, chunk_size=3)


def test_fused_linear_jsd_all_ignored():
    s_in, s_w, t_in, t_w = make(5, 8, 8, 50, torch.float32, seed=3)
    s_in.requires_grad_()
    s_w.requires_grad_()
    out = fused_linear_jsd(s_in, s_w, t_in, t_w, torch.full((5,), -100), chunk_size=2)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(s_in.grad, torch.zeros_like(s_in))
    assert torch.equal(s_w.grad, torch.zeros_like(s_w))


def test_fused_linear_jsd_fp16():
    check(*make(6, 16, 16, 300, torch.float16, seed=4), beta=0.5, chunk_size=4)


def test_fused_linear_jsd_partial_grads():
    args = make(6, 16, 20, 130, torch.float32, seed=5)
    check(*args, weight_grad=False, chunk_size=4)
    check(*args, input_grad=False, chunk_size=4)
    s_in, s_w, t_in, t_w = args
    s_in.requires_grad_()
    with torch.no_grad():
        out = fused_linear_jsd(s_in, s_w, t_in, t_w)
    ref = reference(s_in.double(), s_w.double(), t_in.double(), t_w.double(), None, 0.5,
                    -100, 1.0)
    assert not out.requires_grad and rel_err(out, ref) < 1e-5


def test_fused_linear_jsd_teacher_gets_no_grad_and_other_dtype():
    s_in, s_w, t_in, t_w = make(6, 16, 20, 130, torch.float32, seed=6)
    t_in.requires_grad_()
    out = fused_linear_jsd(s_in.requires_grad_(), s_w, t_in, t_w)
    out.backward()
    assert t_in.grad is None
    # a teacher in another dtype: its logits are cast to the student's dtype
    tb, twb = t_in.detach().bfloat16(), t_w.bfloat16()
    out_b = fused_linear_jsd(s_in, s_w, tb, twb)
    ref = reference(s_in.detach().double(), s_w.double(), tb.double(), twb.double(), None,
                    0.5, -100, 1.0)
    assert rel_err(out_b, ref) < 2e-2


def test_fused_linear_jsd_noncontiguous_and_misaligned():
    s_in, s_w, t_in, t_w = make(6, 16, 20, 130, torch.float32, seed=7)
    s_t = s_in.t().contiguous().t()  # column-major
    flat = torch.cat([torch.zeros(1), t_w.reshape(-1)])
    t_w_mis = flat[1:].view(t_w.shape)
    assert not s_t.is_contiguous() and t_w_mis.data_ptr() % 16 != 0
    check(s_t, s_w.t().contiguous().t(), t_in, t_w_mis, chunk_size=4)
    # vocab 130: logits rows of 520 bytes, misaligned for odd chunk starts
    check(s_in, s_w, t_in, t_w, chunk_size=3)


def test_fused_linear_jsd_empty():
    s_in, s_w, t_in, t_w = make(0, 8, 8, 20, torch.float32)
    s_in.requires_grad_()
    s_w.requires_grad_()
    out = fused_linear_jsd(s_in, s_w, t_in, t_w)
    assert out.item() == 0.0
    out.backward()
    assert s_in.grad.shape == (0, 8) and torch.equal(s_w.grad, torch.zeros_like(s_w))


def test_fused_linear_jsd_module():
    s_in, s_w, t_in, t_w = make(6, 16, 20, 130, torch.float32, seed=8)
    labels = torch.tensor([0, 1, -1, 3, 4, 5])
    mod = LigerFusedLinearJSD(jsd_beta=0.1, ignore_index=-1, temperature=1.5)
    out = mod(s_in, s_w, t_in, t_w, labels)
    ref = reference(s_in.double(), s_w.double(), t_in.double(), t_w.double(), labels, 0.1, -1,
                    1.5)
    assert rel_err(out, ref) < 1e-5
    default = LigerFusedLinearJSD()
    assert (default.jsd_beta, default.ignore_index, default.temperature) == (0.5, -100, 1.0)
    with pytest.raises(ValueError, match="temperature cannot be 0"):
        LigerFusedLinearJSD(temperature=0)


def test_fused_linear_jsd_compile_matches_eager():
    s_in, s_w, t_in, t_w = make(6, 16, 20, 130, torch.float32, seed=9)
    labels = torch.tensor([0, 1, -100, 3, 4, 5])

    def fn(a, w, ti, tw, lab):
        return fused_linear_jsd(a, w, ti, tw, lab, 0.3, -100, 2.0, chunk_size=4) * 3.0

    ae, we = s_in.clone().requires_grad_(), s_w.clone().requires_grad_()
    eager = fn(ae, we, t_in, t_w, labels)
    eager.backward()
    ac, wc = s_in.clone().requires_grad_(), s_w.clone().requires_grad_()
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(ac, wc, t_in, t_w, labels)
    out.backward()
    torch.testing.assert_close(out, eager, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ac.grad, ae.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(wc.grad, we.grad, rtol=1e-6, atol=1e-6)


def test_fused_linear_jsd_opcheck():
    s_in, s_w, t_in, t_w = make(4, 8, 8, 40, torch.float32, seed=10)
    s_in.requires_grad_()
    s_w.requires_grad_()
    labels = torch.tensor([1, -100, 2, 3])
    torch.library.opcheck(fused_linear_jsd_fwd_op.custom_op,
                          (s_in, s_w, t_in, t_w, labels, 0.5, -100, 1.0, 2, True, True))
    torch.library.opcheck(fused_linear_jsd_fwd_op.custom_op,
                          (s_in, s_w, t_in, t_w, None, 0.0, -100, 2.0, 0, True, False))


def test_fused_linear_jsd_bad_inputs():
    s_in, s_w, t_in, t_w = make(4, 8, 6, 20, torch.float32)
    with pytest.raises(ValueError, match="student_weight must have shape"):
        fused_linear_jsd(s_in, torch.randn(20, 7), t_in, t_w)
    with pytest.raises(ValueError, match="teacher_weight must have 20 rows"):
        fused_linear_jsd(s_in, s_w, t_in, torch.randn(21, 6))
    with pytest.raises(ValueError, match="teacher_input must have 4 rows"):
        fused_linear_jsd(s_in, s_w, torch.randn(5, 6), t_w)
    with pytest.raises(ValueError, match="teacher_weight must have shape"):
        fused_linear_jsd(s_in, s_w, t_in, torch.randn(20, 5))
    with pytest.raises(ValueError, match="must be 2-D"):
        fused_linear_jsd(s_in[None], s_w, t_in, t_w)
    with pytest.raises(TypeError, match="student_weight must have student_input's dtype"):
        fused_linear_jsd(s_in, s_w.bfloat16(), t_in, t_w)
    with pytest.raises(TypeError, match="teacher_input must be float32"):
        fused_linear_jsd(s_in, s_w, t_in.long(), t_w)
    with pytest.raises(ValueError, match="one device"):
        fused_linear_jsd(s_in, s_w, t_in, t_w.to("meta"))
    with pytest.raises(ValueError, match="temperature must be finite and nonzero"):
        fused_linear_jsd(s_in, s_w, t_in, t_w, temperature=0.0)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        fused_linear_jsd(s_in, s_w, t_in, t_w, jsd_beta=2.0)
    with pytest.raises(ValueError, match=r"shift_labels must have shape \(4,\)"):
        fused_linear_jsd(s_in, s_w, t_in, t_w, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="shift_labels must be int64"):
        fused_linear_jsd(s_in, s_w, t_in, t_w, torch.zeros(4))
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        fused_linear_jsd(s_in, s_w, t_in, t_w, chunk_size=0)
    with pytest.raises(ValueError, match="vocab size is 0"):
        fused_linear_jsd(s_in, torch.randn(0, 8), t_in, torch.randn(0, 6))


def test_fused_linear_jsd_large_vocab():
    # 262144 columns: 512 blocks per pass of the row kernel's online log-sum-exp. grad_input
    # sums 262144 mostly cancelling products (softmax Jacobian): fp32 round-off alone gives
    # ~1.7e-5 (the same computation in plain fp32 torch ops), hence the looser bound
    check(*make(1, 4, 4, 262144, torch.float32, seed=11), beta=0.5, tol=5e-5)


def test_fused_linear_jsd_autocast():
    # fp32 parameters under bf16 autocast: bf16 matmuls and logits, fp32 gradients
    s_in, s_w, t_in, t_w = make(6, 16, 20, 130, torch.float32, seed=12)
    a, b = s_in.clone().requires_grad_(), s_w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused_linear_jsd(a, b, t_in, t_w, None, 0.5, -100, 1.0, chunk_size=4)
    out.backward()
    assert out.dtype == torch.float32 and a.grad.dtype == b.grad.dtype == torch.float32
    a64, b64 = s_in.double().requires_grad_(), s_w.double().requires_grad_()
    ref = reference(a64, b64, t_in.double(), t_w.double(), None, 0.5, -100, 1.0)
    ref.backward()
    assert rel_err(out, ref) < 2e-2
    assert rel_err(a.grad, a64.grad) < 2e-2 and rel_err(b.grad, b64.grad) < 2e-2
