"""Training with the paper's recipe (§5) through transformers' `Seq2SeqTrainer` and accelerate.

- `paper_learning_rate`: Eq. (3), `lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`.
- `VaswaniTrainer`: `Seq2SeqTrainer` with token-budget batches (§5.1), the paper's schedule and Adam settings,
  and tokens per step / per second in the logs.
- `run_training`: the whole job: corpus, tokenizer, model, training (resuming from the last complete checkpoint),
  checkpoint averaging (§6.1), test BLEU, and a Hub-ready folder with a model card.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    TrainerState,
    set_seed,
)
from transformers.trainer_callback import ExportableState

from .allocator import retain_freed_memory
from .batching import TokenBudgetBatchSampler
from .checkpoints import average_checkpoints, last_checkpoint, list_checkpoints
from .configuration_vaswani import PRESETS, VaswaniConfig
from .data import (
    BUILTIN_CORPORA,
    BUILTIN_CORPUS,
    BUILTIN_CORPUS_WITH_DICTIONARY,
    EXTRA_DATA_TAG,
    REVERSE_TAG,
    load_corpus,
    source_target,
)
from .evaluation import bleu, evaluate_bleu
from .hub import render_model_card, search_summary, widget_yaml
from .modeling_vaswani import VaswaniForConditionalGeneration
from .tokenization import BPEDropoutCollator, train_tokenizer

logger = logging.getLogger(__name__)


def paper_learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """§5.3 Eq. (3): `scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`, for update `step` >= 1.

    The rate rises linearly for `warmup_steps` updates, peaks at `scale * (d_model * warmup_steps)^-0.5`, then
    decays as the inverse square root of the step. `scale` is 1 in the paper; small models trained for minutes
    on a CPU can need another peak, hence the factor (exposed as `--learning_rate`, a multiplier).
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


# ---------------------------------------------------------------------------------------------------------------
# Arguments: HfArgumentParser dataclasses next to Seq2SeqTrainingArguments


@dataclass
class ModelArguments:
    preset: str = field(default="base", metadata={"help": f"model shape: one of {sorted(PRESETS)}"})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "start from a saved vaswani_mt model (folder or Hub id) instead of a preset"}
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "reuse a saved tokenizer (folder or Hub id); default: train one"}
    )
    vocab_size: int = field(default=37000, metadata={"help": "size of the joint BPE vocabulary to train (§5.1)"})
    split_punctuation: bool = field(
        default=False,
        metadata={"help": "the trained BPE isolates punctuation marks (no `word.` tokens), as Moses-tokenized text"},
    )
    dropout: float | None = field(default=None, metadata={"help": "P_drop; default: the preset's"})
    label_smoothing: float | None = field(default=None, metadata={"help": "eps_ls; default: the preset's (0.1)"})
    init_std: float | None = field(
        default=None,
        metadata={"help": "every weight from N(0, init_std) (MarianMTModel: 0.02); default: the preset's"},
    )
    attn_implementation: str = field(
        default="auto",
        metadata={
            "help": "sdpa or eager; auto: eager when training on a CPU under bf16 autocast (1.15-1.54x the steps of "
            "sdpa there, whose CPU backward is slow for short sentences: RESULTS.md), sdpa elsewhere"
        },
    )
    d_model: int | None = field(default=None, metadata={"help": "model width; default: the preset's"})
    d_ff: int | None = field(default=None, metadata={"help": "inner FFN width; default: the preset's"})
    num_heads: int | None = field(default=None, metadata={"help": "attention heads h; default: the preset's"})
    num_encoder_layers: int | None = field(default=None, metadata={"help": "encoder layers N; default: the preset's"})
    num_decoder_layers: int | None = field(default=None, metadata={"help": "decoder layers N; default: the preset's"})


