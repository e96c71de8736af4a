"""The training job (`vaswani-mt-train`, `scripts/train.py`) with the paper's recipe (§5) through
`VaswaniTrainer` (trainer.py) and accelerate.

- `run_training`: the whole job, in stages (a folder holding a finished run left as it is: runs.py): `_prepare`
  (options, corpus, tokenizer, model, Trainer), `_train_or_skip` (training, resuming from the last complete
  checkpoint; a finished run resumed with `--resume_from_checkpoint` trains no further), `_preempted`
  (where a signal stopped it), `_score_and_publish` (checkpoint averaging (§6.1), test BLEU, and a Hub-ready folder
  with a model card).
- Early stopping on dev BLEU or loss (`--metric_for_best_model`, `--early_stopping_patience`): transformers'
  `EarlyStoppingCallback` and best-checkpoint bookkeeping, a checkpoint at each evaluation, and the published weights
  ending at the best checkpoint (`_finalize_model`).

The options are in `arguments.py`, the callbacks in `callbacks.py`, what the hardware decides in `hardware.py`.
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from datasets import DatasetDict
from transformers import (
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    TrainerState,
    set_seed,
)
from transformers.trainer_callback import ProgressCallback

from vaswani_mt.data.corpus import (
    DataError,
    describe_corpus,
    is_hub_id,
    load_run_corpus,
    source_target,
)
from vaswani_mt.data.tokenization import build_tokenizer, config_token_ids, tokenize_corpus
from vaswani_mt.evaluation.metrics import COMPOUND_SPLIT_LABEL, bleu, evaluate_bleu
from vaswani_mt.evaluation.terminology import choose_constrained_alpha
from vaswani_mt.hub.card import card_values, render_model_card
from vaswani_mt.model.configuration_vaswani import VaswaniConfig
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration

from .alignment_supervision import AlignmentCollator, add_alignment_labels, penultimate_head
from .arguments import DataArguments, ModelArguments, RecipeArguments, check_dataset_options, check_early_stopping
from .callbacks import (
    BudgetProgressCallback,
    CheckpointAtEvaluationCallback,
    CurvesCallback,
    PreemptionCallback,
    WallClockCallback,
    evaluations_without_improvement,
    trained_seconds,
)
from .checkpoints import (
    CheckpointError,
    average_checkpoints,
    checkpoint_step,
    is_complete,
    last_checkpoint,
    list_checkpoints,
    resume_point,
    unpickling_refused,
)
from .deadline import job_deadline
from .hardware import (
    apply_float32_overrides,
    configure_process,
    hardware_name,
    precision_name,
    resolve_attention,
    resolve_precision,
    use_every_core,
)
from .machines import (
    check_same_launch,
    from_rank_zero,
    is_lost_peer,
    is_store_failure,
    lost_machine_error,
    machines,
    rank_zero_first,
    settle_storage,
)
from .runs import already_finished, batch_layout, finished_by, keep_tokens_per_step
from .trainer import VaswaniTrainer

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# The job


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
    config = VaswaniConfig.from_preset(model_args.preset, attn_implementation=attention, **overrides)
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


def _dev_bleu_search(model, training_args: Seq2SeqTrainingArguments) -> str:
    """Sets the search of the dev BLEU at each evaluation and says which, for the log. Choosing a best checkpoint
    (`--metric_for_best_model`) searches greedily (`--generation_num_beams 1`) unless the command gives beams: it
    needs a cheap score at every evaluation, not the test's; a plain `--eval_bleu` keeps the model's own search."""
    training_args.predict_with_generate = True
    if training_args.generation_num_beams is None and training_args.metric_for_best_model is not None:
        training_args.generation_num_beams = 1
    beams = training_args.generation_num_beams or model.generation_config.num_beams or 1
    search = "greedy search" if beams == 1 else f"beam search, {beams} beams"
    if beams > 1:
        search += f", length penalty alpha {model.generation_config.length_penalty}"
    if training_args.generation_max_length is not None:
        return f"{search}, at most {training_args.generation_max_length} tokens"
    return f"{search}, each sentence at most its length + 50 tokens"


def _early_stopping(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments, resumed: TrainerState | None):
    """The callbacks that choose the best checkpoint (`--metric_for_best_model`) and stop on it
    (`--early_stopping_patience`): none without a metric. Trainer's own machinery does the rest
    (`load_best_model_at_end`, `best_model_checkpoint`, which `--save_total_limit` keeps); the patience counter goes
    on from a resumed checkpoint's."""
    if training_args.metric_for_best_model is None:
        return []
    training_args.load_best_model_at_end = True
    callbacks: list[TrainerCallback] = [CheckpointAtEvaluationCallback()]
    if recipe.early_stopping_patience is not None:
        stopping = EarlyStoppingCallback(recipe.early_stopping_patience)
        stopping.early_stopping_patience_counter = evaluations_without_improvement(resumed)
        callbacks.append(stopping)
    keep = recipe.average_last + (recipe.early_stopping_patience or 0)
    if training_args.save_total_limit and training_args.save_total_limit < keep:
        logger.warning(
            "--save_total_limit %d may delete checkpoints before the best one that --average_last %d averages: "
            "keep at least %d",
            training_args.save_total_limit,
            recipe.average_last,
            keep,
        )
    return callbacks


