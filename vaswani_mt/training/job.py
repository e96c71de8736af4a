"""The training job (`vaswani-mt-train`, `scripts/train.py`) with the paper's recipe (§5) through
`VaswaniTrainer` (trainer.py) and accelerate.

- `run_training`: the whole job: corpus, tokenizer, model, training (resuming from the last complete checkpoint),
  checkpoint averaging (§6.1), test BLEU, and a Hub-ready folder with a model card.

The options are in `arguments.py`, the callbacks in `callbacks.py`, what the hardware decides in `hardware.py`.
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import sys
import time
from pathlib import Path

from transformers import (
    DataCollatorForSeq2Seq,
    Seq2SeqTrainingArguments,
    TrainerState,
    set_seed,
)
from transformers.trainer_callback import ProgressCallback

from vaswani_mt.data.corpus import (
    describe_corpus,
    load_run_corpus,
    source_target,
)
from vaswani_mt.data.tokenization import build_tokenizer, config_token_ids, tokenize_corpus
from vaswani_mt.evaluation.metrics import COMPOUND_SPLIT_LABEL, bleu, evaluate_bleu
from vaswani_mt.hub.card import card_values, render_model_card
from vaswani_mt.model.configuration_vaswani import VaswaniConfig
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration

from .arguments import DataArguments, ModelArguments, RecipeArguments, check_dataset_options
from .callbacks import (
    BudgetProgressCallback,
    CurvesCallback,
    PreemptionCallback,
    WallClockCallback,
    trained_seconds,
)
from .checkpoints import (
    average_checkpoints,
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
) -> dict:
    """The main job. Returns the test results (BLEU, signature, translations) and where the model went.

    Stopped by SIGINT or SIGTERM (`PreemptionCallback`), it saves a checkpoint at the end of the step and returns
    `preempted` (the signal, the step, the checkpoint and the exit status for the command line) instead: no
    averaging, scoring, results.json or model folder, which the run that finishes the job writes. A checkpoint
    that cannot be written raises `CheckpointError`, as does one whose state files hold more than tensors and plain
    values (Trainer loads them with `torch.load(weights_only=True)`, which refuses to unpickle anything else).
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
    if training_args.label_smoothing_factor:
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
        tokenizer = build_tokenizer(
            corpus,
            (data_args.source_lang, data_args.target_lang),
            output_dir,
            tokenizer=model_args.tokenizer,
            model_name_or_path=model_args.model_name_or_path,
            vocab_size=model_args.vocab_size,
            sample=model_args.tokenizer_sample,
        )
    tokenized = tokenize_corpus(
        corpus,
        tokenizer,
        data_args.source_lang,
        data_args.target_lang,
        max_source_length=data_args.max_source_length,
        max_target_length=data_args.max_target_length,
        num_proc=data_args.preprocessing_num_workers,
    )
    model = build_model(model_args, tokenizer)
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
        src, tgt = data_args.source_lang, data_args.target_lang
        values = card_values(
            final,
            tokenizer,
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
                "steps": trainer.state.global_step,
                "train_minutes": result.get("train_minutes", "?"),
                "hardware": hardware_name(),
                "precision": precision_name(training_args),
            },
            test=result.get("test", {}),
            command=command,
        )
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
    "print_summary",
    "run_training",
    "tokenize_corpus",
]
