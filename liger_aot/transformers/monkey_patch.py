"""Patching Hugging Face models: one table keyed by model_type, one patcher.

`apply_liger_kernel_to_<model_type>(rope=True, rms_norm=True, swiglu=True,
cross_entropy=False, fused_linear_cross_entropy=True, model=None)` is generated for every row
of MODEL_PATCHES. Without `model` it patches the classes and functions of the model's
`modeling_*` module (models built afterwards use liger-aot); with `model` it also converts the
already-built instance in place (weights untouched; PEFT wrappers are walked through).

Swapped modules keep their class's parameters and state-dict names: the patched class is a
subclass of the original that overrides only `forward`.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys
from dataclasses import dataclass

import torch

__all__ = ["MODEL_PATCHES", "apply_liger_kernel", "apply_liger_kernel_to_instance", "revert_liger_kernel",
           "supported_model_types"]


@dataclass(frozen=True)
class ModelPatch:
    module: str  # transformers modeling module
    causal_lm: tuple  # classes whose forward gets the fused linear cross-entropy path
    rms_norm: tuple = ()  # RMSNorm classes
    # How the model's RMSNorm rounds: "llama" (normalize in fp32, cast, times weight),
    # "gemma" (fp32 throughout, times 1 + weight), "olmo2" (fp32 throughout, times weight).
    rms_norm_style: str = "llama"
    mlp: tuple = ()  # gated MLP classes: down(act(gate(x)) * up(x)) or fused gate_up_proj
    rope: bool = True  # module-level apply_rotary_pos_emb (rotate-half layout)
    logits_softcap_attr: str | None = None  # config attribute: tanh softcap of the logits
    logits_scaling_attr: str | None = None  # config attribute: logits divided by it


def _row(name: str, prefix: str, **kw) -> ModelPatch:
    """The usual row: <Prefix>RMSNorm, <Prefix>MLP, <Prefix>ForCausalLM in modeling_<name>."""
    return ModelPatch(module=f"transformers.models.{name}.modeling_{name}",
                      causal_lm=kw.pop("causal_lm", (f"{prefix}ForCausalLM",)),
                      rms_norm=kw.pop("rms_norm", (f"{prefix}RMSNorm",)),
                      mlp=kw.pop("mlp", (f"{prefix}MLP",)), **kw)


MODEL_PATCHES = {
    "llama": _row("llama", "Llama"),
    "mistral": _row("mistral", "Mistral"),
    "mixtral": _row("mixtral", "Mixtral", mlp=()),  # experts are one fused module in v5
    "gemma": _row("gemma", "Gemma", rms_norm_style="gemma"),
    "gemma2": _row("gemma2", "Gemma2", rms_norm_style="gemma",
                   logits_softcap_attr="final_logit_softcapping"),
    "gemma3_text": _row("gemma3", "Gemma3", rms_norm_style="gemma",
                        logits_softcap_attr="final_logit_softcapping"),
    "qwen2": _row("qwen2", "Qwen2"),
    "qwen3": _row("qwen3", "Qwen3"),
    "qwen3_moe": _row("qwen3_moe", "Qwen3Moe"),
    "qwen2_vl": _row("qwen2_vl", "Qwen2VL", mlp=("Qwen2MLP",),
                     causal_lm=("Qwen2VLForConditionalGeneration",)),
    "phi3": _row("phi3", "Phi3"),
    "granite": _row("granite", "Granite", logits_scaling_attr="logits_scaling"),
    "olmo2": _row("olmo2", "Olmo2", rms_norm_style="olmo2"),
    "glm4": _row("glm4", "Glm4", rope=False),  # interleaved partial rotary: not this kernel
}

_RMS_STYLE = {"llama": (0.0, "llama"), "gemma": (1.0, "gemma"), "olmo2": (0.0, "gemma")}


def supported_model_types() -> list:
    return sorted(MODEL_PATCHES)


def _unsupported(model_type) -> ValueError:
    return ValueError(f"liger_aot has no patch for model_type {model_type!r}; supported: "
                      f"{', '.join(supported_model_types())}")


# -- replacement forwards ------------------------------------------------------------------

def _rms_norm_forward(offset, casting):
    def forward(self, hidden_states):
        from liger_aot.ops.rms_norm import rms_norm

        eps = getattr(self, "variance_epsilon", None)
        if eps is None:
            eps = getattr(self, "eps", 1e-6)
        weight = self.weight
        if weight.dtype != hidden_states.dtype:
            weight = weight.to(hidden_states.dtype)  # e.g. fp32 master weights, bf16 compute
        # in_place=False: writing dx over dy is wrong where dy feeds another node too
        # (Gemma-2's post-norms); the memory it saves is one transient buffer.
        return rms_norm(hidden_states, weight, eps, offset=offset, casting_mode=casting,
                        in_place=False)

    return forward


def _activation_kind(act_fn) -> str | None:
    """'silu' or 'gelu_tanh' for the activations the fused kernels implement, else None."""
    name = type(act_fn).__name__
    if name in ("SiLU", "SiLUActivation"):
        return "silu"
    if name in ("PytorchGELUTanh", "GELUTanh") or getattr(act_fn, "approximate", None) == "tanh":
        return "gelu_tanh"
    return None


def _gated_mlp_forward(original_forward):
    def forward(self, x):
        act_fn = getattr(self, "act_fn", None) or getattr(self, "activation_fn", None)
        kind = _activation_kind(act_fn)
        if kind is None:  # an activation without a fused kernel: keep the model's own math
            return original_forward(self, x)
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        if kind == "silu":
            from liger_aot.ops.swiglu import swiglu as fused
        else:
            from liger_aot.ops.geglu import geglu as fused
        # gate and up are this forward's own projections: their buffers take the gradients
        return self.down_proj(fused(gate, up, in_place=True))

    return forward


def _rope_function(original):
    def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        # Partial rotary (cos narrower than head_dim) is not this kernel's layout.
        if cos.shape[-1] != q.shape[-1] or q.device != cos.device:
            return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        from liger_aot.ops.rope import liger_rotary_pos_emb

        if cos.dtype != q.dtype:
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        if k.dtype != q.dtype:
            k = k.to(q.dtype)
        return liger_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    apply_rotary_pos_emb.liger_aot_original = original
    return apply_rotary_pos_emb


def _causal_lm_forward(original_forward, patch: ModelPatch):
    signature = inspect.signature(original_forward)

    # wraps: Trainer reads forward's signature to decide which dataset columns to keep.
    @functools.wraps(original_forward)
    def forward(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop("self")
        arguments.update(arguments.pop("kwargs", {}))
        labels = arguments.get("labels")
        shift_labels = arguments.get("shift_labels")
        # As Liger-Kernel: the fused loss (no logits) when training with labels; otherwise
        # the model's own forward, logits and loss exactly as Hugging Face computes them.
        if not self.training or (labels is None and shift_labels is None):
            return original_forward(self, *args, **kwargs)
        arguments.pop("labels", None)
        arguments.pop("logits_to_keep", None)
        shift_labels = arguments.pop("shift_labels", None)
        num_items_in_batch = arguments.get("num_items_in_batch")
        ignore_index = arguments.pop("ignore_index", -100)
        outputs = self.model(**arguments)
        hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") \
            else outputs[0]
        if shift_labels is None:
            shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        config = self.config.get_text_config() if hasattr(self.config, "get_text_config") \
            else self.config
        softcap = getattr(config, patch.logits_softcap_attr, None) \
            if patch.logits_softcap_attr else None
        if patch.logits_scaling_attr:
            hidden = hidden / getattr(config, patch.logits_scaling_attr)
        loss = fused_linear_cross_entropy_loss(
            hidden.reshape(-1, hidden.shape[-1]), self.lm_head.weight,
            shift_labels.reshape(-1).to(hidden.device), bias=self.lm_head.bias,
            ignore_index=ignore_index, softcap=softcap,
            reduction="sum" if num_items_in_batch is not None else "mean")
        if num_items_in_batch is not None:
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(loss.device)
            loss = loss / num_items_in_batch
        from transformers.modeling_outputs import CausalLMOutputWithPast

        rest = {k: v for k, v in outputs.items() if k != "last_hidden_state"} \
            if hasattr(outputs, "items") else {}
        return CausalLMOutputWithPast(loss=loss, logits=None, **rest)

    return forward


def fused_linear_cross_entropy_loss(hidden, weight, target, bias=None, ignore_index=-100,
                                    softcap=None, reduction="mean"):
    from liger_aot.ops.fused_linear_cross_entropy import fused_linear_cross_entropy

    return fused_linear_cross_entropy(hidden, weight, target, bias=bias,
                                      ignore_index=ignore_index, softcap=softcap,
                                      reduction=reduction)


_ORIGINAL_FIXED_CROSS_ENTROPY = [None]


def _liger_fixed_cross_entropy(source, target, num_items_in_batch=None, ignore_index=-100,
                               **kwargs):
    """transformers.loss.loss_utils.fixed_cross_entropy on the liger-aot kernel."""
    from liger_aot.ops.cross_entropy import cross_entropy

    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = cross_entropy(source, target, ignore_index=ignore_index, reduction=reduction)
    if reduction == "sum":
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


# -- the patcher -----------------------------------------------------------------------------

_PATCHED_CLASSES: dict = {}


def _patched_class(original: type, tag: str, forward_factory) -> type:
    """A subclass of `original` whose forward is forward_factory(original.forward); one per
    (original, tag), so patching twice changes nothing."""
    cls = _PATCHED_CLASSES.get((original, tag))
    if cls is None:
        cls = type(f"Liger{original.__name__}", (original,),
                   {"forward": forward_factory(original.forward),
                    "__module__": original.__module__,
                    "_liger_aot_patch": tag, "_liger_aot_original": original})
        _PATCHED_CLASSES[(original, tag)] = cls
    return cls


def _original(cls: type) -> type:
    return getattr(cls, "_liger_aot_original", cls)


def _swaps(patch: ModelPatch, rms_norm: bool, swiglu: bool, fused_linear_cross_entropy: bool):
    """(class names, tag, forward factory) for each kind of module to swap."""
    swaps = []
    if rms_norm:
        offset, casting = _RMS_STYLE[patch.rms_norm_style]
        factory = functools.partial(_rms_norm_factory, offset, casting)
        swaps += [(name, f"rms_norm:{patch.rms_norm_style}", factory) for name in patch.rms_norm]
    if swiglu:
        swaps += [(name, "gated_mlp", _gated_mlp_forward) for name in patch.mlp]
    if fused_linear_cross_entropy:
        factory = functools.partial(_causal_lm_factory, patch)
        swaps += [(name, "fused_linear_cross_entropy", factory) for name in patch.causal_lm]
    return swaps


def _rms_norm_factory(offset, casting, _original_forward):
    return _rms_norm_forward(offset, casting)


def _causal_lm_factory(patch, original_forward):
    return _causal_lm_forward(original_forward, patch)


def apply_liger_kernel(model_type: str, rope: bool = True, cross_entropy: bool = False,
                       fused_linear_cross_entropy: bool = True, rms_norm: bool = True,
                       swiglu: bool = True, model: torch.nn.Module | None = None,
                       **unused) -> None:
    """Patch one model family (see MODEL_PATCHES); with `model`, convert that instance too."""
    patch = MODEL_PATCHES.get(model_type)
    if patch is None:
        raise _unsupported(model_type)
    if cross_entropy and fused_linear_cross_entropy:
        raise ValueError("cross_entropy and fused_linear_cross_entropy cannot both be True: "
                         "the fused loss already computes the cross-entropy")
    unused.pop("geglu", None)  # Liger's gemma patchers name the gated MLP flag geglu
    for name in ("layer_norm", "rms_norm_offset"):
        unused.pop(name, None)
    if unused:
        raise TypeError(f"apply_liger_kernel_to_{model_type}() got unexpected keyword "
                        f"argument(s) {', '.join(sorted(unused))}")
    modeling = importlib.import_module(patch.module)
    swaps = _swaps(patch, rms_norm, swiglu, fused_linear_cross_entropy)
    by_original = {}
    for name, tag, factory in swaps:
        current = getattr(modeling, name, None)
        if current is None:
            continue  # class absent from this transformers version
        original = _original(current)
        patched = _patched_class(original, tag, factory)
        _rebind(modeling, name, patched)
        by_original[original] = patched
    if rope and patch.rope and hasattr(modeling, "apply_rotary_pos_emb"):
        current = modeling.apply_rotary_pos_emb
        original = getattr(current, "liger_aot_original", current)
        modeling.apply_rotary_pos_emb = _rope_function(original)
    if cross_entropy:
        import transformers.loss.loss_utils as loss_utils

        if loss_utils.fixed_cross_entropy is not _liger_fixed_cross_entropy:
            _ORIGINAL_FIXED_CROSS_ENTROPY[0] = loss_utils.fixed_cross_entropy
            loss_utils.fixed_cross_entropy = _liger_fixed_cross_entropy
    if model is not None:
        for module in model.modules():
            patched = by_original.get(_original(type(module)))
            if patched is not None and type(module) is not patched:
                module.__class__ = patched


def apply_liger_kernel_to_instance(model: torch.nn.Module, **kwargs) -> torch.nn.Module:
    """Patch a built model by its config's model_type and return it, so it fits in one line:
    `Trainer(model=apply_liger_kernel_to_instance(model), ...)`. Walks through wrappers
    (PEFT) to the first module with a config."""
    config = getattr(model, "config", None)
    if config is None:
        config = next((m.config for m in model.modules() if hasattr(m, "config")), None)
    if config is None:
        raise ValueError("apply_liger_kernel_to_instance needs a Hugging Face model (no "
                         ".config found on it or its submodules)")
    apply_liger_kernel(config.model_type, model=model, **kwargs)
    return model


def _rebind(modeling, name: str, cls: type) -> None:
    """Bind a class in its modeling module and in the re-exports transformers' lazy packages
    have cached (transformers.models.<family>.<name>, transformers.<name>): the auto classes
    look the class up there, so a model type used before the patch would keep its old class."""
    setattr(modeling, name, cls)
    package = sys.modules.get(modeling.__name__.rpartition(".")[0])
    for holder in (package, sys.modules.get("transformers")):
        cached = vars(holder).get(name) if holder is not None else None
        if isinstance(cached, type) and _original(cached) is _original(cls):
            setattr(holder, name, cls)


def revert_liger_kernel(model_type: str, model: torch.nn.Module | None = None) -> None:
    """Undo apply_liger_kernel for a model family (and an instance, when given)."""
    patch = MODEL_PATCHES.get(model_type)
    if patch is None:
        raise _unsupported(model_type)
    modeling = importlib.import_module(patch.module)
    for name in patch.rms_norm + patch.mlp + patch.causal_lm:
        current = getattr(modeling, name, None)
        if current is not None:
            _rebind(modeling, name, _original(current))
    current = getattr(modeling, "apply_rotary_pos_emb", None)
    if current is not None:
        modeling.apply_rotary_pos_emb = getattr(current, "liger_aot_original", current)
    import transformers.loss.loss_utils as loss_utils

    if loss_utils.fixed_cross_entropy is _liger_fixed_cross_entropy:
        loss_utils.fixed_cross_entropy = _ORIGINAL_FIXED_CROSS_ENTROPY[0]
    if model is not None:
        for module in model.modules():
            module.__class__ = _original(type(module))


def _make_apply(model_type: str):
    def apply(rope: bool = True, cross_entropy: bool = False,
              fused_linear_cross_entropy: bool = True, rms_norm: bool = True,
              swiglu: bool = True, model: torch.nn.Module | None = None, **kwargs) -> None:
        apply_liger_kernel(model_type, rope=rope, cross_entropy=cross_entropy,
                           fused_linear_cross_entropy=fused_linear_cross_entropy,
                           rms_norm=rms_norm, swiglu=swiglu, model=model, **kwargs)

    apply.__name__ = apply.__qualname__ = f"apply_liger_kernel_to_{model_type}"
    apply.__doc__ = (f"Patch Hugging Face {model_type} models with liger-aot kernels (see "
                     f"liger_aot.transformers.monkey_patch). Pass model= to convert an "
                     f"already-built instance as well.")
    return apply


for _model_type in MODEL_PATCHES:
    _fn = _make_apply(_model_type)
    globals()[_fn.__name__] = _fn
    __all__.append(_fn.__name__)
del _model_type, _fn