def _budget_progress_bar(trainer: VaswaniTrainer, clock: WallClockCallback) -> None:
    """Under a time budget, transformers' progress bar over `max_steps` becomes one over the budget's minutes."""
    if clock.budget_seconds and any(type(c) is ProgressCallback for c in trainer.callback_handler.callbacks):
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(BudgetProgressCallback(clock))


@dataclass
class _Run:
    """One run as `_prepare` sets it up, for the later stages of `run_training`."""

    trainer: VaswaniTrainer
    tokenizer: PreTrainedTokenizerBase
    corpus: DatasetDict  # the raw splits: the test split is scored and described from them
    output_dir: Path
    resume: str | None  # the checkpoint training resumes from, None for a fresh run
    resumed_state: TrainerState | None
    clock: WallClockCallback
    preemption: PreemptionCallback


def run_training(
    model_args: ModelArguments,
    data_args: DataArguments,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
    command: str = "",
    *,
    build_model: Callable[[ModelArguments, PreTrainedTokenizerBase], PreTrainedModel] = build_model,
    model_card: bool = True,
) -> dict:
    """The main job. Returns the test results (BLEU, signature, translations), where the model went and the step
    training ended at.

    Stopped by SIGINT or SIGTERM (`PreemptionCallback`), it saves a checkpoint at the end of the step and returns
    `preempted` (the signal, the step, the checkpoint and the exit status for the command line) instead: no
    averaging, scoring, results.json or model folder, which the run that finishes the job writes. A checkpoint
    that cannot be written raises `CheckpointError`, as does one whose state files hold more than tensors and plain
    values (Trainer loads them with `torch.load(weights_only=True)`, which refuses to unpickle anything else).

    `build_model(model_args, tokenizer)` makes the model to train (benchmarks/train_vs_marian.py passes a Marian
    one); `model_card=False` writes no README.md, whose card describes a vaswani_mt model.
    """
    started = time.monotonic()
    finished = already_finished(training_args)  # a finished run stays finished (runs.py): nothing read or written
    if finished is not None:
        return {"finished_before": finished, "output_dir": training_args.output_dir, "step": finished["step"]}
    run = _prepare(model_args, data_args, recipe, training_args, build_model)
    if recipe.job_minutes:
        run.clock.deadline = job_deadline(
            recipe.job_minutes, started, run.trainer.model, run.tokenizer, run.corpus,
            (data_args.source_lang, data_args.target_lang), test_bleu=recipe.test_bleu,
            choose_alpha=recipe.constrained_length_penalty is None, batch_size=training_args.per_device_eval_batch_size,
        )  # fmt: skip
    train_metrics = _train_or_skip(run, recipe)
    train_seconds = time.monotonic() - started

    result: dict = {"train": train_metrics, "output_dir": str(run.output_dir), "step": run.trainer.state.global_step}
    if run.preemption.signal_name:
        # Not the end of the job: averaging, scoring and the model folder wait for the run that finishes it.
        result["preempted"] = _preempted(run, training_args)
        return result  # the command says so, once
    if not run.trainer.is_world_process_zero():
        return result
    _score_and_publish(run, result, model_args, data_args, recipe, training_args, started=started,
                       train_seconds=train_seconds, command=command, model_card=model_card)  # fmt: skip
    return result


