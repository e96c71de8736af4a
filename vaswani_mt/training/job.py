"""Training with the paper's recipe (§5) through transformers' `Seq2SeqTrainer` and accelerate.

- `paper_learning_rate`: Eq. (3), `lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`.
- `VaswaniTrainer`: `Seq2SeqTrainer` with token-budget batches (§5.1), the paper's schedule and Adam settings,
  and tokens per step / per second in the logs.
- `run_training`: the whole job: corpus, tokenizer, model, training (resuming from the last complete checkpoint),
  checkpoint averaging (§6.1), test BLEU, and a Hub-ready folder with a model card.

The options are in `arguments.py`, the callbacks in `callbacks.py`, what the hardware decides in `hardware.py`.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerState,
    set_seed,
)
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from vaswani_mt.data.batching import TokenBudgetBatchSampler, length_array
from vaswani_mt.data.corpus import (
    BUILTIN_CORPORA,
    BUILTIN_CORPUS,
    load_run_corpus,
    remove_damaged_cache_files,
    source_target,
)
from vaswani_mt.data.tokenization import config_token_ids, train_tokenizer
from vaswani_mt.evaluation.metrics import COMPOUND_SPLIT_LABEL, bleu, evaluate_bleu
from vaswani_mt.hub.card import render_model_card, search_summary, widget_yaml
from vaswani_mt.model.configuration_vaswani import VaswaniConfig
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration

from .arguments import DataArguments, ModelArguments, RecipeArguments, check_dataset_options
from .callbacks import (
    BudgetProgressCallback,
    CurvesCallback,
    PreemptionCallback,
    SamplerEpochCallback,
    WallClockCallback,
    trained_seconds,
)
from .checkpoints import (
    CheckpointError,
    average_checkpoints,
    describe_write_failure,
    is_complete,
    last_checkpoint,
    list_checkpoints,
    resume_point,
    unpickling_refused,
)
from .hardware import (
    apply_float32_overrides,
    configure_process,
    hardware_name,
    precision_name,
    resolve_attention,
    resolve_precision,
    use_every_core,
)

logger = logging.getLogger(__name__)


def paper_learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """§5.3 Eq. (3): `scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`, for update `step` >= 1.

    The rate rises linearly for `warmup_steps` updates, peaks at `scale * (d_model * warmup_steps)^-0.5`, then
    decays as the inverse square root of the step. `scale` is 1 in the paper; small models trained for minutes
    on a CPU can need another peak, hence the factor (`--lr_scale`).
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


# ---------------------------------------------------------------------------------------------------------------
# The Trainer


class VaswaniTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with the paper's batching and schedule, and token counts in the logs.

    `max_tokens_per_batch` switches the training DataLoader to `TokenBudgetBatchSampler` (per device; each rank
    gets distinct batches and the same number of steps). `lr_schedule="paper"` replaces `--lr_scheduler_type`
    and `--learning_rate` with Eq. (3) times `lr_scale`. Logs gain `source_tokens_per_step`,
    `target_tokens_per_step` (whole optimizer step, all processes), `target_tokens_per_second` (wall time) and
    `train_minutes` (wall time of training: since this process's first step, plus what a resumed run had logged
    before), so quality can be plotted against the clock.
    """

    def __init__(
        self,
        *args,
        max_tokens_per_batch: int | None = None,
        lr_schedule: str = "paper",
        lr_scale: float = 1.0,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if lr_schedule not in ("paper", "trainer"):
            raise ValueError(f"lr_schedule must be 'paper' or 'trainer', got {lr_schedule!r}")
        if not lr_scale > 0:
            raise ValueError(f"lr_scale (Eq. (3)'s multiplier) must be above 0, got {lr_scale}")
        self.max_tokens_per_batch = max_tokens_per_batch
        self.lr_schedule = lr_schedule
        self.lr_scale = lr_scale
        self.token_sampler: TokenBudgetBatchSampler | None = None
        self._token_counts = torch.zeros(2, dtype=torch.long)  # source, target tokens since the last log
        self._micro_batches = 0
        self._steps = 0.0  # optimizer steps since the last log; a short last step of an epoch counts whole
        self._window_start: float | None = None
        self._train_start: float | None = None
        if max_tokens_per_batch:
            self.add_callback(SamplerEpochCallback(self))

    def get_train_dataloader(self) -> DataLoader:
        if not self.max_tokens_per_batch:
            return super().get_train_dataloader()
        dataset = self.train_dataset
        sampler = TokenBudgetBatchSampler(
            length_array(dataset, "source_length"),
            length_array(dataset, "target_length"),
            self.max_tokens_per_batch,
            shuffle=True,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
            num_replicas=max(1, self.args.world_size),
            rank=self.args.process_index,
        )
        dataset = self._remove_unused_columns(dataset, description="training")
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory and torch.cuda.is_available(),
        )
        loader = self.accelerator.prepare(loader)
        # The sampler already gives each rank its own batches; accelerate's BatchSamplerShard would split them
        # again (transformers does the same for its BatchRebalanceSampler).
        shard = getattr(loader, "batch_sampler", None)
        if shard is not None and getattr(shard, "batch_sampler", None) is sampler:
            shard.num_processes, shard.process_index = 1, 0
        self.token_sampler = sampler
        return loader

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_schedule != "paper":
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            warmup = self.args.get_warmup_steps(num_training_steps)
            if warmup < 1:
                raise ValueError(f"the paper's schedule needs warmup_steps >= 1, got {self.args.warmup_steps}")
            for group in optimizer.param_groups:  # LambdaLR multiplies this base rate: Eq. (3)'s scale
                group["lr"] = self.lr_scale
            # LambdaLR's index 0 is the first update, the paper's step 1.
            schedule = partial(_paper_lambda, d_model=self.model.config.d_model, warmup=warmup)
            self.lr_scheduler = LambdaLR(optimizer, schedule)
        return self.lr_scheduler

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self._window_start is None:
            self._window_start = time.perf_counter()
        if self._train_start is None:
            # A resumed run goes on from the training minutes it had logged before it stopped.
            before = [row["train_minutes"] for row in self.state.log_history if "train_minutes" in row]
            self._train_start = self._window_start - 60 * max(before, default=0.0)
        self._micro_batches += 1
        # transformers gives an epoch's last update fewer micro-batches when they do not divide evenly
        self._steps += 1 / getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        self._token_counts[0] += int(inputs["attention_mask"].sum())
        self._token_counts[1] += int(inputs["labels"].ne(-100).sum())
        return super().training_step(model, inputs, num_items_in_batch)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and "eval_loss" not in logs and self._micro_batches:
            counts = self.accelerator.reduce(self._token_counts.to(self.args.device), reduction="sum").cpu()
            steps = max(round(self._steps, 6), 1e-9)
            seconds = max(time.perf_counter() - self._window_start, 1e-9)
            logs["source_tokens_per_step"] = round(int(counts[0]) / steps, 1)
            logs["target_tokens_per_step"] = round(int(counts[1]) / steps, 1)
            logs["target_tokens_per_second"] = round(int(counts[1]) / seconds, 1)
            logs["train_minutes"] = round((time.perf_counter() - self._train_start) / 60, 6)
            self._token_counts.zero_()
            self._micro_batches, self._steps, self._window_start = 0, 0.0, None
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial) -> None:
        """Trainer's checkpoint, with two guarantees more.

        - A folder of the same step from an earlier attempt (cut off by a kill, or a later checkpoint than the one
          this run resumed from) is removed first: a checkpoint never mixes the files of two attempts.
        - A failed write (a full disk, a file-size limit) removes the half-written folder and raises
          `CheckpointError`, which names the folder and the cause. The checkpoints before it are intact: Trainer
          deletes old ones (`--save_total_limit`) only after a new one is complete.

        Trainer writes into the final folder, `trainer_state.json` last, and `checkpoints.incomplete_reason` tells a
        cut-off folder from a complete one. A temporary folder renamed into place would not need that, but Trainer
        refers to the folder by its final path while it writes it (best-model bookkeeping, Hub uploads of
        checkpoints), so that would mean rewriting Trainer's method.
        """
        folder = Path(self._get_output_dir(trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save and folder.exists():
            shutil.rmtree(folder)
        self.accelerator.wait_for_everyone()  # under DDP every rank writes its RNG state there: after the removal
        try:
            super()._save_checkpoint(model, trial)
        except Exception as error:
            failure = describe_write_failure(folder, error)
            if self.args.should_save and not is_complete(folder):
                shutil.rmtree(folder, ignore_errors=True)
            raise CheckpointError(
                f"could not write checkpoint {folder}: {failure}; the checkpoints before it are intact, and the same "
                "command resumes from the last of them"
            ) from error

    def leave_process_group(self) -> None:
        """End this process's part in distributed training: wait for every rank, then close the process group.

        Call it on every rank once training is over. A rank that exits with the group still open can abort in
        gloo's teardown: a gloo worker thread frees the last collective's tensors after the interpreter started
        finalizing, which raises SIGABRT ("terminate called without an active exception"), and the launcher then
        kills the other ranks, rank 0 included, while it may still be writing the model. `destroy_process_group`
        alone does not stop gloo's threads while the DDP wrapper still holds the group, so the wrapper goes first.
        Afterwards rank 0 goes on as a single process with `self.model` (unwrapped). No-op without a group.
        """
        if not torch.distributed.is_available() or not torch.distributed.is_initialized():
            return
        self.accelerator.wait_for_everyone()
        self.model_wrapped = self.model
        self.accelerator.free_memory()  # drops the DDP wrapper, optimizer and loaders accelerate holds; runs gc
        self.accelerator.end_training()  # destroy_process_group; gloo's threads are joined as the group goes


def _paper_lambda(index: int, d_model: int, warmup: int) -> float:
    return paper_learning_rate(index + 1, d_model, warmup)


# ---------------------------------------------------------------------------------------------------------------
# The job


def build_tokenizer(model_args: ModelArguments, corpus, data_args: DataArguments, output_dir: Path):
    """A given tokenizer, the run's own from an earlier attempt (resume), or a new one trained on the train split."""
    saved = output_dir / "tokenizer"
    if model_args.tokenizer:
        return AutoTokenizer.from_pretrained(model_args.tokenizer)
    if model_args.model_name_or_path:
        return AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    if (saved / "tokenizer.json").is_file():
        logger.info("reusing this run's tokenizer from %s", saved)
        return AutoTokenizer.from_pretrained(saved)
    train = corpus["train"]
    if 0 < model_args.tokenizer_sample < len(train):
        rows = np.random.default_rng(0).choice(len(train), model_args.tokenizer_sample, replace=False)
        train = train.select(np.sort(rows))
    tokenizer = train_tokenizer(
        _side_texts(train, (data_args.source_lang, data_args.target_lang)), vocab_size=model_args.vocab_size
    )
    tmp = output_dir / "tokenizer.tmp"
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, saved)  # whole or not at all: a resumed run must find the very same vocabulary
    logger.info("trained a %d-token BPE vocabulary on %d sentences", len(tokenizer), len(train) * 2)
    return tokenizer


