"""`--bf16_weights` (issue 64, item 2): the forward and backward run on bf16 copies of the weights, cast once per
optimizer step, while the optimizer updates the float32 weights (fairseq's FP16Optimizer's master weights). On the
tiny model, one SGD step at lr 1 (the update is the gradient): the loss and the update near bf16 autocast's, the
weights float32 after it; the copies cast once per step, not once per micro-batch."""

import os
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from conftest import PaddingOnlyTokenizer, make_model, one_sgd_step_arguments, rng_kept, uneven_pairs
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

from vaswani_mt.training.trainer import VaswaniTrainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def train(tmp_path, *, bf16_weights: bool, autocast: bool, per_device: int = 4, accumulation: int = 1,
          max_steps: int = 1):  # fmt: skip
    """VaswaniTrainer's SGD steps at lr 1 from the tiny model: the model, the logs, the trainer, and the dtype of
    the weight a decoder layer's first FFN product read at each micro-batch."""
    with rng_kept(), patch.dict(os.environ):
        args = one_sgd_step_arguments(tmp_path, per_device, accumulation, max_steps=max_steps)
        if autocast:  # as hardware.resolve_precision sets --bf16 after TrainingArguments' own checks
            args.bf16, args.mixed_precision = True, "bf16"
        model = make_model(seed=0, dropout=0.0)
        seen = []
        fc1 = model.model.decoder.layers[0].ffn.fc1
        fc1.register_forward_pre_hook(lambda module, _: seen.append(module.weight.dtype))
        collator = DataCollatorForSeq2Seq(PaddingOnlyTokenizer(), label_pad_token_id=-100)
        trainer = VaswaniTrainer(model=model, args=args, train_dataset=uneven_pairs(), data_collator=collator,
                                 lr_schedule="trainer", bf16_weights=bf16_weights)  # fmt: skip
        trainer.train()
    return model, trainer.state.log_history, trainer, seen


def test_bf16_weights_train_on_bf16_copies_and_update_float32_weights_as_autocast_does(tmp_path):
    start = make_model(seed=0, dropout=0.0).state_dict()
    ours, logs, _, seen = train(tmp_path / "weights", bf16_weights=True, autocast=False)
    autocast, autocast_logs, _, autocast_seen = train(tmp_path / "autocast", bf16_weights=False, autocast=True)
    assert seen == [torch.bfloat16] and autocast_seen == [torch.float32]  # autocast casts inside the product
    assert logs[0]["loss"] == pytest.approx(autocast_logs[0]["loss"], rel=1e-2)
    reference = autocast.state_dict()
    for name, weight in ours.state_dict().items():
        assert weight.dtype == torch.float32, name
        if name in ("final_logits_bias",) or not weight.is_floating_point():
            continue
        update, expected = (weight - start[name]).flatten(), (reference[name] - start[name]).flatten()
        if expected.abs().max() > 0:
            assert F.cosine_similarity(update, expected, dim=0).item() > 0.98, name


def test_bf16_weights_are_cast_once_per_optimizer_step_not_per_micro_batch(tmp_path):
    start = make_model(seed=0, dropout=0.0).lm_head.weight
    model, logs, trainer, seen = train(tmp_path, bf16_weights=True, autocast=False, per_device=1, accumulation=2,
                                       max_steps=2)  # fmt: skip
    assert seen == [torch.bfloat16] * 4 and trainer._bf16_copies.casts == 2
    assert sum("loss" in row for row in logs) == 2
    assert model.lm_head.weight.dtype == torch.float32 and not torch.equal(model.lm_head.weight, start)


def test_bf16_weights_refuse_several_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(Seq2SeqTrainingArguments, "world_size", property(lambda self: 2))
    with pytest.raises(ValueError, match=r"--bf16_weights trains one process without FSDP, not 2 processes: DDP"):
        train(tmp_path, bf16_weights=True, autocast=False)