@dataclass
class DataArguments:
    dataset: str = field(
        default=BUILTIN_CORPUS,
        metadata={
            "help": "'ding' (built-in en-de), 'ding+phrases', 'ding+dictionary' (the same, more training pairs), "
            "a .jsonl/.tsv file, a PREFIX of PREFIX.<lang> files, or a Hub id"
        },
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset config, e.g. de-en for wmt14"})
    source_lang: str = field(default="en")
    target_lang: str = field(default="de")
    max_tokens_per_batch: int | None = field(
        default=4096,
        metadata={"help": "token budget per batch and device, each side (padded); 0 = Trainer's fixed batch size"},
    )
    bpe_dropout: float = field(
        default=0.0,
        metadata={
            "help": "BPE-dropout (Provilkov et al., 2020): each training pair is segmented anew with this probability "
            "of skipping each merge; 0 (the paper) segments deterministically"
        },
    )
    max_source_length: int = field(default=256, metadata={"help": "longer pairs are dropped (counted in the log)"})
    max_target_length: int = field(default=256)
    upsample_primary: int = field(
        default=1,
        metadata={"help": "ding+phrases/ding+dictionary: each training sentence N times per epoch (fairseq's)"},
    )
    tag_extra: bool = field(
        default=False,
        metadata={
            "help": "ding+phrases/ding+dictionary: start each extra (non-sentence) pair's source with the special "
            "token <extra>, so the model tells dictionary fragments from sentences (Caswell et al., 2019)"
        },
    )
    add_reverse: bool = field(
        default=False,
        metadata={
            "help": "also train on each training pair reversed (target -> source), its source started with the special "
            "token <reverse> (for ding+phrases: the sentences, not the phrases): one model, both directions "
            "(Johnson et al., 2017); untagged input translates source -> target as always"
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training pairs"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N dev/test pairs"})


@dataclass
class RecipeArguments:
    lr_schedule: str = field(
        default="paper",
        metadata={"help": "'paper' (Eq. 3, --learning_rate multiplies it) or 'trainer' (--lr_scheduler_type)"},
    )
    checkpoint_minutes: float | None = field(
        default=None, metadata={"help": "also save a checkpoint every M minutes of wall time (the paper: 10)"}
    )
    time_budget_minutes: float | None = field(
        default=None, metadata={"help": "stop training (with a checkpoint) after M minutes of wall time"}
    )
    cooldown_minutes: float = field(
        default=0.0,
        metadata={
            "help": "with --time_budget_minutes: the last M minutes take the learning rate linearly down to 0 "
            "(a cooldown; 0 = Eq. (3) to the end, the paper's schedule)"
        },
    )
    warmup_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Eq. (3) with its warmup measured on the clock: the rate rises linearly over the first M minutes "
            "of training to the peak that --warmup_steps gives, then falls as step^-0.5 from the update the "
            "warmup ended at; the schedule keeps its shape in minutes on a slow or a fast machine (default: "
            "--warmup_steps updates)"
        },
    )
    late_dropout: float | None = field(
        default=None,
        metadata={
            "help": "with --time_budget_minutes and --late_dropout_minutes: P_drop for the budget's last minutes, "
            "--dropout before ('late dropout', Liu et al., 2023: learn fast first, regularise once it memorises)"
        },
    )
    late_dropout_minutes: float = field(
        default=0.0, metadata={"help": "how many of the budget's last minutes train with --late_dropout"}
    )
    average_last: int = field(
        default=5, metadata={"help": "publish the mean of the last K checkpoints (§6.1; 1 = the final weights)"}
    )
    length_penalty: float | None = field(
        default=None,
        metadata={
            "help": "GNMT length penalty alpha saved in the model's generation_config.json: the test BLEU and every "
            "later generate() (translate, evaluate, pipeline, Hub) search with it; default: the paper's 0.6 (§6.1)"
        },
    )
    eval_bleu: bool = field(default=False, metadata={"help": "dev-set BLEU at each evaluation during training"})
    test_bleu: bool = field(default=True, metadata={"help": "sacreBLEU on the test split at the end"})
    show_translations: int = field(default=5, metadata={"help": "test sentences printed with their translations"})
    auto_bf16: bool = field(
        default=False,
        metadata={
            "help": "train with --bf16 where the hardware multiplies bf16 natively (a CUDA GPU with bf16, a CPU with "
            "AVX512-BF16 or AMX), in float32 elsewhere; --auto_bf16 false keeps float32 under a config that sets it"
        },
    )
    float32_max_tokens_per_batch: int | None = field(
        default=None,
        metadata={
            "help": "with --auto_bf16, where the hardware has no native bf16 (so training runs in float32): the "
            "token budget per batch instead of --max_tokens_per_batch; a float32 step is several times slower, and "
            "smaller batches keep enough updates in a time budget (RESULTS.md, tenth session)"
        },
    )
    float32_preset: str | None = field(
        default=None,
        metadata={
            "help": "with --auto_bf16, where the hardware has no native bf16 (so training runs in float32): the model "
            "shape instead of --preset's (--d_model etc. still apply on top); at a fixed time budget a smaller model "
            "that sees more tokens can learn more (the CPU preset: mini, RESULTS.md, eleventh session)"
        },
    )
    retain_freed_memory: bool = field(
        default=True,
        metadata={
            "help": "on Linux (glibc): malloc keeps freed memory for the next step instead of unmapping it, so the "
            "step's large buffers are not page-faulted again at every step (vaswani_mt.allocator); false: as is"
        },
    )
    config: str | None = field(default=None, metadata={"help": "a YAML or JSON file with any of these options"})


# The recipe's defaults for Seq2SeqTrainingArguments: §5.3 Adam, Eq. (3) with warmup 4000, no weight decay.
TRAINING_DEFAULTS = dict(
    learning_rate=1.0,
    warmup_steps=4000,
    adam_beta1=0.9,
    adam_beta2=0.98,
    adam_epsilon=1e-9,
    weight_decay=0.0,
    optim="adamw_torch_fused",
    max_grad_norm=0.0,
    logging_steps=50,
    save_steps=1000,
    save_total_limit=5,
    report_to=["tensorboard"],
    output_dir="outputs/run",
    per_device_train_batch_size=64,
    per_device_eval_batch_size=64,
    dataloader_drop_last=False,
    remove_unused_columns=True,
    predict_with_generate=False,
    ddp_find_unused_parameters=False,
)


# ---------------------------------------------------------------------------------------------------------------
# The Trainer


class VaswaniTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with the paper's batching and schedule, and token counts in the logs.

    `max_tokens_per_batch` switches the training DataLoader to `TokenBudgetBatchSampler` (per device; each rank
    gets distinct batches and the same number of steps). `lr_schedule="paper"` replaces `--lr_scheduler_type`
    with Eq. (3) times `--learning_rate`, times `lr_factor()` when one is given (the cooldown of
    `WallClockCallback`); with `warmup_clock` (a `WallClockCallback` with `warmup_minutes`), Eq. (3)'s warmup is
    measured on that clock (`clock_warmup_rate`). Logs gain `source_tokens_per_step`, `target_tokens_per_step` (whole
    optimizer step, all processes), `target_tokens_per_second` (wall time) and `train_minutes` (wall time of
    training: since this process's first step, plus what a resumed run had logged before), so quality can be
    plotted against the clock.
    """

    def __init__(
        self,
        *args,
        max_tokens_per_batch: int | None = None,
        lr_schedule: str = "paper",
        lr_factor: Callable[[], float] | None = None,
        warmup_clock: WallClockCallback | None = None,
        train_data_collator: Callable | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.train_data_collator = train_data_collator  # the training loader's, if not data_collator (BPE-dropout)
        if lr_schedule not in ("paper", "trainer"):
            raise ValueError(f"lr_schedule must be 'paper' or 'trainer', got {lr_schedule!r}")
        if lr_factor is not None and lr_schedule != "paper":
            raise ValueError("a learning-rate factor (the cooldown) needs lr_schedule='paper'")
        if warmup_clock is not None and (lr_schedule != "paper" or not warmup_clock.warmup_seconds):
            raise ValueError("a warmup on the clock needs lr_schedule='paper' and a clock with warmup_minutes")
        self.warmup_clock = warmup_clock
        self.max_tokens_per_batch = max_tokens_per_batch
        self.lr_schedule = lr_schedule
        self.lr_factor = lr_factor
        self.token_sampler: TokenBudgetBatchSampler | None = None
        self._token_counts = torch.zeros(2, dtype=torch.long)  # source, target tokens since the last log
        self._micro_batches = 0
        self._window_start: float | None = None
        self._train_start: float | None = None
        if max_tokens_per_batch:
            self.add_callback(_SamplerEpochCallback(self))

    def get_train_dataloader(self) -> DataLoader:
        if not self.max_tokens_per_batch:
            if self.train_data_collator is None:
                return super().get_train_dataloader()
            evaluation_collator, self.data_collator = self.data_collator, self.train_data_collator
            try:
                return super().get_train_dataloader()
            finally:
                self.data_collator = evaluation_collator
        dataset = self.train_dataset
        sampler = TokenBudgetBatchSampler(
            dataset["source_length"],
            dataset["target_length"],
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
            collate_fn=self.train_data_collator or self.data_collator,
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
            d_model = self.model.config.d_model
            # LambdaLR multiplies --learning_rate (the scale); its index 0 is the first update, the paper's step 1.
            if self.warmup_clock is not None:
                schedule = partial(
                    clock_warmup_rate, d_model=d_model, warmup=warmup, clock=self.warmup_clock, factor=self.lr_factor
                )
            else:
                schedule = partial(_paper_lambda, d_model=d_model, warmup=warmup, factor=self.lr_factor)
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
        self._token_counts[0] += int(inputs["attention_mask"].sum())
        self._token_counts[1] += int(inputs["labels"].ne(-100).sum())
        return super().training_step(model, inputs, num_items_in_batch)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and "eval_loss" not in logs and self._micro_batches:
            counts = self.accelerator.reduce(self._token_counts.to(self.args.device), reduction="sum").cpu()
            steps = self._micro_batches / self.args.gradient_accumulation_steps
            seconds = max(time.perf_counter() - self._window_start, 1e-9)
            logs["source_tokens_per_step"] = round(int(counts[0]) / steps, 1)
            logs["target_tokens_per_step"] = round(int(counts[1]) / steps, 1)
            logs["target_tokens_per_second"] = round(int(counts[1]) / seconds, 1)
            logs["train_minutes"] = round((time.perf_counter() - self._train_start) / 60, 6)
            self._token_counts.zero_()
            self._micro_batches, self._window_start = 0, None
        super().log(logs, start_time)

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


def _paper_lambda(index: int, d_model: int, warmup: int, factor: Callable[[], float] | None = None) -> float:
    return paper_learning_rate(index + 1, d_model, warmup) * (factor() if factor is not None else 1.0)


def clock_warmup_rate(
    index: int, d_model: int, warmup: int, clock: WallClockCallback, factor: Callable[[], float] | None = None
) -> float:
    """Eq. (3) with the warmup measured on `clock` (`WallClockCallback(warmup_minutes=M)`), for LambdaLR (`index` 0
    is update 1).

    The peak is Eq. (3)'s at `warmup` updates, `(d_model * warmup)^-0.5` (times `--learning_rate`). While the
    clock is inside its first M minutes, update `n` takes `peak * min(1, n / W')`, where `W'` is the number of
    updates the M minutes will hold at the rate measured so far (`warmup` itself before the first update is timed);
    once the clock has passed M minutes at update `W` (`clock.warmup_end_step`), update `n` takes
    `peak * (W / n)^0.5`: Eq. (3) with warmup `W` and the scale `(W / warmup)^0.5`. So a machine three times
    slower warms up over the same minutes, not over the first third of its budget. Rank 0's clock decides on
    every rank, and `W` is saved with the clock, so a resumed run keeps the schedule it had.
    """
    step = index + 1
    peak = paper_learning_rate(warmup, d_model, warmup)
    end = clock.warmup_end_step
    if end is not None and step > end:
        rate = peak * math.sqrt(end / step)
    else:
        timed_steps, seconds = clock.timed_steps, clock.elapsed
        expected = clock.warmup_seconds * timed_steps / seconds if timed_steps and seconds > 0 else warmup
        rate = peak * min(1.0, step / max(expected, 1.0))
    return rate * (factor() if factor is not None else 1.0)


class _SamplerEpochCallback(TrainerCallback):
    """Tells the token sampler the epoch before each epoch's batches are drawn, also in a resumed run, where
    transformers fast-forwards through a wrapper that does not pass `set_epoch` on."""

    def __init__(self, trainer: VaswaniTrainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.trainer.token_sampler is not None:
            self.trainer.token_sampler.set_epoch(math.floor(state.epoch + 1e-6) if state.epoch else 0)


class WallClockCallback(TrainerCallback, ExportableState):
    """Saves a checkpoint every `checkpoint_minutes` (the paper: 10) and stops, with a checkpoint, once
    `budget_minutes` have passed. All processes take the same decision (rank 0's clock).

    Each checkpoint's trainer_state.json records the seconds trained so far (`state()`), and a resumed run counts
    on from there: a crashed run finishes the budget it had left, not a new one (`trained_seconds`).

    `cooldown_minutes` (with a budget): `lr_factor()` falls linearly from 1 to 0 over the budget's last minutes, for
    `VaswaniTrainer(lr_factor=...)`. Eq. (3) alone still runs at half its peak when a half-hour budget ends, so the
    last weights are noisy; checkpoint averaging (§6.1) smooths that, a cooldown removes it (as in the
    warmup-stable-decay schedules). The factor is rank 0's clock on every rank, so all ranks use the same rate.

    `warmup_minutes`: the clock records the update at which the first M minutes of training ended
    (`warmup_end_step`, saved with the trained seconds) for `clock_warmup_rate`.
    """

    def __init__(
        self,
        checkpoint_minutes: float | None = None,
        budget_minutes: float | None = None,
        cooldown_minutes: float = 0,
        warmup_minutes: float | None = None,
    ):
        if cooldown_minutes and not budget_minutes:
            raise ValueError("cooldown_minutes needs a time budget (--time_budget_minutes): it ends the budget")
        if cooldown_minutes < 0 or (budget_minutes and cooldown_minutes > budget_minutes):
            raise ValueError(f"cooldown_minutes must be between 0 and the budget, got {cooldown_minutes}")
        if warmup_minutes is not None and not warmup_minutes > 0:
            raise ValueError(f"warmup_minutes must be above 0, got {warmup_minutes}")
        if warmup_minutes and budget_minutes and warmup_minutes >= budget_minutes:
            raise ValueError(f"warmup_minutes ({warmup_minutes}) must be less than the budget ({budget_minutes})")
        self.warmup_seconds = warmup_minutes * 60 if warmup_minutes else None
        self.warmup_end_step: int | None = None  # the update at which the warmup minutes ended
        self.timed_steps = 0  # updates done when `elapsed` was last measured
        self.checkpoint_seconds = checkpoint_minutes * 60 if checkpoint_minutes else None
        self.budget_seconds = budget_minutes * 60 if budget_minutes else None
        self.cooldown_seconds = cooldown_minutes * 60
        self.start = self.last_save = time.monotonic()
        self.elapsed = 0.0  # seconds of training on rank 0's clock at the last step

    def state(self) -> dict:
        return {
            "args": {
                "checkpoint_minutes": self.checkpoint_seconds / 60 if self.checkpoint_seconds else None,
                "budget_minutes": self.budget_seconds / 60 if self.budget_seconds else None,
                "cooldown_minutes": self.cooldown_seconds / 60,
                "warmup_minutes": self.warmup_seconds / 60 if self.warmup_seconds else None,
            },
            "attributes": {"trained_seconds": round(self.elapsed, 3), "warmup_end_step": self.warmup_end_step},
        }

    def on_train_begin(self, args, state, control, **kwargs):
        self.elapsed = trained_seconds(state)  # 0 unless resumed from a checkpoint that recorded it
        self.warmup_end_step = _clock_attribute(state, "warmup_end_step")
        self.timed_steps = getattr(state, "global_step", 0) or 0
        self.start = time.monotonic() - self.elapsed
        self.last_save = time.monotonic()

    def lr_factor(self) -> float:
        if not self.cooldown_seconds:
            return 1.0
        left = self.budget_seconds - self.elapsed
        return min(1.0, max(0.0, left / self.cooldown_seconds))

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        self.elapsed = now - self.start
        save = bool(self.checkpoint_seconds and now - self.last_save >= self.checkpoint_seconds)
        stop = bool(self.budget_seconds and self.elapsed >= self.budget_seconds)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flags = torch.tensor([int(save), int(stop), round(self.elapsed * 1000)], device=args.device)
            torch.distributed.broadcast(flags, src=0)
            save, stop, self.elapsed = bool(flags[0]), bool(flags[1]), int(flags[2]) / 1000
        self.timed_steps = getattr(state, "global_step", 0) or 0
        if self.warmup_seconds and self.warmup_end_step is None and self.elapsed >= self.warmup_seconds:
            self.warmup_end_step = max(self.timed_steps, 1)
            logger.info("warmup: %.1f minutes ended at update %d", self.warmup_seconds / 60, self.warmup_end_step)
        if stop:
            control.should_training_stop = True
            save = True
        if save:
            control.should_save = True
            self.last_save = now
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last_save = time.monotonic()


def _clock_attribute(state: TrainerState | None, name: str):
    saved = (getattr(state, "stateful_callbacks", None) or {}).get(WallClockCallback.__name__)
    if isinstance(saved, list):
        saved = saved[-1] if saved else None
    return ((saved or {}).get("attributes") or {}).get(name)


def trained_seconds(state: TrainerState | None) -> float:
    """Seconds of training a (resumed) TrainerState records, on WallClockCallback's clock; 0 when it has none."""
    return float(_clock_attribute(state, "trained_seconds") or 0.0)


def set_dropout(model: torch.nn.Module, p: float) -> int:
    """Sets P_drop of a vaswani_mt model in place: the dropout on every sublayer output and on the embedding sums
    (§5.4), as `config.dropout` does at construction; attention and activation dropout stay. Returns how many
    modules changed; raises for a model without them (another architecture, where `dropout` may mean another)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {p}")
    changed = 0
    for module in model.modules():  # by name: a model loaded as Hub remote code has its own copies of the classes
        if type(module).__name__ in ("VaswaniSublayer", "VaswaniEncoder", "VaswaniDecoder"):
            module.dropout = p
            changed += 1
    if not changed:
        raise ValueError(f"{type(model).__name__} has no vaswani_mt dropout to set (late dropout is for vaswani_mt)")
    return changed


class LateDropoutCallback(TrainerCallback):
    """Raises P_drop to `dropout` once the budget has `minutes` left (on rank 0's clock, shared by all ranks through
    `WallClockCallback`): "late dropout" (Liu et al., 2023, "Dropout Reduces Underfitting"), for a model that
    learns fastest without much dropout but starts memorising its data before the budget ends."""

    def __init__(self, clock: WallClockCallback, dropout: float, minutes: float):
        if not clock.budget_seconds:
            raise ValueError("late_dropout needs a time budget (--time_budget_minutes): it counts back from its end")
        if not 0 < minutes <= clock.budget_seconds / 60:
            raise ValueError(f"late_dropout_minutes must be in (0, budget], got {minutes}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"late_dropout must be in [0, 1), got {dropout}")
        self.clock, self.dropout, self.start_seconds = clock, dropout, clock.budget_seconds - minutes * 60
        self.switched_at: int | None = None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if self.switched_at is None and self.clock.elapsed >= self.start_seconds:
            set_dropout(model, self.dropout)
            self.switched_at = state.global_step
            logger.info("late dropout: P_drop %s from step %d (minute %.1f)", self.dropout, state.global_step,
                        self.clock.elapsed / 60)  # fmt: skip


class CurvesCallback(TrainerCallback):
    """Keeps the logged curves and draws them to `training_curves.png` in the output folder."""

    def __init__(self):
        self.history: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.history.append({"step": state.global_step, **logs})

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            plot_curves(self.history, Path(args.output_dir) / "training_curves.png")

    on_train_end = on_save


def plot_curves(history: list[dict], path: Path) -> Path | None:
    """Loss, dev loss, learning rate, tokens/s and dev BLEU against the step, in one PNG."""
    panels = [
        ("loss", ["loss", "eval_loss"]),
        ("learning rate", ["learning_rate"]),
        ("target tokens / s", ["target_tokens_per_second"]),
        ("dev BLEU", ["eval_bleu"]),
    ]
    panels = [(title, keys) for title, keys in panels if any(k in row for row in history for k in keys)]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.5), squeeze=False)
    for axis, (title, keys) in zip(axes[0], panels, strict=True):
        for key in keys:
            points = [(row["step"], row[key]) for row in history if key in row]
            if points:
                axis.plot(*zip(*points, strict=True), marker="." if len(points) < 30 else None, label=key)
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.legend(fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    figure.savefig(tmp, dpi=100)
    plt.close(figure)
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------------------------
# The job


def data_tags(data_args: DataArguments) -> dict[str, str]:
    """The special tokens that options put at the start of training sources, each with its option's name."""
    options = {"tag_extra": EXTRA_DATA_TAG, "add_reverse": REVERSE_TAG}
    return {option: tag for option, tag in options.items() if getattr(data_args, option)}


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
    sources, targets = source_target(corpus["train"], data_args.source_lang, data_args.target_lang)
    specials = list(data_tags(data_args).values())
    for tag in specials:  # a tag is a token of its own, not text for BPE to learn merges from
        sources = [text.removeprefix(f"{tag} ") for text in sources]
    tokenizer = train_tokenizer(
        sources + targets,
        vocab_size=model_args.vocab_size,
        split_punctuation=model_args.split_punctuation,
        extra_special_tokens=specials,
    )
    tmp = output_dir / "tokenizer.tmp"
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, saved)  # whole or not at all: a resumed run must find the very same vocabulary
    logger.info("trained a %d-token BPE vocabulary on %d sentences", len(tokenizer), len(sources) * 2)
    return tokenizer


def tokenize_corpus(corpus, tokenizer, data_args: DataArguments):
    """Adds input_ids / labels (both ending in EOS) and their lengths; drops over-long pairs, with a count."""
    src, tgt = data_args.source_lang, data_args.target_lang

    def encode(batch):
        sources = [row[src] for row in batch["translation"]]
        targets = [row[tgt] for row in batch["translation"]]
        encoded = tokenizer(sources, text_target=targets)
        encoded["source_length"] = [len(ids) for ids in encoded["input_ids"]]
        encoded["target_length"] = [len(ids) for ids in encoded["labels"]]
        return encoded

    out = {}
    for split, dataset in corpus.items():
        dataset = dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc=f"tokenizing {split}")
        if split == "train":
            before = len(dataset)
            dataset = dataset.filter(
                lambda s, t: s <= data_args.max_source_length and t <= data_args.max_target_length,
                input_columns=["source_length", "target_length"],
            )
            if len(dataset) < before:
                logger.warning(
                    "dropped %d of %d training pairs longer than %d source / %d target tokens",
                    before - len(dataset),
                    before,
                    data_args.max_source_length,
                    data_args.max_target_length,
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
    overrides = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.bos_token_id,
    }
    for name in ("dropout", "label_smoothing", "init_std", "d_model", "d_ff", "num_heads", "num_encoder_layers",
                 "num_decoder_layers"):  # fmt: skip
        if getattr(model_args, name) is not None:
            overrides[name] = getattr(model_args, name)
    config = VaswaniConfig.from_preset(model_args.preset, **overrides)
    config._attn_implementation = attention
    return VaswaniForConditionalGeneration(config)