def _prepare(
    model_args: ModelArguments,
    data_args: DataArguments,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
    build_model: Callable[[ModelArguments, PreTrainedTokenizerBase], PreTrainedModel],
) -> _Run:
    """The options settled, the corpus, tokenizer and tokenized splits, the model and its Trainer, in this order: the
    seed is set before anything is built, and the model's initial weights are the first draws from it."""
    clock, preemption, output_dir = _settle_options(model_args, data_args, recipe, training_args)
    corpus, tokenizer, tokenized = _load_data(model_args, data_args, recipe, training_args, output_dir)
    model = build_model(model_args, tokenizer)
    if recipe.length_penalty is not None:
        model.generation_config.length_penalty = recipe.length_penalty
    if recipe.constrained_length_penalty is not None:
        model.generation_config.constrained_length_penalty = recipe.constrained_length_penalty
    logger.info(
        "model: preset %s, %.1fM parameters", model_args.preset, sum(p.numel() for p in model.parameters()) / 1e6
    )

    if recipe.eval_bleu:
        logger.info("dev BLEU at each evaluation: %s", _dev_bleu_search(model, training_args))
    resume = resume_point(training_args, output_dir)
    resumed_state = TrainerState.load_from_json(str(Path(resume, "trainer_state.json"))) if resume else None
    kept = keep_tokens_per_step(resume, resumed_state, data_args, training_args)  # another number of processes
    if kept and training_args.local_process_index == 0:  # one line a machine
        logger.warning(kept)
    clock.batch_layout = batch_layout(data_args, training_args)
    # With the model, the collator also builds decoder_input_ids from the labels (needed when Trainer's label
    # smoother takes the labels away from the forward call, as for the benchmarks' Marian).
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    alignment_head = None
    if recipe.alignment_supervision:
        tokenized["train"], collator, alignment_head = _supervise_alignment(model, tokenizer, tokenized, collator,
                                                                            training_args)  # fmt: skip
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
        alignment_head=alignment_head,
        alignment_lambda=recipe.alignment_lambda,
        bf16_weights=recipe.bf16_weights,
        callbacks=[clock, preemption, CurvesCallback(), *_early_stopping(recipe, training_args, resumed_state)],
    )
    _budget_progress_bar(trainer, clock)
    if training_args.restore_callback_states_from_checkpoint:
        # Trainer would replace the clock by a copy that the progress bar does not see; it restores itself.
        logger.warning("--restore_callback_states_from_checkpoint ignored: the wall clock resumes on its own")
        training_args.restore_callback_states_from_checkpoint = False
    return _Run(trainer, tokenizer, corpus, output_dir, resume, resumed_state, clock, preemption)


def _supervise_alignment(model, tokenizer, tokenized, collator, training_args):
    """The training split with eflomal's alignment labels, a collator that carries them, and the head to supervise
    (Garg et al. 2019; alignment_supervision.py); the model on eager attention (the one that returns weights)."""
    head = penultimate_head(model.config.num_decoder_layers)
    with training_args.main_process_first(desc="alignment labels"):
        train = add_alignment_labels(tokenized["train"], tokenizer)
    if model.config._attn_implementation != "eager":
        model.set_attn_implementation("eager")
    training_args.remove_unused_columns = False  # the collator drops the columns the model does not take
    logger.info("alignment supervision: decoder layer %d, head %d, eflomal labels on %d pairs", *head, len(train))
    return train, AlignmentCollator(collator, tokenizer.padding_side), head


