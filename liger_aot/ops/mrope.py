"""Qwen2-VL multimodal rotary position embedding (M-RoPE) on the RoPE kernel.

Hugging Face's apply_multimodal_rotary_pos_emb splits cos/sin (3, batch, seq, head_dim) along
head_dim by mrope_section * 2 and takes chunk i from plane i % 3 (temporal, height, width):
half-dim column d reads plane 0 for d < s0, plane 1 for d < s0 + s1, else plane 2, in both
halves. The RoPE kernel does exactly that selection given the two bounds, so M-RoPE costs no
extra kernel variants and shares RoPE's custom ops on the torch.compile path.
"""
from __future__ import annotations

import torch

from .rope import apply_rope, check_qk


def _section_bounds(mrope_section, half: int) -> tuple:
    try:
        sections = [int(s) for s in mrope_section]
        ok = len(sections) == 3 and all(s >= 0 and s == v for s, v in zip(sections, mrope_section))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"mrope_section must be three non-negative ints (temporal, height, "
                         f"width), got {mrope_section!r}")
    if sum(sections) != half:
        raise ValueError(f"mrope_section must sum to head_dim // 2 = {half}, got "
                         f"{list(mrope_section)} (sum {sum(sections)})")
    return sections[0], sections[0] + sections[1]


def liger_multimodal_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                    sin: torch.Tensor, mrope_section, unsqueeze_dim: int = 1):
    """Hugging Face Qwen2-VL apply_multimodal_rotary_pos_emb: returns (q_embed, k_embed).

    q: (batch, n_q_heads, seq, head_dim), k: (batch, n_k_heads, seq, head_dim) for
    unsqueeze_dim=1, or (batch, seq, heads, head_dim) for unsqueeze_dim=2. cos, sin:
    (3, 1 | batch, seq, head_dim) in q's dtype. mrope_section: [temporal, height, width]
    summing to head_dim // 2 (the config's rope_scaling["mrope_section"]). Gradients flow to
    q and k only."""
    batch, seq, dim = check_qk(q, k, cos, sin, unsqueeze_dim)
    if cos.dim() != 4 or cos.shape[0] != 3 or cos.shape[1] not in (1, batch) \
            or tuple(cos.shape[2:]) != (seq, dim):
        raise ValueError(f"cos must have shape (3, {batch} or 1, {seq}, {dim}) for q "
                         f"{tuple(q.shape)}, got {tuple(cos.shape)}")
    sections = _section_bounds(mrope_section, dim // 2)
    return apply_rope(q, k, cos, sin, unsqueeze_dim, sections)


liger_qwen2vl_mrope = liger_multimodal_rotary_pos_emb