def native_bf16() -> bool:
    """Whether this machine multiplies bf16 natively: a CUDA GPU that supports it, or a CPU with AVX512-BF16 or AMX.

    Elsewhere torch emulates bf16 products on the CPU, slower than float32, so `--auto_bf16` leaves them off.
    """
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    checks = (getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return any(check() for check in checks if check is not None)


def resolve_precision(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """Applies `--auto_bf16`, and warns when `--bf16` is asked for on a CPU that would emulate it."""
    if training_args.fp16:
        return
    native = native_bf16()
    if recipe.auto_bf16 and not training_args.bf16:
        if native:  # what TrainingArguments.__post_init__ derives from --bf16, which has already run
            training_args.bf16, training_args.mixed_precision = True, "bf16"
        logger.info("--auto_bf16: %s", "bf16 autocast (native bf16 here)" if native else "float32 (no native bf16)")
    elif training_args.bf16 and not native:
        logger.warning(
            "--bf16 on hardware without native bf16 (no AVX512-BF16 or AMX on this CPU): the products are emulated "
            "and likely slower than float32; --bf16 false or --auto_bf16 true avoids that"
        )


def resolve_float32(
    recipe: RecipeArguments, model_args: ModelArguments, data_args: DataArguments, training_args
) -> tuple[str, int | None]:
    """Applies `--float32_preset` and `--float32_max_tokens_per_batch` (after `resolve_precision`): where
    `--auto_bf16` found no native bf16, training runs in float32 with that model shape and token budget per batch.
    Returns the preset and the token budget trained with."""
    value = recipe.float32_max_tokens_per_batch
    if value is not None and value < 1:
        raise ValueError(f"--float32_max_tokens_per_batch must be at least 1, got {value}")
    if recipe.float32_preset is not None and recipe.float32_preset not in PRESETS:
        raise ValueError(f"--float32_preset: unknown preset {recipe.float32_preset!r}; choose one of {sorted(PRESETS)}")
    if recipe.auto_bf16 and not (training_args.bf16 or training_args.fp16):
        if value:
            logger.info("--float32_max_tokens_per_batch: %d tokens per batch (float32 here), not %s", value,
                        data_args.max_tokens_per_batch)  # fmt: skip
            data_args.max_tokens_per_batch = value
        if recipe.float32_preset and not model_args.model_name_or_path:
            logger.info("--float32_preset: the %s shape (float32 here), not %s", recipe.float32_preset,
                        model_args.preset)  # fmt: skip
            model_args.preset = recipe.float32_preset
    return model_args.preset, data_args.max_tokens_per_batch


ATTENTION_IMPLEMENTATIONS = ("auto", "sdpa", "eager")


def auto_attention(device_type: str, bf16: bool) -> str:
    """What `--attn_implementation auto` picks for training: eager on a CPU under bf16 autocast, sdpa elsewhere."""
    return "eager" if device_type == "cpu" and bf16 else "sdpa"


def resolve_attention(model_args: ModelArguments, training_args: Seq2SeqTrainingArguments) -> str:
    """Applies `--attn_implementation auto` (after `resolve_precision`) and returns the implementation trained with.

    Measured on a 2-core AVX-512 BF16 CPU, small preset, 1920-token batches (`benchmarks/speed_train.py --mode
    attention`): under bf16 autocast eager attention takes 1.15-1.54x fewer seconds per training step than torch's
    CPU flash-attention kernel, whose backward pass dominates at 4-48 tokens per sentence; in float32 the two are
    within 7%. On a GPU, sdpa (flash or memory-efficient kernels) is the one to use. Both compute Eq. (1) and give
    equal outputs (tests/test_modeling_vaswani.py), so the choice changes speed only.
    """
    choice = model_args.attn_implementation
    if choice not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"--attn_implementation must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, got {choice!r}")
    if choice == "auto":
        choice = auto_attention(training_args.device.type, training_args.bf16)
        logger.info("--attn_implementation auto: %s", choice)
    model_args.attn_implementation = choice
    return choice


def _precision(training_args: Seq2SeqTrainingArguments) -> str:
    if training_args.bf16:
        return "bf16 autocast (float32 weights, optimizer and loss)"
    if training_args.fp16:
        return "fp16 mixed precision"
    return "float32"


def _bleu_metric(tokenizer):
    def compute(prediction):
        predictions, labels = prediction.predictions, prediction.label_ids
        labels = [[t for t in row if t >= 0] for row in labels]
        predictions = [[t for t in row if t >= 0] for row in predictions]
        hyps = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        refs = tokenizer.batch_decode(labels, skip_special_tokens=True)
        return {"bleu": bleu([h.strip() for h in hyps], [r.strip() for r in refs])["score"]}

    return compute


def run_training(
    model_args: ModelArguments,
    data_args: DataArguments,
    recipe: RecipeArguments,
    training_args: Seq2SeqTrainingArguments,
    command: str = "",
    model_factory: Callable | None = None,
) -> dict:
    """The main job. Returns the test results (BLEU, signature, translations) and where the model went.

    `model_factory(model_args, tokenizer)` replaces the vaswani_mt model by another seq2seq model trained and
    scored by exactly the same pipeline (the benchmarks use it for MarianMTModel); such a model keeps its own
    loss, label-smoothed by the Trainer when `--label_smoothing_factor` is set.
    """
    started = time.monotonic()
    if recipe.length_penalty is not None and not 0.0 <= recipe.length_penalty < float("inf"):
        raise ValueError(f"--length_penalty (GNMT alpha) must be a number >= 0, got {recipe.length_penalty}")
    resolve_precision(recipe, training_args)
    resolve_float32(recipe, model_args, data_args, training_args)
    resolve_attention(model_args, training_args)
    if recipe.retain_freed_memory:
        retain_freed_memory()
    clock = WallClockCallback(
        recipe.checkpoint_minutes, recipe.time_budget_minutes, recipe.cooldown_minutes, recipe.warmup_minutes
    )
    late_dropout = None
    if recipe.late_dropout is not None or recipe.late_dropout_minutes:
        if recipe.late_dropout is None or not recipe.late_dropout_minutes:
            raise ValueError("late dropout needs both --late_dropout P and --late_dropout_minutes M")
        if model_factory is not None:
            raise ValueError("late dropout sets vaswani_mt's dropout modules; another model_factory has none")
        late_dropout = LateDropoutCallback(clock, recipe.late_dropout, recipe.late_dropout_minutes)
    set_seed(training_args.seed)  # before the model is built: its initial weights come from this seed
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if training_args.label_smoothing_factor and model_factory is None:
        # The model's own loss is label-smoothed (config.label_smoothing); Trainer's smoother would apply it twice.
        model_args.label_smoothing = training_args.label_smoothing_factor
        training_args.label_smoothing_factor = 0.0

    # The split never depends on --seed: every run of a corpus is scored on the same test pairs.
    corpus = load_corpus(
        data_args.dataset,
        data_args.dataset_config,
        data_args.source_lang,
        data_args.target_lang,
        upsample_primary=data_args.upsample_primary,
        tag_extra=data_args.tag_extra,
        add_reverse=data_args.add_reverse,
    )
    if data_args.max_train_samples:
        corpus["train"] = corpus["train"].select(range(min(data_args.max_train_samples, len(corpus["train"]))))
    if data_args.max_eval_samples:
        for split in ("validation", "test"):
            corpus[split] = corpus[split].select(range(min(data_args.max_eval_samples, len(corpus[split]))))
    logger.info("corpus %s: %s", data_args.dataset, {k: len(v) for k, v in corpus.items()})

    with training_args.main_process_first(desc="tokenizer"):
        tokenizer = build_tokenizer(model_args, corpus, data_args, output_dir)
    for option, tag in data_tags(data_args).items():
        if tag not in tokenizer.all_special_tokens:
            given = model_args.tokenizer or model_args.model_name_or_path or "this run's"
            raise ValueError(
                f"--{option}: the tokenizer ({given}) has no special token {tag}, so BPE would split the tag; "
                "train a new one (no --tokenizer)"
            )
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
        train_data_collator=(
            BPEDropoutCollator(tokenizer, data_args.bpe_dropout, collator, data_args.max_source_length)
            if data_args.bpe_dropout
            else None
        ),
        processing_class=tokenizer,
        compute_metrics=_bleu_metric(tokenizer) if recipe.eval_bleu else None,
        max_tokens_per_batch=data_args.max_tokens_per_batch,
        lr_schedule=recipe.lr_schedule,
        lr_factor=clock.lr_factor if recipe.cooldown_minutes else None,
        warmup_clock=clock if recipe.warmup_minutes else None,
        callbacks=[clock, CurvesCallback()] + ([late_dropout] if late_dropout else []),
    )

    resume = training_args.resume_from_checkpoint
    if resume in (None, "", "last", "auto", "True", "true"):
        found = last_checkpoint(output_dir)
        if found is None and resume not in (None, ""):
            logger.warning("no complete checkpoint in %s to resume from; starting fresh", output_dir)
        resume = str(found) if found is not None else None
    if training_args.restore_callback_states_from_checkpoint:
        # Trainer would replace the clock by a copy that lr_factor and late dropout do not see; it restores itself.
        logger.warning("--restore_callback_states_from_checkpoint ignored: the wall clock resumes on its own")
        training_args.restore_callback_states_from_checkpoint = False
    resumed_state = TrainerState.load_from_json(str(Path(resume, "trainer_state.json"))) if resume else None
    spent = trained_seconds(resumed_state)
    if resume and clock.budget_seconds and spent >= clock.budget_seconds:
        # A finished run started again: it trains no further (not even one step), it is scored again.
        logger.info("%s trained the whole time budget (%.1f minutes): no more training", resume, spent / 60)
        trainer.state = resumed_state
        clock.on_train_begin(training_args, resumed_state, None)  # the warmup it recorded, for the model card
        train_metrics = {}
    else:
        if resume:
            logger.info("resuming from %s (%.1f minutes trained)", resume, spent / 60)
        train_metrics = trainer.train(resume_from_checkpoint=resume).metrics
    trainer.save_state()
    trainer.leave_process_group()  # from here on rank 0 works alone, and the other ranks exit cleanly
    train_seconds = time.monotonic() - started

    result: dict = {"train": train_metrics, "output_dir": str(output_dir)}
    if not trainer.is_world_process_zero():
        return result

    if training_args.world_size > 1 and training_args.device.type == "cpu":
        # The other ranks are done: the averaging and the test translation take every core (DDP on a CPU runs
        # one thread per process, which is what makes it faster than one process with several threads).
        torch.set_num_threads(os.cpu_count() or 1)
    final = _finalize_model(trainer, recipe, output_dir)
    tokenizer.save_pretrained(output_dir)
    final.save_pretrained(output_dir)
    if recipe.test_bleu:
        sources, references = source_target(corpus["test"], data_args.source_lang, data_args.target_lang)
        test = evaluate_bleu(final, tokenizer, sources, references, batch_size=training_args.per_device_eval_batch_size)
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
        values = _card_values(
            final, tokenizer, model_args, data_args, recipe, training_args, trainer, corpus, result, command
        )
        (output_dir / "README.md").write_text(render_model_card(values), encoding="utf-8")
    return result