def _side_texts(pairs, languages: tuple[str, ...], batch_size: int = 10_000):
    """Every sentence of `pairs` on each side in turn (all sources, then all targets), streamed in batches: a
    corpus of millions of pairs is never a Python list."""
    for lang in languages:
        for batch in pairs.iter(batch_size=batch_size):
            yield from (row[lang] for row in batch["translation"])


def tokenize_corpus(corpus, tokenizer, data_args: DataArguments):
    """Adds input_ids / labels (both ending in EOS) and their lengths with `datasets.map` (in
    `--preprocessing_num_workers` processes; cached next to a corpus read from disk, so a rerun reuses it); drops
    over-long training pairs, with a count.

    The cache is keyed by datasets' fingerprint of the corpus and of `encode` / `short_enough` with what they
    capture (the tokenizer's vocabulary and settings, the languages, the maximum lengths), so a changed tokenizer,
    corpus or limit never reads an old result; cache files that are not whole are removed first and recomputed
    (`remove_damaged_cache_files`). The rows themselves were checked when the corpus was loaded."""
    src, tgt = data_args.source_lang, data_args.target_lang
    max_source, max_target = data_args.max_source_length, data_args.max_target_length

    def encode(batch):
        sources = [row[src] for row in batch["translation"]]
        targets = [row[tgt] for row in batch["translation"]]
        encoded = tokenizer(sources, text_target=targets)
        encoded["source_length"] = [len(ids) for ids in encoded["input_ids"]]
        encoded["target_length"] = [len(ids) for ids in encoded["labels"]]
        return encoded

    def short_enough(source_lengths, target_lengths):
        return [s <= max_source and t <= max_target for s, t in zip(source_lengths, target_lengths, strict=True)]

    workers = data_args.preprocessing_num_workers
    out = {}
    for split, dataset in corpus.items():
        remove_damaged_cache_files(dataset)
        dataset = dataset.map(encode, batched=True, remove_columns=dataset.column_names, num_proc=workers,
                              desc=f"tokenizing {split}")  # fmt: skip
        if split == "train":
            before = len(dataset)
            dataset = dataset.filter(short_enough, input_columns=["source_length", "target_length"], batched=True,
                                     batch_size=10_000, num_proc=workers)  # fmt: skip
            if len(dataset) < before:
                logger.warning(
                    "dropped %d of %d training pairs longer than %d source / %d target tokens",
                    before - len(dataset),
                    before,
                    max_source,
                    max_target,
                )
        out[split] = dataset
    return out


