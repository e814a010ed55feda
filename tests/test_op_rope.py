import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import apply_rotary as reference
from _op_helpers import assert_compile_matches_eager, check_rope, rel_err, rope_grads
from liger_aot.ops.rope import liger_rotary_pos_emb

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]


def hf_cos_sin(batch, seq, dim, dtype, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    pos = torch.arange(seq, dtype=torch.float64)[None, :] + torch.arange(batch)[:, None] * 3
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def check(q, k, cos, sin, unsqueeze_dim=1, use_k=True):
    check_rope(lambda q, k: liger_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim),
               lambda q, k: reference(q, k, cos.double(), sin.double(), unsqueeze_dim),
               q, k, TOL, use_k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("cos_batch", [1, 2])
def test_rope_hf_layout(head_dim, dtype, cos_batch):
    # q and k as Hugging Face builds them: view(b, s, h, d).transpose(1, 2), non-contiguous
    torch.manual_seed(0)
    batch, seq, n_q, n_k = 2, 7, 3, 1
    q = torch.randn(batch, seq, n_q, head_dim, dtype=dtype).transpose(1, 2)
    k = torch.randn(batch, seq, n_k, head_dim, dtype=dtype).transpose(1, 2)
    assert not q.is_contiguous()
    cos, sin = hf_cos_sin(cos_batch, seq, head_dim, dtype)
    check(q, k, cos, sin)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_general_cos_sin(dtype):
    # cos/sin halves that differ: checks the adjoint uses the right sin half
    torch.manual_seed(1)
    q = torch.randn(2, 4, 5, 48, dtype=dtype)
    k = torch.randn(2, 2, 5, 48, dtype=dtype)
    cos, sin = torch.randn(2, 5, 48, dtype=dtype), torch.randn(2, 5, 48, dtype=dtype)
    check(q, k, cos, sin)


def test_rope_unsqueeze_dim_2_and_2d_cos():
    torch.manual_seed(2)
    q = torch.randn(2, 6, 3, 32)  # (batch, seq, heads, head_dim)
    k = torch.randn(2, 6, 1, 32)
    cos, sin = hf_cos_sin(1, 6, 32, torch.float32)
    check(q, k, cos, sin, unsqueeze_dim=2)
    qo, ko = liger_rotary_pos_emb(q, k, cos[0], sin[0], unsqueeze_dim=2)
    rq, rk = reference(q, k, cos, sin, 2)
    assert rel_err(qo, rq) < 1e-5 and rel_err(ko, rk) < 1e-5


def test_rope_long_head_dim_loops():
    # half dim 160 > largest BLOCK_D (128): loops over head-dim chunks; 20 q heads loop too
    torch.manual_seed(3)
    q = torch.randn(1, 20, 3, 320)
    k = torch.randn(1, 9, 3, 320)
    cos, sin = hf_cos_sin(1, 3, 320, torch.float32)
    check(q, k, cos, sin)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_misaligned_and_last_dim_copy(dtype):
    torch.manual_seed(4)
    batch, n_q, seq, d = 1, 3, 7, 64
    q = torch.randn(batch * n_q * seq * d + 1, dtype=dtype)[1:].view(batch, n_q, seq, d)
    assert q.data_ptr() % 16 != 0
    k = torch.randn(batch, 1, d, seq, dtype=dtype).transpose(2, 3)  # last dim not contiguous
    cos, sin = hf_cos_sin(1, seq, d, dtype)
    cos = torch.cat([torch.zeros(1, dtype=dtype), cos.flatten()])[1:].view(cos.shape)
    check(q, k, cos, sin)


def test_rope_only_q_used():
    torch.manual_seed(5)
    q, k = torch.randn(2, 3, 7, 64), torch.randn(2, 1, 7, 64)
    cos, sin = hf_cos_sin(2, 7, 64, torch.float32)
    check(q, k, cos, sin, use_k=False)


def test_rope_sum_backward_expanded_grad():
    q = torch.randn(1, 2, 3, 16, requires_grad=True)
    k = torch.randn(1, 1, 3, 16, requires_grad=True)
    cos, sin = hf_cos_sin(1, 3, 16, torch.float32)
    qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    (qo.sum() + ko.sum()).backward()
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    rq, rk = reference(q64, k64, cos.double(), sin.double())
    (rq.sum() + rk.sum()).backward()
    assert rel_err(q.grad, q64.grad) < 1e-5 and rel_err(k.grad, k64.grad) < 1e-5


def test_rope_outputs_are_new_tensors():
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 1, 3, 16)
    q0, k0 = q.clone(), k.clone()
    cos, sin = hf_cos_sin(1, 3, 16, torch.float32)
    qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    assert qo.data_ptr() != q.data_ptr() and ko.data_ptr() != k.data_ptr()