def _finalize_model(trainer: VaswaniTrainer, recipe: RecipeArguments, output_dir: Path):
    """The weights to publish: the mean of the last K checkpoints (§6.1) when there are several, else the final."""
    model = trainer.model
    checkpoints = list_checkpoints(output_dir)
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
            + (" and their single words" if data_args.dataset == BUILTIN_CORPUS_WITH_DICTIONARY else "")
            + (f"; each sentence {data_args.upsample_primary} times" if data_args.upsample_primary > 1 else "")
            if builtin
            else f"{data_args.dataset} {data_args.dataset_config or ''}".strip()
        )
        + (f"; each sentence pair also reversed ({tgt}->{src}, tagged {REVERSE_TAG})" if data_args.add_reverse else ""),
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
        **_schedule_values(training_args, trainer.warmup_clock),
        "label_smoothing": config.label_smoothing,
        "dropout": config.dropout,
        "max_tokens": data_args.max_tokens_per_batch,
        "steps": trainer.state.global_step,
        "train_minutes": result.get("train_minutes", "?"),
        "hardware": _hardware(),
        "precision": _precision(training_args),
        "weights_note": f"the average of {len(averaged)} checkpoints ({', '.join(averaged)})"
        if averaged
        else "the final weights",
        "test_pairs": len(corpus["test"]),
        "bleu": round(test["score"], 2) if test else "null",
        "chrf": round(test["chrf"], 2) if test else "not evaluated",
        "signature": test.get("signature", "not evaluated"),
        "search": search_summary(model.generation_config),
        "command": command or "scripts/train.py",
        "limitations": "Trained on short dictionary example sentences (about 8 words): expect poor output on long, "
        "technical or informal text, and on names and numbers the dictionary does not contain."
        if builtin
        else "Quality outside the training domain is unknown.",
        "repo_id": f"USER/vaswani-mt-{src}-{tgt}",
        "example": examples[0].replace('"', '\\"'),
    }


