"""Model patching on CPU (kernels through Triton's interpreter): the patch table matches the
installed transformers, instance and class patching, AutoLigerKernelForCausalLM, errors, and
convergence of a subset of families against unpatched Hugging Face models."""
import importlib

import pytest
import torch

from convergence import TOLERANCE, compare, tiny_config
from liger_aot.transformers import monkey_patch
from liger_aot.transformers.monkey_patch import (MODEL_PATCHES, apply_liger_kernel,
                                                 revert_liger_kernel)


@pytest.mark.parametrize("model_type", sorted(MODEL_PATCHES))
def test_table_names_exist_in_transformers(model_type):
    patch = MODEL_PATCHES[model_type]
    modeling = importlib.import_module(patch.module)
    for name in patch.rms_norm + patch.mlp + patch.causal_lm:
        assert hasattr(modeling, name), f"{patch.module} has no {name}"
    if patch.rope:
        assert hasattr(modeling, "apply_rotary_pos_emb")
    assert callable(getattr(monkey_patch, f"apply_liger_kernel_to_{model_type}"))


def test_unsupported_model_type_lists_supported():
    with pytest.raises(ValueError, match="supported: .*llama.*qwen3"):
        apply_liger_kernel("bert")
    from liger_aot.transformers.auto_model import AutoLigerKernelForCausalLM

    config = tiny_config("llama")
    config.model_type = "not_a_model"
    with pytest.raises(ValueError, match="no patch for model_type 'not_a_model'"):
        AutoLigerKernelForCausalLM.from_config(config)


def test_bad_flags():
    with pytest.raises(ValueError, match="cannot both be True"):
        apply_liger_kernel("llama", cross_entropy=True, fused_linear_cross_entropy=True)
    with pytest.raises(TypeError, match="unexpected keyword argument.*bogus"):
        monkey_patch.apply_liger_kernel_to_llama(bogus=True)


def test_instance_patch_inside_a_wrapper_and_revert():
    """A built model inside another module (as PEFT wraps it) is converted in place; its
    parameters and state-dict keys stay the same; revert restores the classes."""
    from transformers import AutoModelForCausalLM

    revert_liger_kernel("llama")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama"))
    wrapper = torch.nn.ModuleDict({"base_model": model})
    keys = list(wrapper.state_dict())
    params = [p.data_ptr() for p in wrapper.parameters()]
    try:
        monkey_patch.apply_liger_kernel_to_llama(model=wrapper)
        names = {type(m).__name__ for m in wrapper.modules()}
        assert {"LigerLlamaRMSNorm", "LigerLlamaMLP", "LigerLlamaForCausalLM"} <= names
        assert list(wrapper.state_dict()) == keys
        assert [p.data_ptr() for p in wrapper.parameters()] == params
        modeling = importlib.import_module(MODEL_PATCHES["llama"].module)
        assert modeling.LlamaRMSNorm.__name__ == "LigerLlamaRMSNorm"
        monkey_patch.apply_liger_kernel_to_llama(model=wrapper)  # twice: no change
        assert modeling.LlamaRMSNorm.__mro__[1].__name__ == "LlamaRMSNorm"
    finally:
        revert_liger_kernel("llama", model=wrapper)
    assert not any(type(m).__name__.startswith("Liger") for m in wrapper.modules())
    assert modeling.LlamaRMSNorm.__name__ == "LlamaRMSNorm"


def test_patch_reaches_classes_transformers_cached_before_it():
    # a model type built through the auto classes before the patch: transformers' lazy
    # package (and the top-level module) cached the original class, which the auto classes
    # return; the patch and its revert must rebind those too
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models import qwen2 as qwen2_package

    AutoModelForCausalLM.from_config(tiny_config("qwen2"))
    original = transformers.Qwen2ForCausalLM
    assert qwen2_package.Qwen2ForCausalLM is original
    try:
        monkey_patch.apply_liger_kernel_to_qwen2()
        assert qwen2_package.Qwen2ForCausalLM.__name__ == "LigerQwen2ForCausalLM"
        assert transformers.Qwen2ForCausalLM is qwen2_package.Qwen2ForCausalLM
        model = AutoModelForCausalLM.from_config(tiny_config("qwen2"))
        assert type(model).__name__ == "LigerQwen2ForCausalLM"
    finally:
        revert_liger_kernel("qwen2")
    assert qwen2_package.Qwen2ForCausalLM is original
    assert transformers.Qwen2ForCausalLM is original


def test_auto_model_from_config_and_pretrained(tmp_path):
    from liger_aot.transformers.auto_model import AutoLigerKernelForCausalLM

    try:
        model = AutoLigerKernelForCausalLM.from_config(tiny_config("qwen2"))
        assert type(model).__name__ == "LigerQwen2ForCausalLM"
        model.save_pretrained(tmp_path)
        revert_liger_kernel("qwen2")
        loaded = AutoLigerKernelForCausalLM.from_pretrained(str(tmp_path), swiglu=False)
        names = {type(m).__name__ for m in loaded.modules()}
        assert "LigerQwen2RMSNorm" in names and "LigerQwen2MLP" not in names
    finally:
        revert_liger_kernel("qwen2")


def test_eval_forward_returns_hf_logits_and_loss():
    """Not training: the patched model returns logits and Hugging Face's loss."""
    from transformers import AutoModelForCausalLM

    revert_liger_kernel("llama")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama")).eval()
    ids = torch.randint(0, 120, (2, 9))
    with torch.no_grad():
        ref = model(input_ids=ids, labels=ids)
        try:
            apply_liger_kernel("llama", model=model)
            out = model(input_ids=ids, labels=ids)
        finally:
            revert_liger_kernel("llama", model=model)
    assert out.logits is not None
    assert torch.allclose(out.logits, ref.logits, atol=1e-4, rtol=1e-4)
    assert torch.allclose(out.loss, ref.loss, atol=1e-5, rtol=1e-5)


def test_training_forward_skips_logits_and_honours_num_items_in_batch():
    from transformers import AutoModelForCausalLM

    revert_liger_kernel("llama")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama")).train()
    ids = torch.randint(0, 120, (2, 9))
    labels = ids.clone()
    labels[0, :4] = -100
    n_items = (labels[:, 1:] != -100).sum() * 2  # as a Trainer with 2 accumulation steps
    ref = model(input_ids=ids, labels=labels, num_items_in_batch=n_items)
    try:
        apply_liger_kernel("llama", model=model)
        out = model(input_ids=ids, labels=labels, num_items_in_batch=n_items)
    finally:
        revert_liger_kernel("llama", model=model)
    assert out.logits is None
    assert abs(out.loss.item() - ref.loss.item()) < 1e-4 * abs(ref.loss.item())


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convergence_cpu(model_type, dtype):
    result = compare(model_type, dtype, steps=3)
    loss_tol, logits_tol, weights_tol = TOLERANCE[dtype]
    assert result["patched_classes"], "nothing was patched"
    assert result["loss"] < loss_tol, result
    assert result["topk_logits"] < logits_tol, result
    assert result["weights"] < weights_tol, result