def _settle_options(
    model_args: ModelArguments,
    data_args: DataArguments,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
) -> tuple[WallClockCallback, PreemptionCallback, Path]:
    """The options checked (before anything is loaded) and settled for this machine, the seed set, the output folder
    made; the clock and the preemption callback, which check their own options."""
    for name in ("length_penalty", "constrained_length_penalty"):
        value = getattr(recipe, name)
        if value is not None and not 0.0 <= value < float("inf"):
            raise ValueError(f"--{name} (GNMT alpha) must be a number >= 0, got {value}")
    check_dataset_options(data_args, recipe)
    check_early_stopping(recipe, training_args)
    resolve_precision(recipe, training_args)
    apply_float32_overrides(recipe, model_args, data_args, training_args)
    resolve_attention(model_args, training_args)
    configure_process(recipe)
    clock = WallClockCallback(recipe.checkpoint_minutes, recipe.time_budget_minutes)
    preemption = PreemptionCallback()
    set_seed(training_args.seed)  # before the model is built: its initial weights come from this seed
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if training_args.label_smoothing_factor:
        # The model's own loss is label-smoothed (config.label_smoothing); Trainer's smoother would apply it twice.
        model_args.label_smoothing = training_args.label_smoothing_factor
        training_args.label_smoothing_factor = 0.0
    return clock, preemption, output_dir


def _load_data(
    model_args: ModelArguments,
    data_args: DataArguments,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
    output_dir: Path,
) -> tuple[DatasetDict, PreTrainedTokenizerBase, DatasetDict]:
    """The corpus (the same on every machine), its tokenizer (trained by rank 0) and the tokenized splits."""
    languages = (data_args.source_lang, data_args.target_lang)
    if is_hub_id(data_args.dataset, languages):  # rank 0 downloads it first, and its failure is every rank's
        corpus = rank_zero_first(partial(load_run_corpus, data_args), "load the corpus", expected=(DataError,))
    else:
        corpus = load_run_corpus(data_args)
    if data_args.max_train_samples:
        corpus["train"] = corpus["train"].select(range(min(data_args.max_train_samples, len(corpus["train"]))))
    if data_args.max_eval_samples:
        for split in ("validation", "test"):
            corpus[split] = corpus[split].select(range(min(data_args.max_eval_samples, len(corpus[split]))))
    logger.info("corpus %s: %s", data_args.dataset, {k: len(v) for k, v in corpus.items()})
    where = machines()  # several machines: the same command and corpus on each, and who writes where
    check_same_launch(where, (model_args, data_args, recipe, training_args), corpus, languages)
    shared = settle_storage(where, training_args, output_dir)

    tokenizer = from_rank_zero(  # trained once, by global rank 0, and sent to every other rank
        partial(build_tokenizer, corpus, languages, output_dir, tokenizer=model_args.tokenizer,
                model_name_or_path=model_args.model_name_or_path, vocab_size=model_args.vocab_size,
                sample=model_args.tokenizer_sample),
        expected=(DataError, OSError, ValueError),
    )  # fmt: skip
    # A corpus cached on disk is tokenized by one process per cache (all machines' first, or each machine's), and
    # the others read the result; one held in memory is tokenized by each process.
    on_disk = any(split.cache_files for split in corpus.values())
    with training_args.main_process_first(local=not shared, desc="tokenizing") if on_disk else nullcontext():
        tokenized = tokenize_corpus(
            corpus,
            tokenizer,
            data_args.source_lang,
            data_args.target_lang,
            max_source_length=data_args.max_source_length,
            max_target_length=data_args.max_target_length,
            num_proc=data_args.preprocessing_num_workers,
        )
    return corpus, tokenizer, tokenized


def _train_or_skip(run: _Run, recipe: RecipeArguments) -> dict:
    """Trains (resuming from `run.resume`, if any) and returns Trainer's metrics; a resumed run that had finished (its
    time budget spent, or stopped early) trains no further and returns none. Either way the state is saved and the
    ranks leave the process group: after this, rank 0 works alone."""
    trainer, resume, resumed_state = run.trainer, run.resume, run.resumed_state
    spent = trained_seconds(resumed_state)
    stalled = evaluations_without_improvement(resumed_state)
    if resume and run.clock.budget_seconds and spent >= run.clock.budget_seconds:
        # A finished run started again: it trains no further (not even one step), it is scored again.
        logger.info("%s trained the whole time budget (%.1f minutes): no more training", resume, spent / 60)
        run.clock.stopped_by = "the time budget, --time_budget_minutes"
        trainer.state = resumed_state
        train_metrics = {}
    elif resume and recipe.early_stopping_patience and stalled >= recipe.early_stopping_patience:
        logger.info("%s stopped early (%d evaluations without improvement): no more training", resume, stalled)
        trainer.state = resumed_state
        train_metrics = {}
    else:
        if resume:
            logger.info("resuming from %s (%.1f minutes trained)", resume, spent / 60)
        # SIGINT/SIGTERM from here on end the step, save a checkpoint and stop (PreemptionCallback)
        with run.preemption.catching_signals():
            try:
                train_metrics = trainer.train(resume_from_checkpoint=resume).metrics
            except pickle.UnpicklingError as error:  # Trainer loads every state file with weights_only=True
                if not resume:
                    raise
                raise unpickling_refused(resume, error) from error
            except CheckpointError:  # under DDP every rank raises it at the same checkpoint: they leave together
                trainer.leave_process_group()
                raise
            except RuntimeError as error:  # a collective whose peer (or store) is gone: name it, leave at once
                if not (is_lost_peer(error) or is_store_failure(error)):
                    raise
                raise lost_machine_error(error, trainer.state.global_step) from error
    trainer.save_state()
    trainer.leave_process_group()  # from here on rank 0 works alone, and the other ranks exit cleanly
    return train_metrics