def _schedule_values(training_args, clock: WallClockCallback | None) -> dict:
    """Eq. (3)'s scale and warmup as the run followed them (a warmup on the clock ended at an update it measured)."""
    if clock is None or not clock.warmup_end_step:
        return {"lr_scale": training_args.learning_rate, "warmup": training_args.warmup_steps}
    scale = training_args.learning_rate * math.sqrt(clock.warmup_end_step / training_args.warmup_steps)
    return {"lr_scale": f"{scale:.3g}", "warmup": clock.warmup_end_step}


def _hardware() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def print_summary(result: dict, stream=sys.stdout) -> None:
    """The end of the main job: BLEU with its signature, timings, and a few translations."""
    test = result.get("test")
    if test:
        print(f"\ntest sacreBLEU = {test['score']:.2f}  (chrF {test['chrf']:.2f})", file=stream)
        print(f"signature: {test['signature']}", file=stream)
    if "wall_minutes" in result:
        print(f"wall time: {result['wall_minutes']} min (training {result['train_minutes']} min)", file=stream)
    for example in result.get("examples", []):
        print(f"\n  source:      {example['source']}", file=stream)
        print(f"  translation: {example['translation']}", file=stream)
        print(f"  reference:   {example['reference']}", file=stream)
    print(f"\nmodel folder: {result['output_dir']}", file=stream)


