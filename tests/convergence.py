"""Convergence harness shared by the CPU tests (tests/test_patching.py) and the GPU run
(tests/test_gpu_models.py): train a tiny model N steps with and without the liger-aot patch
from one seed on locally generated data; compare every step's loss, the final top-k logits
and the final weights."""
from __future__ import annotations

import copy

import torch

# Tiny configs: small enough for Triton's interpreter on a CPU, with head_dim >= 16 and
# non-power-of-two sizes where the family allows.
_COMMON = dict(hidden_size=48, intermediate_size=88, num_hidden_layers=2, num_attention_heads=3,
               num_key_value_heads=1, head_dim=16, vocab_size=120, max_position_embeddings=64,
               tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
TINY_CONFIGS = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "mixtral": {"num_local_experts": 2, "num_experts_per_tok": 1},
    "gemma": {"hidden_activation": "gelu_pytorch_tanh"},
    "gemma2": {"hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0,
               "attn_logit_softcapping": None, "query_pre_attn_scalar": 16,
               "sliding_window": 32},
    "gemma3_text": {"hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0,
                    "query_pre_attn_scalar": 16, "sliding_window": 32},
    "qwen2": {},
    "qwen3": {},
    "qwen3_moe": {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 40,
                  "decoder_sparse_step": 1},
    "phi3": {"pad_token_id": 0},
    "granite": {"logits_scaling": 2.0},
    "olmo2": {},
    "glm4": {},
}

TOLERANCE = {  # (loss rel, logits rel, weights rel)
    torch.float32: (1e-4, 1e-3, 1e-4),
    # bf16 weights: Triton's CPU interpreter rounds fp32->bf16 stores toward zero, which
    # adds ~1e-2 after a few AdamW steps; the GPU rounds to nearest.
    torch.bfloat16: (3e-2, 1e-1, 5e-2),
}


def tiny_config(model_type: str):
    from transformers import AutoConfig

    if model_type == "qwen2_vl":  # a vision-language config: the text model is the tiny one
        text = {k: v for k, v in _COMMON.items() if k not in ("head_dim", "tie_word_embeddings")}
        text["rope_parameters"] = {"rope_type": "default", "mrope_section": [2, 3, 3],
                                   "rope_theta": 10000.0}
        return AutoConfig.for_model(
            "qwen2_vl", text_config=text, tie_word_embeddings=False,
            vision_config=dict(depth=1, embed_dim=32, num_heads=2, hidden_size=48, mlp_ratio=2))
    kwargs = dict(_COMMON)
    kwargs.update(TINY_CONFIGS[model_type])
    return AutoConfig.for_model(model_type, **kwargs)


def vocab_size(model) -> int:
    config = model.config
    return (config.get_text_config() if hasattr(config, "get_text_config") else config).vocab_size


def train(model, steps: int, batch: int, seq: int, device, seed: int = 1234):
    """AdamW steps on random token batches; returns (losses, final eval logits)."""
    g = torch.Generator().manual_seed(seed)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    model.train()
    for _ in range(steps):
        ids = torch.randint(0, vocab_size(model), (batch, seq), generator=g).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.detach().float())
    model.eval()
    ids = torch.randint(0, vocab_size(model), (batch, seq), generator=g).to(device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.stack(losses), logits


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def build(model_type: str, config=None):
    """The family's causal-LM class (from the patch table) built from a tiny config."""
    import importlib

    from liger_aot.transformers.monkey_patch import MODEL_PATCHES

    patch = MODEL_PATCHES[model_type]
    cls = getattr(importlib.import_module(patch.module), patch.causal_lm[0])
    return cls(config or tiny_config(model_type))


def compare(model_type: str, dtype, device="cpu", steps: int = 3, batch: int = 2, seq: int = 12,
            topk: int = 5) -> dict:
    """Train the reference and the patched copy; return the worst relative differences."""
    from liger_aot.transformers.monkey_patch import apply_liger_kernel, revert_liger_kernel

    revert_liger_kernel(model_type)
    torch.manual_seed(0)
    reference = build(model_type).to(device, dtype)
    patched = copy.deepcopy(reference)
    # The reference trains first: the patch also replaces module-level functions (RoPE).
    ref_losses, ref_logits = train(reference, steps, batch, seq, device)
    apply_liger_kernel(model_type, model=patched)
    try:
        losses, logits = train(patched, steps, batch, seq, device)
    finally:
        revert_liger_kernel(model_type)
    ref_top = ref_logits.topk(topk, dim=-1)
    # Compare the patched logits at the reference's top-k positions (robust to near ties).
    top_logits = logits.gather(-1, ref_top.indices)
    # All weights as one vector: a per-tensor maximum is dominated by zero-initialised
    # biases, whose few Adam steps of size ~lr differ in sign on noise-level gradients.
    flat = lambda m: torch.cat([t.detach().double().flatten() for t in m.state_dict().values()])
    weights = rel(flat(patched), flat(reference))
    step_losses = max(abs(a - b) / abs(b) for a, b in zip(losses.tolist(), ref_losses.tolist()))
    return {"loss": step_losses, "topk_logits": rel(top_logits, ref_top.values),
            "weights": weights, "patched_classes": sorted(
                {type(m).__name__ for m in patched.modules()
                 if type(m).__name__.startswith("Liger")})}