@pytest.mark.parametrize("seq,n_k", [(0, 1), (4, 0)])
def test_rope_empty(seq, n_k):
    q = torch.randn(2, 3, seq, 16, requires_grad=True)
    k = torch.randn(2, n_k, seq, 16, requires_grad=True)
    cos, sin = hf_cos_sin(1, seq, 16, torch.float32)
    qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    assert qo.shape == q.shape and ko.shape == k.shape
    (qo.sum() + ko.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    if seq:
        rq, _ = reference(q.detach(), k.detach(), cos, sin)
        assert rel_err(qo, rq) < 1e-5


def test_rope_bad_inputs():
    q, k = torch.randn(2, 3, 7, 64), torch.randn(2, 1, 7, 64)
    cos, sin = hf_cos_sin(1, 7, 64, torch.float32)
    with pytest.raises(ValueError, match="head_dim must be even"):
        liger_rotary_pos_emb(q[..., :63], k[..., :63], cos[..., :63], sin[..., :63])
    with pytest.raises(ValueError, match="k must match q"):
        liger_rotary_pos_emb(q, torch.randn(3, 1, 7, 64), cos, sin)
    with pytest.raises(ValueError, match="cos must have shape"):
        liger_rotary_pos_emb(q, k, cos[:, :6], sin[:, :6])
    with pytest.raises(ValueError, match="cos and sin must have one shape"):
        liger_rotary_pos_emb(q, k, cos, sin[:, :6])
    with pytest.raises(TypeError, match="one dtype"):
        liger_rotary_pos_emb(q, k.bfloat16(), cos, sin)
    with pytest.raises(TypeError, match="one dtype"):
        liger_rotary_pos_emb(q, k, cos.half(), sin.half())
    with pytest.raises(TypeError, match="q must be float32"):
        liger_rotary_pos_emb(q.long(), k, cos, sin)
    with pytest.raises(ValueError, match="one device"):
        liger_rotary_pos_emb(q, k, cos.to("meta"), sin)
    with pytest.raises(ValueError, match="unsqueeze_dim must be 1"):
        liger_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    with pytest.raises(ValueError, match="q must be 4-D"):
        liger_rotary_pos_emb(q[0], k, cos, sin)


def test_rope_torch_compile_matches_eager():
    # fullgraph=True fails on any graph break: the call must trace as the custom op
    from liger_aot.ops import rope as rope_ops

    torch.manual_seed(6)
    q = torch.randn(2, 7, 3, 32).transpose(1, 2)  # HF layout, non-contiguous
    k = torch.randn(2, 1, 7, 32)
    cos, sin = hf_cos_sin(1, 7, 32, torch.float32)

    def f(q, k):
        qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
        return qo * 2.0, ko

    assert_compile_matches_eager(f, (q, k), rope_grads)


def test_rope_opcheck():
    q = torch.randn(1, 2, 3, 16, requires_grad=True)
    k = torch.randn(1, 1, 3, 16, requires_grad=True)
    cos, sin = hf_cos_sin(1, 3, 16, torch.float32)
    from liger_aot.ops.rope import rope_bwd_op, rope_fwd_op

    torch.library.opcheck(rope_fwd_op, (q, k, cos, sin, 1, -1, -1))
    torch.library.opcheck(rope_bwd_op, (q.detach(), k.detach(), cos, sin, 1, -1, -1))