def build_model(model_args: ModelArguments, tokenizer) -> VaswaniForConditionalGeneration:
    # `auto` not yet resolved (`resolve_attention`, which needs the device and precision): transformers' default
    attention = None if model_args.attn_implementation == "auto" else model_args.attn_implementation
    if model_args.model_name_or_path:
        return VaswaniForConditionalGeneration.from_pretrained(
            model_args.model_name_or_path, attn_implementation=attention
        )
    overrides = config_token_ids(tokenizer)
    for name in ("dropout", "label_smoothing", "init_std", "d_model", "d_ff", "num_heads", "num_encoder_layers",
                 "num_decoder_layers", "d_k", "d_v", "position_encoding"):  # fmt: skip
        if getattr(model_args, name) is not None:
            overrides[name] = getattr(model_args, name)
    config = VaswaniConfig.from_preset(model_args.preset, **overrides)
    config._attn_implementation = attention
    return VaswaniForConditionalGeneration(config)


def _bleu_metric(tokenizer):
    def compute(prediction):
        predictions, labels = prediction.predictions, prediction.label_ids
        labels = [[t for t in row if t >= 0] for row in labels]
        predictions = [[t for t in row if t >= 0] for row in predictions]
        hyps = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        refs = tokenizer.batch_decode(labels, skip_special_tokens=True)
        return {"bleu": bleu([h.strip() for h in hyps], [r.strip() for r in refs])["score"]}

    return compute


def _budget_progress_bar(trainer: VaswaniTrainer, clock: WallClockCallback) -> None:
    """Under a time budget, transformers' progress bar over `max_steps` becomes one over the budget's minutes."""
    if clock.budget_seconds and any(type(c) is ProgressCallback for c in trainer.callback_handler.callbacks):
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(BudgetProgressCallback(clock))


