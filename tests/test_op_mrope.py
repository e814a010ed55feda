import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import (apply_rotary, assert_compile_matches_eager, check_rope, rope_grads,
                         rope_kernels_used)
from liger_aot.ops.mrope import liger_multimodal_rotary_pos_emb, liger_qwen2vl_mrope

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
    """Hugging Face Qwen2-VL apply_multimodal_rotary_pos_emb."""
    sections = list(mrope_section) * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sections, dim=-1))], dim=-1)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sections, dim=-1))], dim=-1)
    return apply_rotary(q, k, cos, sin, unsqueeze_dim)


def qwen2vl_cos_sin(batch, seq, dim, dtype, base=10000.0):
    """cos/sin (3, batch, seq, dim) from 3-D position ids, as Qwen2VLRotaryEmbedding."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    pos = torch.stack([torch.arange(seq) + 5 * b for b in range(batch)]).double()
    pos = torch.stack([pos, pos // 3, pos % 7])  # distinct temporal / height / width ids
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def check(q, k, cos, sin, section, unsqueeze_dim=1):
    check_rope(lambda q, k: liger_multimodal_rotary_pos_emb(q, k, cos, sin, section, unsqueeze_dim),
               lambda q, k: reference(q, k, cos.double(), sin.double(), section, unsqueeze_dim),
               q, k, TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim,section", [(128, [16, 24, 24]), (48, [8, 6, 10])])
def test_mrope_hf_layout(dtype, dim, section):
    # q/k as Qwen2-VL builds them: view(b, s, h, d).transpose(1, 2), non-contiguous
    torch.manual_seed(0)
    batch, seq, n_q, n_k = 2, 5, 4, 2
    q = torch.randn(batch, seq, n_q, dim, dtype=dtype).transpose(1, 2)
    k = torch.randn(batch, seq, n_k, dim, dtype=dtype).transpose(1, 2)
    cos, sin = qwen2vl_cos_sin(batch, seq, dim, dtype)
    check(q, k, cos, sin, section)


@pytest.mark.parametrize("section", [[0, 12, 12], [24, 0, 0], [10, 14, 0], [3, 17, 4]])
def test_mrope_sections_and_general_cos(section):
    # cos/sin planes of unrelated values: any wrong plane or half shows
    torch.manual_seed(1)
    q, k = torch.randn(2, 3, 4, 48), torch.randn(2, 1, 4, 48)
    cos, sin = torch.randn(3, 2, 4, 48), torch.randn(3, 2, 4, 48)
    check(q, k, cos, sin, section)


def test_mrope_runs_the_looped_kernel(monkeypatch):
    # M-RoPE's section planes are read by the looped kernel only; rope_whole, which plain RoPE
    # of these sizes takes, must never see them
    used = rope_kernels_used(monkeypatch)
    torch.manual_seed(4)
    q, k = torch.randn(2, 3, 4, 48), torch.randn(2, 1, 4, 48)
    cos, sin = qwen2vl_cos_sin(2, 4, 48, torch.float32)
    check(q, k, cos, sin, [8, 6, 10])
    assert used == ["rope", "rope"], used


def test_mrope_unsqueeze_dim_2_broadcast_batch_loops():
    # (batch, seq, heads, dim) layout; cos shared over the batch; half dim 160 > BLOCK_D loops
    torch.manual_seed(2)
    q, k = torch.randn(2, 3, 5, 320), torch.randn(2, 3, 2, 320)
    cos, sin = torch.randn(3, 1, 3, 320), torch.randn(3, 1, 3, 320)
    check(q, k, cos, sin, (40, 60, 60), unsqueeze_dim=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mrope_misaligned_and_noncontiguous_cos(dtype):
    torch.manual_seed(3)
    n = 1 * 2 * 5 * 32
    q = torch.randn(n + 1, dtype=dtype)[1:].view(1, 2, 5, 32)
    assert q.data_ptr() % 16 != 0
    k = torch.randn(1, 1, 32, 5, dtype=dtype).transpose(2, 3)  # last dim not contiguous
    cos, sin = qwen2vl_cos_sin(1, 5, 32, dtype)
    cos = torch.cat([torch.zeros(1, dtype=dtype), cos.flatten()])[1:].view(cos.shape)
    sin = sin.transpose(0, 1).contiguous().transpose(0, 1)  # plane stride != batch*seq*dim
    check(q, k, cos, sin, [4, 6, 6])


def test_mrope_alias_name():
    assert liger_qwen2vl_mrope is liger_multimodal_rotary_pos_emb


@pytest.mark.parametrize("seq,n_k", [(0, 1), (3, 0)])
def test_mrope_empty(seq, n_k):
    q = torch.randn(2, 3, seq, 16, requires_grad=True)
    k = torch.randn(2, n_k, seq, 16, requires_grad=True)
    cos, sin = qwen2vl_cos_sin(2, seq, 16, torch.float32)
    qo, ko = liger_multimodal_rotary_pos_emb(q, k, cos, sin, [2, 3, 3])
    assert qo.shape == q.shape and ko.shape == k.shape
    (qo.sum() + ko.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_mrope_bad_inputs():
    q, k = torch.randn(2, 3, 5, 32), torch.randn(2, 1, 5, 32)
    cos, sin = qwen2vl_cos_sin(2, 5, 32, torch.float32)
    with pytest.raises(ValueError, match="mrope_section must sum to head_dim // 2 = 16"):
        liger_multimodal_rotary_pos_emb(q, k, cos, sin, [4, 6, 8])
    with pytest.raises(ValueError, match="mrope_section must be three"):
        liger_multimodal_rotary_pos_emb(q, k, cos, sin, [8, 8])
    with pytest.raises(ValueError, match="mrope_section must be three"):
        liger_multimodal_rotary_pos_emb(q, k, cos, sin, [-2, 10, 8])
    with pytest.raises(ValueError, match="mrope_section must be three"):
        liger_multimodal_rotary_pos_emb(q, k, cos, sin, None)
    with pytest.raises(ValueError, match=r"cos must have shape \(3, 2 or 1, 5, 32\)"):
        liger_multimodal_rotary_pos_emb(q, k, cos[0], sin[0], [4, 6, 6])
    with pytest.raises(ValueError, match="cos must have shape"):
        liger_multimodal_rotary_pos_emb(q, k, cos[:2], sin[:2], [4, 6, 6])
    with pytest.raises(ValueError, match="cos and sin must have one shape"):
        liger_multimodal_rotary_pos_emb(q, k, cos, sin[:, :1], [4, 6, 6])
    with pytest.raises(TypeError, match="one dtype"):
        liger_multimodal_rotary_pos_emb(q, k, cos.bfloat16(), sin.bfloat16(), [4, 6, 6])
    with pytest.raises(ValueError, match="k must match q"):
        liger_multimodal_rotary_pos_emb(q, torch.randn(2, 1, 4, 32), cos, sin, [4, 6, 6])
    with pytest.raises(ValueError, match="one device"):
        liger_multimodal_rotary_pos_emb(q, k, cos.to("meta"), sin, [4, 6, 6])


def test_mrope_torch_compile_matches_eager():
    torch.manual_seed(4)
    q = torch.randn(2, 5, 3, 32).transpose(1, 2)
    k = torch.randn(2, 1, 5, 32)
    cos, sin = qwen2vl_cos_sin(2, 5, 32, torch.float32)

    def f(q, k):
        qo, ko = liger_multimodal_rotary_pos_emb(q, k, cos, sin, [4, 6, 6])
        return qo * 2.0, ko

    assert_compile_matches_eager(f, (q, k), rope_grads)


def test_mrope_opcheck():
    from liger_aot.ops.rope import rope_bwd_op, rope_fwd_op

    q = torch.randn(1, 2, 3, 16, requires_grad=True)
    k = torch.randn(1, 1, 3, 16, requires_grad=True)
    cos, sin = torch.randn(3, 1, 3, 16), torch.randn(3, 1, 3, 16)
    torch.library.opcheck(rope_fwd_op.custom_op, (q, k, cos, sin, 1, 2, 5))
    torch.library.opcheck(rope_bwd_op.custom_op, (q.detach(), k.detach(), cos, sin, 1, 2, 5))
