"""The training step compiled (issue 64, item 1): `--torch_compile` (Seq2SeqTrainingArguments' own option, off by
default) compiles the model with its loss as one graph under VaswaniTrainer. On the tiny model: the loss and the
gradient equal eager's within float32 round-off, and the token-budget batches' changing shapes compile at most 3
graphs. The compiled loss runs over the vocabulary in chunks of rows (tests/model/test_fast_paths.py). The backend
here is `aot_eager` (the graph traced and differentiated as inductor gets it, without generating C++, which takes
minutes a graph on this machine); inductor's figures come from benchmarks/gpu_check.sh."""

import os
from unittest.mock import patch

import pytest
import torch
from conftest import PaddingOnlyTokenizer, make_model, one_sgd_step_arguments, rng_kept, uneven_pairs
from torch._dynamo.utils import counters
from transformers import DataCollatorForSeq2Seq

import vaswani_mt.model.fast_paths_vaswani as fast_paths
from vaswani_mt.training.trainer import COMPILE_CACHE, VaswaniTrainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def train(tmp_path, rows, per_device: int, compiled: bool, max_steps: int = 1, seed: int = 0):
    """VaswaniTrainer's SGD steps at lr 1 from the tiny model: the model after them and the logs."""
    torch._dynamo.reset()
    with rng_kept(), patch.dict(os.environ):  # TrainingArguments and the trainer set process-wide variables
        args = one_sgd_step_arguments(tmp_path, per_device, max_steps=max_steps, seed=seed)
        if compiled:
            args.torch_compile, args.torch_compile_backend = True, "aot_eager"
        model = make_model(seed=0, dropout=0.0)
        collator = DataCollatorForSeq2Seq(PaddingOnlyTokenizer(), label_pad_token_id=-100)
        trainer = VaswaniTrainer(model=model, args=args, train_dataset=rows, data_collator=collator,
                                 max_tokens_per_batch=None, lr_schedule="trainer")  # fmt: skip
        if compiled:
            assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path.resolve() / COMPILE_CACHE)
        trainer.train()
    return model, trainer.state.log_history


def test_the_compiled_step_gives_eager_loss_and_gradient(tmp_path, monkeypatch):
    """One SGD step at lr 1 on 4 pairs of unequal lengths: equal updates are equal gradients. The compiled loss in 4
    chunks of rows (a row budget that splits the tiny vocabulary so), eager's in one."""
    monkeypatch.setattr(fast_paths, "_COMPILED_LOSS_ROWS", 2**20)
    eager, eager_logs = train(tmp_path / "eager", uneven_pairs(), 4, compiled=False)
    before = counters["stats"]["unique_graphs"]
    compiled, compiled_logs = train(tmp_path / "compiled", uneven_pairs(), 4, compiled=True)
    assert counters["stats"]["unique_graphs"] - before == 1  # model and loss: one graph, no break
    assert compiled_logs[0]["loss"] == pytest.approx(eager_logs[0]["loss"], rel=1e-6)
    assert compiled_logs[0]["compile_seconds"] > 0 and "compile_seconds" not in eager_logs[0]
    start = make_model(seed=0, dropout=0.0).state_dict()
    compiled_weights = compiled.state_dict()
    for name, weight in eager.state_dict().items():
        torch.testing.assert_close(compiled_weights[name], weight, atol=1e-6, rtol=1e-5, msg=name)
    assert not torch.equal(start["model.decoder.layers.0.ffn.fc1.weight"], compiled_weights[
        "model.decoder.layers.0.ffn.fc1.weight"])  # fmt: skip


def test_padded_length_buckets_compile_at_most_three_graphs(tmp_path, monkeypatch):
    """Batches of 3 pairs over every length from 2 to 13 tokens, then a last batch of one pair: one graph for every
    batch size and length above 1, one more for the batch of 1 (torch specialises a size of 1); at most 3 in all,
    with a one-token target side. The loss in 4 chunks: rows that do not divide evenly compile no graph of their own."""
    monkeypatch.setattr(fast_paths, "_COMPILED_LOSS_ROWS", 2**20)
    rows = []
    for i in range(13):
        g = torch.Generator().manual_seed(i)
        source, target = 2 + i % 12, 2 + (i * 5) % 12
        rows.append({"input_ids": [*torch.randint(4, 200, (source - 1,), generator=g).tolist(), 2],
                     "labels": [*torch.randint(4, 200, (target - 1,), generator=g).tolist(), 2]})  # fmt: skip
    before = counters["stats"]["unique_graphs"]
    _, logs = train(tmp_path, rows, 3, compiled=True, max_steps=5)
    assert sum("loss" in row for row in logs) == 5
    assert counters["stats"]["unique_graphs"] - before == 2