def _preempted(run: _Run, training_args: Seq2SeqTrainingArguments) -> dict:
    """results' `preempted` for a run a signal stopped: the signal, the step, the newest complete checkpoint (the
    stop's own, or an earlier one where a signal after the last step saved none) and the command's exit status."""
    step = run.trainer.state.global_step
    saved = run.output_dir / f"checkpoint-{step}"
    whole = {"resumable": not training_args.save_only_model, "processes": training_args.world_size}
    if not is_complete(saved, **whole):
        saved = last_checkpoint(run.output_dir, **whole)
    return {
        "signal": run.preemption.signal_name,
        "step": step,
        "checkpoint": str(saved) if saved else None,
        "exit_code": run.preemption.exit_code,
    }


def _score_and_publish(
    run: _Run,
    result: dict,
    model_args: ModelArguments,
    data_args: DataArguments,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
    *,
    started: float,
    train_seconds: float,
    command: str,
    model_card: bool,
) -> None:
    """Rank 0's end of a finished job, adding to `result`: the published weights (`_finalize_model`) and tokenizer
    saved, the test split scored, results.json and, with `model_card`, the card (README.md) written."""
    trainer, tokenizer, corpus, output_dir = run.trainer, run.tokenizer, run.corpus, run.output_dir
    use_every_core(training_args)
    final = _finalize_model(trainer, recipe, output_dir, model_args.attn_implementation, trained=bool(result["train"]))
    if training_args.metric_for_best_model is not None:
        result["best"] = _best_summary(trainer, final)
    if (
        recipe.test_bleu
        and recipe.constrained_length_penalty is None
        and isinstance(final, VaswaniForConditionalGeneration)
    ):
        # Chosen on dev, as §6.1 chose alpha (a Marian model of the benchmarks has no constrained search).
        sources, references = source_target(corpus["validation"], data_args.source_lang, data_args.target_lang)
        alpha, scores = choose_constrained_alpha(final, tokenizer, sources, references,
                                                 batch_size=training_args.per_device_eval_batch_size)  # fmt: skip
        final.generation_config.constrained_length_penalty = alpha
        result["constrained_length_penalty"] = {"alpha": alpha, "dev_bleu_with_terms": scores}
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
    result["finished_by"] = finished_by(trainer, run.clock)
    if model_card:
        _write_model_card(run, final, result, model_args, data_args, recipe, training_args, command)
    # Last: a folder with results.json holds a finished run, which the same command leaves as it is (runs.py).
    (output_dir / "results.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


def _write_model_card(
    run: _Run,
    final: PreTrainedModel,
    result: dict,
    model_args: ModelArguments,
    data_args: DataArguments,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
    command: str,
) -> None:
    """README.md: the Hub card of the published vaswani_mt model, with its results and how it was trained."""
    corpus, src, tgt = run.corpus, data_args.source_lang, data_args.target_lang
    values = card_values(
        final,
        run.tokenizer,
        source_lang=src,
        target_lang=tgt,
        corpus=describe_corpus(data_args.dataset, data_args.dataset_config, data_args.upsample_primary),
        examples=[row[src] for row in corpus["test"]["translation"][:3]],
        training={
            "preset": model_args.preset,
            "train_pairs": len(corpus["train"]),
            "test_pairs": len(corpus["test"]),
            "lr_scale": recipe.lr_scale,
            "warmup": training_args.warmup_steps,
            "max_tokens": data_args.max_tokens_per_batch,
            "steps": run.trainer.state.global_step,
            "train_minutes": result["train_minutes"],
            "hardware": hardware_name(),
            "precision": precision_name(training_args),
            "best": result.get("best"),  # only under --metric_for_best_model
        },
        test=result.get("test", {}),  # only under --test_bleu
        command=command,
    )
    (run.output_dir / "README.md").write_text(render_model_card(values), encoding="utf-8")


def _best_step(trainer: VaswaniTrainer) -> int | None:
    """The step of the best checkpoint by `--metric_for_best_model` (Trainer's `best_model_checkpoint`), None when
    no metric chooses one or no evaluated step was saved."""
    best = trainer.state.best_model_checkpoint if trainer.args.metric_for_best_model is not None else None
    if best is None:
        if trainer.args.metric_for_best_model is not None:
            logger.warning("no checkpoint was evaluated: publishing the last checkpoints, not the best")
        return None
    return checkpoint_step(best)


def _best_summary(trainer: VaswaniTrainer, final) -> dict:
    """results.json's `best`: the best checkpoint, its score, whether training stopped early, what was published."""
    metric = trainer.args.metric_for_best_model
    metric = metric if metric.startswith("eval_") else f"eval_{metric}"
    stopping = [c for c in trainer.callback_handler.callbacks if isinstance(c, EarlyStoppingCallback)]
    best = trainer.state.best_model_checkpoint
    summary = {
        "metric": metric,
        "value": trainer.state.best_metric,
        "checkpoint": Path(best).name if best else None,
        "stopped_early": any(c.early_stopping_patience_counter >= c.early_stopping_patience for c in stopping),
        "published": list(getattr(final, "averaged_from", [])),
    }
    names = summary["published"]
    published = f"the mean of {', '.join(names)}" if len(names) > 1 else (names or ["the final weights"])[0]
    logger.info("best checkpoint by %s: %s (%s)%s; published: %s", metric, summary["checkpoint"], summary["value"],
                ", stopped early" if summary["stopped_early"] else "", published)  # fmt: skip
    return summary


def _finalize_model(
    trainer: VaswaniTrainer, recipe: RecipeArguments, output_dir: Path, attention: str, trained: bool = True
):
    """The weights to publish: the mean of the last K checkpoints (§6.1) when there are several, else the final.

    Under `--metric_for_best_model` (early stopping) the window ends at the best checkpoint instead of the last:
    the mean of the K checkpoints up to and including the best (what averaging would have published had the run
    stopped there: the later ones scored worse on the dev set), read from disk even for K = 1, so that the published
    weights equal the best checkpoint's exactly, also when a finished run is started again and does not train. That
    keeps §6.1's averaging, which the paper applies to the checkpoints of a whole run, and picks where the run ends
    by the dev score; `--average_last 1` publishes the best checkpoint itself. `attention`: the implementation the
    model was trained with (`resolve_attention`), which the averaged one gets too."""
    model = trainer.model
    best = _best_step(trainer)
    checkpoints = list_checkpoints(output_dir, resumable=False, up_to_step=best)  # what average_checkpoints reads
    if (recipe.average_last > 1 and len(checkpoints) > 1) or ((best is not None or not trained) and checkpoints):
        averaged_dir = output_dir / "averaged"
        average_checkpoints(output_dir, recipe.average_last, averaged_dir, up_to_step=best)
        averaged = type(model).from_pretrained(averaged_dir, attn_implementation=attention)
        averaged.generation_config = model.generation_config
        averaged.averaged_from = [c.name for c in checkpoints[-recipe.average_last :]]
        shutil.rmtree(averaged_dir)
        return averaged.to(model.device).eval()
    model.averaged_from = []
    return model.eval()


def print_summary(result: dict, stream=None) -> None:
    """The end of the main job: BLEU with its signature, timings, and a few translations; on `stream`, or on
    sys.stdout as it is at the call (a redirected one too)."""
    stream = stream or sys.stdout
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


__all__ = ["build_model", "print_summary", "run_training"]
