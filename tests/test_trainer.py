"""Hugging Face Trainer and TRL's SFTTrainer run a few steps on a liger-aot-patched tiny model
(CPU, kernels through Triton's interpreter): the documented one-line integration."""
import pytest
import torch

from convergence import tiny_config
from liger_aot.transformers.monkey_patch import apply_liger_kernel_to_instance, revert_liger_kernel


class _TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _model():
    from transformers import AutoModelForCausalLM

    revert_liger_kernel("llama")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config("llama"))


def test_trainer_steps_on_patched_model(tmp_path):
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    model = _model()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1,
                             report_to=[], use_cpu=True, save_strategy="no")
    try:
        trainer = Trainer(model=apply_liger_kernel_to_instance(model), args=args,
                          train_dataset=_TokenDataset(12, 10, model.config.vocab_size))
        result = trainer.train()
    finally:
        revert_liger_kernel("llama", model=model)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(l == l and 0 < l < 20 for l in losses), losses
    assert result.global_step == 3


def test_sft_trainer_steps_on_patched_model(tmp_path):
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl import SFTConfig, SFTTrainer

    model = _model()
    g = torch.Generator().manual_seed(1)
    rows = [{"input_ids": torch.randint(1, model.config.vocab_size, (10,), generator=g).tolist()}
            for _ in range(12)]
    config = SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2,
                       learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True,
                       save_strategy="no", dataset_kwargs={"skip_prepare_dataset": True},
                       remove_unused_columns=False)
    try:
        trainer = SFTTrainer(model=apply_liger_kernel_to_instance(model), args=config,
                             train_dataset=datasets.Dataset.from_list(rows),
                             data_collator=_collate, processing_class=_tokenizer(120))
        trainer.train()
    finally:
        revert_liger_kernel("llama", model=model)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(l == l and l > 0 for l in losses), losses


def _tokenizer(vocab_size):
    """A word-level tokenizer built in memory: nothing is downloaded."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "t0")),
                                   pad_token="t0", eos_token="t1")


def _collate(rows):
    ids = torch.tensor([r["input_ids"] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