def run_training(
    model_args: ModelArguments,
    data_args: DataArguments,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
    command: str = "",
    model_factory: Callable | None = None,
) -> dict:
    """The main job. Returns the test results (BLEU, signature, translations) and where the model went.

    Stopped by SIGINT or SIGTERM (`PreemptionCallback`), it saves a checkpoint at the end of the step and returns
    `preempted` (the signal, the step, the checkpoint and the exit status for the command line) instead: no
    averaging, scoring, results.json or model folder, which the run that finishes the job writes. A checkpoint
    that cannot be written raises `CheckpointError`, as does one whose state files hold more than tensors and plain
    values (Trainer loads them with `torch.load(weights_only=True)`, which refuses to unpickle anything else).

    `model_factory(model_args, tokenizer)` replaces the vaswani_mt model by another seq2seq model trained and
    scored by exactly the same pipeline (the benchmarks use it for MarianMTModel); such a model keeps its own
    loss, label-smoothed by the Trainer when `--label_smoothing_factor` is set.
    """
    started = time.monotonic()
    if recipe.length_penalty is not None and not 0.0 <= recipe.length_penalty < float("inf"):
        raise ValueError(f"--length_penalty (GNMT alpha) must be a number >= 0, got {recipe.length_penalty}")
    check_dataset_options(data_args, recipe)
    resolve_precision(recipe, training_args)
    apply_float32_overrides(recipe, model_args, data_args, training_args)
    resolve_attention(model_args, training_args)
    configure_process(recipe)
    clock = WallClockCallback(recipe.checkpoint_minutes, recipe.time_budget_minutes)
    preemption = PreemptionCallback()
    set_seed(training_args.seed)  # before the model is built: its initial weights come from this seed
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if training_args.label_smoothing_factor and model_factory is None:
        # The model's own loss is label-smoothed (config.label_smoothing); Trainer's smoother would apply it twice.
        model_args.label_smoothing = training_args.label_smoothing_factor
        training_args.label_smoothing_factor = 0.0

    corpus = load_run_corpus(data_args)
    if data_args.max_train_samples:
        corpus["train"] = corpus["train"].select(range(min(data_args.max_train_samples, len(corpus["train"]))))
    if data_args.max_eval_samples:
        for split in ("validation", "test"):
            corpus[split] = corpus[split].select(range(min(data_args.max_eval_samples, len(corpus[split]))))
    logger.info("corpus %s: %s", data_args.dataset, {k: len(v) for k, v in corpus.items()})

    with training_args.main_process_first(desc="tokenizer"):
        tokenizer = build_tokenizer(model_args, corpus, data_args, output_dir)
    tokenized = tokenize_corpus(corpus, tokenizer, data_args)
    model = (model_factory or build_model)(model_args, tokenizer)
    if recipe.length_penalty is not None:
        model.generation_config.length_penalty = recipe.length_penalty
    logger.info(
        "model: preset %s, %.1fM parameters", model_args.preset, sum(p.numel() for p in model.parameters()) / 1e6
    )

    if recipe.eval_bleu:
        training_args.predict_with_generate = True
    # With the model, the collator also builds decoder_input_ids from the labels (needed when Trainer's label
    # smoother takes the labels away from the forward call, as for the benchmarks' Marian).
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    trainer = VaswaniTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"].remove_columns(["source_length", "target_length"]),
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=_bleu_metric(tokenizer) if recipe.eval_bleu else None,
        max_tokens_per_batch=data_args.max_tokens_per_batch,
        lr_schedule=recipe.lr_schedule,
        lr_scale=recipe.lr_scale,
        callbacks=[clock, preemption, CurvesCallback()],
    )
    _budget_progress_bar(trainer, clock)

    resume = resume_point(training_args, output_dir)
    if training_args.restore_callback_states_from_checkpoint:
        # Trainer would replace the clock by a copy that the progress bar does not see; it restores itself.
        logger.warning("--restore_callback_states_from_checkpoint ignored: the wall clock resumes on its own")
        training_args.restore_callback_states_from_checkpoint = False
    resumed_state = TrainerState.load_from_json(str(Path(resume, "trainer_state.json"))) if resume else None
    spent = trained_seconds(resumed_state)
    if resume and clock.budget_seconds and spent >= clock.budget_seconds:
        # A finished run started again: it trains no further (not even one step), it is scored again.
        logger.info("%s trained the whole time budget (%.1f minutes): no more training", resume, spent / 60)
        trainer.state = resumed_state
        train_metrics = {}
    else:
        if resume:
            logger.info("resuming from %s (%.1f minutes trained)", resume, spent / 60)
        # SIGINT/SIGTERM from here on end the step, save a checkpoint and stop (PreemptionCallback)
        with preemption.catching_signals():
            try:
                train_metrics = trainer.train(resume_from_checkpoint=resume).metrics
            except pickle.UnpicklingError as error:  # Trainer loads every state file with weights_only=True
                if not resume:
                    raise
                raise unpickling_refused(resume, error) from error
    trainer.save_state()
    trainer.leave_process_group()  # from here on rank 0 works alone, and the other ranks exit cleanly
    train_seconds = time.monotonic() - started

    result: dict = {"train": train_metrics, "output_dir": str(output_dir)}
    if preemption.signal_name:
        # Not the end of the job: averaging, scoring and the model folder wait for the run that finishes it.
        saved = last_checkpoint(output_dir)
        step = trainer.state.global_step
        result["preempted"] = {
            "signal": preemption.signal_name,
            "step": step,
            "checkpoint": str(saved) if saved else None,
            "exit_code": preemption.exit_code,
        }
        logger.warning("stopped by %s at step %d (%s saved): not averaging, scoring or writing the model folder; "
                       "the same command resumes from there", preemption.signal_name, step, saved)  # fmt: skip
        return result
    if not trainer.is_world_process_zero():
        return result

    use_every_core(training_args)
    final = _finalize_model(trainer, recipe, output_dir)
    tokenizer.save_pretrained(output_dir)
    final.save_pretrained(output_dir)
    if recipe.test_bleu:
        sources, references = source_target(corpus["test"], data_args.source_lang, data_args.target_lang)
        test = evaluate_bleu(final, tokenizer, sources, references, target_lang=data_args.target_lang,
                             batch_size=training_args.per_device_eval_batch_size)  # fmt: skip
        result["test"] = {k: v for k, v in test.items() if k != "translations"}
        result["examples"] = [
            {"source": s, "reference": r, "translation": t}
            for s, r, t in zip(sources, references, test["translations"], strict=True)
        ][: max(recipe.show_translations, 0)]
        (output_dir / "test_translations.txt").write_text("\n".join(test["translations"]) + "\n", encoding="utf-8")
    result["wall_minutes"] = round((time.monotonic() - started) / 60, 2)
    result["train_minutes"] = round(train_seconds / 60, 2)
    (output_dir / "results.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    if isinstance(final, VaswaniForConditionalGeneration):
        values = _card_values(final, tokenizer, model_args, data_args, recipe, training_args, trainer, corpus, result,
                              command)  # fmt: skip
        (output_dir / "README.md").write_text(render_model_card(values), encoding="utf-8")
    return result


def _finalize_model(trainer: VaswaniTrainer, recipe: RecipeArguments, output_dir: Path):
    """The weights to publish: the mean of the last K checkpoints (§6.1) when there are several, else the final."""
    model = trainer.model
    checkpoints = list_checkpoints(output_dir, resumable=False)  # what average_checkpoints reads
    if recipe.average_last > 1 and len(checkpoints) > 1:
        averaged_dir = output_dir / "averaged"
        average_checkpoints(output_dir, recipe.average_last, averaged_dir)
        averaged = type(model).from_pretrained(averaged_dir, attn_implementation=model.config._attn_implementation)
        averaged.generation_config = model.generation_config
        averaged.averaged_from = [c.name for c in checkpoints[-recipe.average_last :]]
        shutil.rmtree(averaged_dir)
        return averaged.to(model.device).eval()
    model.averaged_from = []
    return model.eval()


def _card_values(model, tokenizer, model_args, data_args, recipe, training_args, trainer, corpus, result, command):
    config = model.config
    test = result.get("test", {})
    src, tgt = data_args.source_lang, data_args.target_lang
    examples = [row[src] for row in corpus["test"]["translation"][:3]] or ["Hello."]
    builtin = data_args.dataset in BUILTIN_CORPORA
    averaged = getattr(model, "averaged_from", [])
    return {
        "source_lang": src,
        "target_lang": tgt,
        "license": "gpl-2.0" if builtin else "apache-2.0",
        "dataset_id": "trans-de-en (Debian, Ding dictionary)" if builtin else data_args.dataset,
        "dataset_name": "Ding de-en dictionary sentence pairs" if builtin else data_args.dataset,
        "dataset_note": (
            "sentence-like example pairs of the Ding dictionary (GPL-2+), split by dictionary entry"
            + (", plus the multi-word phrases of the training entries" if data_args.dataset != BUILTIN_CORPUS else "")
            + (f"; each sentence {data_args.upsample_primary} times" if data_args.upsample_primary > 1 else "")
            if builtin
            else f"{data_args.dataset} {data_args.dataset_config or ''}".strip()
        ),
        "widget": widget_yaml(examples),
        "model_name": f"vaswani-mt-{model_args.preset}-{src}-{tgt}",
        "architecture": f"N = {config.num_encoder_layers}+{config.num_decoder_layers} layers, "
        f"d_model = {config.d_model}, d_ff = {config.d_ff}, h = {config.num_heads}, d_k = d_v = {config.d_k}",
        "vocab_size": len(tokenizer),
        "parameters": f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M",
        "preset": model_args.preset,
        "initialisation": f"every weight from N(0, {config.init_std}) (as MarianMTModel; the paper names none)"
        if config.init_std
        else "Xavier-uniform linear layers, N(0, d_model^-0.5) embeddings (tensor2tensor's)",
        "train_pairs": len(corpus["train"]),
        "lr_scale": recipe.lr_scale,
        "warmup": training_args.warmup_steps,
        "label_smoothing": config.label_smoothing,
        "dropout": config.dropout,
        "max_tokens": data_args.max_tokens_per_batch,
        "steps": trainer.state.global_step,
        "train_minutes": result.get("train_minutes", "?"),
        "hardware": hardware_name(),
        "precision": precision_name(training_args),
        "weights_note": f"the average of {len(averaged)} checkpoints ({', '.join(averaged)})"
        if averaged
        else "the final weights",
        "test_pairs": len(corpus["test"]),
        "bleu": round(test["score"], 2) if test else "null",
        "chrf": round(test["chrf"], 2) if test else "not evaluated",
        "signature": test.get("signature", "not evaluated"),
        "compound_split_bleu": round(test["compound_split_bleu"], 2) if test else "not evaluated",
        "compound_split_signature": test.get("compound_split_signature", "not evaluated"),
        "search": search_summary(model.generation_config),
        "command": command or "scripts/train.py",
        "limitations": "Trained on short dictionary example sentences (about 8 words): expect poor output on long, "
        "technical or informal text, and on names and numbers the dictionary does not contain."
        if builtin
        else "Quality outside the training domain is unknown.",
        "repo_id": f"USER/vaswani-mt-{src}-{tgt}",
        "example": examples[0].replace('"', '\\"'),
    }


def print_summary(result: dict, stream=sys.stdout) -> None:
    """The end of the main job: BLEU with its signature, timings, and a few translations."""
    test = result.get("test")
    if test:
        print(f"\ntest sacreBLEU = {test['score']:.2f}  (chrF {test['chrf']:.2f})", file=stream)
        print(f"signature: {test['signature']}", file=stream)
        if "compound_split_bleu" in test:  # the paper's scoring (§6.1's numbers), beside sacreBLEU
            print(f"test {COMPOUND_SPLIT_LABEL} = {test['compound_split_bleu']:.2f}", file=stream)
            print(f"signature: {test['compound_split_signature']}", file=stream)
    if "wall_minutes" in result:
        print(f"wall time: {result['wall_minutes']} min (training {result['train_minutes']} min)", file=stream)
    for example in result.get("examples", []):
        print(f"\n  source:      {example['source']}", file=stream)
        print(f"  translation: {example['translation']}", file=stream)
        print(f"  reference:   {example['reference']}", file=stream)
    print(f"\nmodel folder: {result['output_dir']}", file=stream)


__all__ = [
    "VaswaniTrainer",
    "build_model",
    "build_tokenizer",
    "paper_learning_rate",
    "print_summary",
    "run_training",
    "tokenize_corpus",
]