ARGUMENT_CLASSES = (ModelArguments, DataArguments, RecipeArguments, Seq2SeqTrainingArguments)


def parse_args(argv: list[str] | None = None):
    """Parses `scripts/train.py`'s command line: every Seq2SeqTrainingArguments flag plus ours, with the recipe's
    defaults. `--config FILE` (YAML or JSON; also as the first argument) sets any of them; the command line wins."""
    import yaml
    from transformers import HfArgumentParser

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser(ARGUMENT_CLASSES)
    parser.set_defaults(**TRAINING_DEFAULTS)
    # Without a GPU, say so up front: transformers refuses --bf16 (CPU autocast, AMX) unless use_cpu is set.
    parser.set_defaults(use_cpu=not (torch.cuda.is_available() or torch.backends.mps.is_available()))
    config_file = None
    if "--config" in argv:
        at = argv.index("--config")
        if at + 1 >= len(argv):
            raise ValueError("--config needs a file")
        config_file = argv[at + 1]
        del argv[at : at + 2]
    elif argv and argv[0].endswith((".yaml", ".yml", ".json")):
        config_file = argv.pop(0)
    if config_file:
        with open(config_file, encoding="utf-8") as f:
            values = yaml.safe_load(f) if config_file.endswith((".yaml", ".yml")) else json.load(f)
        if not isinstance(values, dict):
            raise ValueError(f"{config_file}: expected a mapping of option names to values")
        known = {field_.dest for field_ in parser._actions}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{config_file}: unknown options {unknown}")
        parser.set_defaults(**values)
    model_args, data_args, recipe, training_args = parser.parse_args_into_dataclasses(args=argv)
    recipe.config = config_file
    return model_args, data_args, recipe, training_args


__all__ = [
    "ARGUMENT_CLASSES",
    "TRAINING_DEFAULTS",
    "CurvesCallback",
    "DataArguments",
    "ModelArguments",
    "RecipeArguments",
    "VaswaniTrainer",
    "WallClockCallback",
    "auto_attention",
    "native_bf16",
    "paper_learning_rate",
    "parse_args",
    "plot_curves",
    "print_summary",
    "resolve_attention",
    "resolve_float32",
    "resolve_precision",
    "run_training",
]
