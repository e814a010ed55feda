import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import assert_compile_matches_eager, check_rope, rel_err, rope_grads
from liger_aot.ops.llama4_rope import (liger_llama4_text_rotary_pos_emb,
                                       liger_llama4_vision_rotary_pos_emb)

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference(xq, xk, freqs_cis):
    """Hugging Face Llama4 apply_rotary_emb, in complex128 (xq, xk float64)."""
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis[:, :, None, :]
    return torch.view_as_real(xq_ * f).flatten(3), torch.view_as_real(xk_ * f).flatten(3)


def llama4_freqs(batch, seq, dim, scaling=1.0, base=500000.0):
    """freqs_cis (batch, seq, dim // 2) complex64, as Llama4TextRotaryEmbedding."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    pos = torch.stack([torch.arange(seq) + 3 * b for b in range(batch)]).float()
    freqs = pos[..., None] * inv_freq
    return torch.polar(torch.full_like(freqs, scaling), freqs)


def check(xq, xk, freqs_cis, fn=liger_llama4_text_rotary_pos_emb, ref_freqs=None):
    f = (freqs_cis if ref_freqs is None else ref_freqs).to(torch.complex128)
    if f.dim() == 2:
        f = f[None]
    check_rope(lambda q, k: fn(q, k, freqs_cis), lambda q, k: reference(q, k, f), xq, xk, TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [128, 40])
def test_llama4_rope_text(dtype, dim):
    # q, k as Llama-4 builds them: q_proj(x).view(b, s, h, d), contiguous (b, s, h, d)
    torch.manual_seed(0)
    batch, seq = 2, 5
    xq = torch.randn(batch, seq, 4, dim, dtype=dtype)
    xk = torch.randn(batch, seq, 1, dim, dtype=dtype)
    check(xq, xk, llama4_freqs(batch, seq, dim, scaling=1.25))


def test_llama4_rope_general_freqs_broadcast_and_loops():
    # arbitrary complex freqs shared over the batch (leading 1 and 2-D forms); 160 pairs loop
    torch.manual_seed(1)
    xq, xk = torch.randn(2, 3, 5, 320), torch.randn(2, 3, 2, 320)
    f = torch.randn(1, 3, 160, dtype=torch.complex64)
    check(xq, xk, f)
    check(xq, xk, f[0])


def test_llama4_rope_vision_freqs_layout():
    # Llama4VisionRotaryEmbedding: freqs_ci (seq, 1, head_dim // 2), shared over the batch
    torch.manual_seed(2)
    seq, dim = 7, 88
    xq, xk = torch.randn(3, seq, 2, dim), torch.randn(3, seq, 2, dim)
    freqs_ci = torch.randn(seq, 1, dim // 2, dtype=torch.complex64)
    check(xq, xk, freqs_ci, fn=liger_llama4_vision_rotary_pos_emb,
          ref_freqs=freqs_ci.reshape(1, seq, dim // 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama4_rope_noncontiguous_misaligned(dtype):
    torch.manual_seed(3)
    batch, seq, dim = 2, 4, 64
    xq = torch.randn(batch, 3, seq, dim, dtype=dtype).transpose(1, 2)  # strided heads/seq
    n = batch * seq * 2 * dim
    xk = torch.randn(n + 1, dtype=dtype)[1:].view(batch, seq, 2, dim)
    assert xk.data_ptr() % 16 != 0
    f = llama4_freqs(batch, seq, dim)
    f = torch.cat([torch.zeros(1, dtype=f.dtype), f.flatten()])[1:].view(f.shape)  # 8 B offset
    check(xq, xk, f)
    xq2 = torch.randn(batch, seq, 3, dim, 2, dtype=dtype)[..., 0]  # last dim stride 2: copied
    check(xq2, xk, llama4_freqs(batch, seq, dim))


def test_llama4_rope_conj_and_complex128_freqs():
    torch.manual_seed(4)
    xq, xk = torch.randn(1, 3, 2, 16), torch.randn(1, 3, 1, 16)
    f = torch.randn(1, 3, 8, dtype=torch.complex64)
    check(xq, xk, f.conj(), ref_freqs=f.conj().resolve_conj())
    check(xq, xk, f.to(torch.complex128), ref_freqs=f)


def test_llama4_rope_only_q_used():
    torch.manual_seed(5)
    xq = torch.randn(1, 3, 2, 16, requires_grad=True)
    xk = torch.randn(1, 3, 1, 16, requires_grad=True)
    f = llama4_freqs(1, 3, 16)
    qo, _ = liger_llama4_text_rotary_pos_emb(xq, xk, f)
    g = torch.randn_like(qo)
    qo.backward(g)
    q64 = xq.detach().double().requires_grad_()
    rq, _ = reference(q64, xk.detach().double(), f.to(torch.complex128))
    rq.backward(g.double())
    assert rel_err(xq.grad, q64.grad) < 1e-5
    assert xk.grad is None or not xk.grad.any()


@pytest.mark.parametrize("shape_q,shape_k", [((2, 0, 3, 16), (2, 0, 1, 16)),
                                             ((2, 3, 3, 16), (2, 3, 0, 16))])
def test_llama4_rope_empty(shape_q, shape_k):
    xq = torch.randn(shape_q, requires_grad=True)
    xk = torch.randn(shape_k, requires_grad=True)
    qo, ko = liger_llama4_text_rotary_pos_emb(xq, xk, llama4_freqs(2, shape_q[1], 16))
    assert qo.shape == xq.shape and ko.shape == xk.shape
    (qo.sum() + ko.sum()).backward()
    assert xq.grad.shape == xq.shape and xk.grad.shape == xk.shape


def test_llama4_rope_bad_inputs():
    xq, xk = torch.randn(2, 5, 3, 32), torch.randn(2, 5, 1, 32)
    f = llama4_freqs(2, 5, 32)
    with pytest.raises(TypeError, match="freqs_cis must be complex64"):
        liger_llama4_text_rotary_pos_emb(xq, xk, torch.view_as_real(f))
    with pytest.raises(ValueError, match=r"freqs_cis must have shape \(2 or 1, 5, 16\)"):
        liger_llama4_text_rotary_pos_emb(xq, xk, f[:, :4])
    with pytest.raises(ValueError, match="freqs_cis must have shape"):
        liger_llama4_text_rotary_pos_emb(xq, xk, torch.cat([f, f]))
    with pytest.raises(ValueError, match="head_dim must be even"):
        liger_llama4_text_rotary_pos_emb(xq[..., :31], xk[..., :31], f)
    with pytest.raises(ValueError, match="xk must match xq"):
        liger_llama4_text_rotary_pos_emb(xq, torch.randn(2, 4, 1, 32), f)
    with pytest.raises(ValueError, match="xq must be 4-D"):
        liger_llama4_text_rotary_pos_emb(xq[0], xk, f)
    with pytest.raises(TypeError, match="one dtype"):
        liger_llama4_text_rotary_pos_emb(xq, xk.half(), f)
    with pytest.raises(TypeError, match="xq must be float32"):
        liger_llama4_text_rotary_pos_emb(xq.long(), xk, f)
    with pytest.raises(ValueError, match="one device"):
        liger_llama4_text_rotary_pos_emb(xq, xk, f.to("meta"))
    with pytest.raises(TypeError, match="freqs_cis must be a torch.Tensor"):
        liger_llama4_text_rotary_pos_emb(xq, xk, [1.0])
    with pytest.raises(ValueError, match="freqs_ci must have shape"):
        liger_llama4_vision_rotary_pos_emb(xq, xk, f[0, :4])


def test_llama4_rope_torch_compile_matches_eager():
    torch.manual_seed(6)
    xq, xk = torch.randn(2, 5, 3, 32), torch.randn(2, 5, 1, 32)
    f = llama4_freqs(2, 5, 32)

    def fn(q, k):
        qo, ko = liger_llama4_text_rotary_pos_emb(q, k, f)
        return qo * 2.0, ko

    assert_compile_matches_eager(fn, (xq, xk), rope_grads)


def test_llama4_rope_opcheck():
    from liger_aot.ops.llama4_rope import llama4_rope_bwd_op, llama4_rope_fwd_op

    xq = torch.randn(1, 3, 2, 16, requires_grad=True)
    xk = torch.randn(1, 3, 1, 16, requires_grad=True)
    freqs = torch.view_as_real(llama4_freqs(1, 3, 16)).flatten(-2)
    torch.library.opcheck(llama4_rope_fwd_op.custom_op, (xq, xk, freqs))
    torch.library.opcheck(llama4_rope_bwd_op.custom_op, (xq.detach(), xk.detach(), freqs))
