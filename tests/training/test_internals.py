"""The transformers and accelerate internals that training relies on (docs/internals.md), each pinned by a test that
fails if the internal changes: in one process and in seconds, so that they run under the lowest transformers the
project allows as well as the installed one. The DDP cases (the best-model barrier, the copies on each machine) are
in test_rank_faults.py, test_machines.py and test_trainer.py."""

import errno

import pytest
import torch
from conftest import make_model
from ddp_budget_worker import BUDGET, budget_dataset
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

from vaswani_mt.training.checkpoints import CheckpointError, is_complete
from vaswani_mt.training.trainer import VaswaniTrainer, _pass_every_batch

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]


def _budget_trainer(output_dir, tokenizer, max_steps: int = 2, save_steps: int = 1) -> VaswaniTrainer:
    """The tiny model on the token-budget data (tests/ddp_budget_worker.py), a checkpoint every `save_steps`."""
    args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=save_steps,
        optim="sgd",
        learning_rate=0.1,
        lr_scheduler_type="constant",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        logging_steps=1,
        seed=3,
    )
    return VaswaniTrainer(
        model=make_model(seed=0, dropout=0.0),
        args=args,
        train_dataset=budget_dataset(),
        data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100),  # pads with id 1, as the data's
        max_tokens_per_batch=BUDGET,
        lr_schedule="trainer",
    )


def test_a_failed_checkpoint_write_removes_its_folder_and_an_earlier_attempts_folder_is_replaced(
    tmp_path, tokenizer, monkeypatch, restore_rng
):
    """`VaswaniTrainer._save_checkpoint` wraps Trainer's private `_save_checkpoint(model, trial)`: if Trainer stopped
    calling it (renamed, another signature), the failure below would escape as a bare OSError with the folder left."""
    stale = tmp_path / "checkpoint-1"
    stale.mkdir()
    (stale / "from_an_earlier_attempt.txt").write_text("x")
    real_save = torch.save

    def full_disk_at_step_2(obj, f, *args, **kwargs):
        if "checkpoint-2" in str(f) and str(f).endswith("optimizer.pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk_at_step_2)
    trainer = _budget_trainer(tmp_path, tokenizer)
    with pytest.raises(CheckpointError, match=r"checkpoint-2.*No space left on device"):
        trainer.train()
    assert not (tmp_path / "checkpoint-2").exists()  # its weights were written, then removed with the folder
    assert is_complete(tmp_path / "checkpoint-1")
    assert not (stale / "from_an_earlier_attempt.txt").exists()


def test_the_token_budget_loader_drops_what_the_models_forward_does_not_take(tmp_path, tokenizer, restore_rng):
    """Trainer's private `_remove_unused_columns` takes the sampler's length columns away, as Trainer's own loaders
    do: were they left, the collator would hand `source_length` to the model's forward."""
    trainer = _budget_trainer(tmp_path, tokenizer)
    loader = trainer.get_train_dataloader()
    assert sorted(loader.dataset.column_names) == ["input_ids", "labels"]
    assert sorted(next(iter(loader))) == ["attention_mask", "input_ids", "labels"]


def test_a_prepared_loader_passes_every_batch_of_a_sampler_that_is_already_one_ranks():
    """accelerate's `prepare_data_loader` (what `Accelerator.prepare` runs) as rank 1 of 2 wraps the batch sampler in
    a `BatchSamplerShard` that reads `num_processes` and `process_index` when it iterates: `_pass_every_batch` sets
    them so that rank gets every batch of its own sampler, whole and in order."""
    from accelerate.data_loader import prepare_data_loader

    batches = [[0, 1], [2], [3, 4, 5], [6], [7, 8]]  # a token budget's batches: of unequal sizes
    loader = prepare_data_loader(DataLoader(list(range(9)), batch_sampler=batches), num_processes=2, process_index=1)
    assert [batch.tolist() for batch in loader] == [[2], [6], [0, 1]]  # accelerate's split, undone below
    _pass_every_batch(loader, batches)
    assert len(loader) == 5 and [batch.tolist() for batch in loader] == batches


def test_save_pretrained_asks_the_models_should_save_on_this_rank_whether_to_write_the_weights(tmp_path):
    """`VaswaniTrainer._writing_on_this_machine` sets `should_save_on_this_rank` on the model (transformers' answer
    is global rank 0 alone) so that each machine's main process writes its own copy's weights."""
    model = make_model()
    model.should_save_on_this_rank = lambda is_main_process: False
    model.save_pretrained(tmp_path / "not_here")
    assert not list((tmp_path / "not_here").glob("*.safetensors"))
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    model.save_pretrained(tmp_path / "here")
    assert (tmp_path / "here" / "model.safetensors").is_file()
    del model.should_save_on_this_rank  # the class's method again
    assert model.should_save_on_this_rank(True)  # one process, no process group: rank 0


def test_a_hyperparameter_search_is_refused(tmp_path, tokenizer):
    """Trainer would give each trial a folder of its own (its private `_get_output_dir`); the checkpoint guarantees
    and the resume look in `--output_dir` alone."""
    with pytest.raises(NotImplementedError, match="no hyperparameter search"):
        _budget_trainer(tmp_path, tokenizer).hyperparameter_search()
