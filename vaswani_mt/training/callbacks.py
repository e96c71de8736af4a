"""Trainer callbacks of the recipe: checkpoints on the clock and a time budget (§6.1), a clean stop on SIGINT/SIGTERM,
a checkpoint at each evaluation, the token sampler's epoch, a progress bar in minutes and the training curves."""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import TrainerCallback, TrainerState
from transformers.trainer_callback import ExportableState, ProgressCallback

logger = logging.getLogger(__name__)


class WallClockCallback(TrainerCallback, ExportableState):
    """Saves a checkpoint every `checkpoint_minutes` (§6.1: 10) and stops, with a checkpoint, once `budget_minutes`
    have passed; all processes follow rank 0's clock. With `--metric_for_best_model` the last step is evaluated too.
    Checkpoints record the seconds trained (`state()`), so a resumed run finishes the budget it had left, and the
    batch layout (`batch_layout`, set by the job), so that a run resumed on another number of processes keeps the
    tokens of its steps (runs.py). `stopped_by` names the rule that stopped training, once one did.
    """

    def __init__(self, checkpoint_minutes: float | None = None, budget_minutes: float | None = None):
        for name, value in (("checkpoint_minutes", checkpoint_minutes), ("budget_minutes", budget_minutes)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be above 0, got {value}")
        self.checkpoint_seconds = checkpoint_minutes * 60 if checkpoint_minutes else None
        self.budget_seconds = budget_minutes * 60 if budget_minutes else None
        self.start = self.last_save = time.monotonic()
        self.elapsed = 0.0  # seconds of training on rank 0's clock at the last step
        self.deadline = None  # a `deadline.JobDeadline` (--job_minutes): rank 0 stops training by it too
        self.batch_layout: dict | None = None  # processes, accumulation and batch size of the steps (runs.py)
        self.stopped_by: str | None = None

    def state(self) -> dict:
        return {
            "args": {
                "checkpoint_minutes": self.checkpoint_seconds / 60 if self.checkpoint_seconds else None,
                "budget_minutes": self.budget_seconds / 60 if self.budget_seconds else None,
            },
            "attributes": {"trained_seconds": round(self.elapsed, 3), "batch_layout": self.batch_layout},
        }

    def on_train_begin(self, args, state, control, **kwargs):
        self.elapsed = trained_seconds(state)  # 0 unless resumed from a checkpoint that recorded it
        self.start = time.monotonic() - self.elapsed
        self.last_save = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        self.elapsed = now - self.start
        save = bool(self.checkpoint_seconds and now - self.last_save >= self.checkpoint_seconds)
        stop = bool(self.budget_seconds and self.elapsed >= self.budget_seconds)
        if stop:
            self.stopped_by = "the time budget, --time_budget_minutes"
        elif self.deadline is not None and state.is_world_process_zero and self.deadline.training_must_stop(now):
            stop, self.stopped_by = True, "the job's deadline, --job_minutes"
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flags = torch.tensor([int(save), int(stop), round(self.elapsed * 1000)], device=args.device)
            torch.distributed.broadcast(flags, src=0)
            save, stop, self.elapsed = bool(flags[0]), bool(flags[1]), int(flags[2]) / 1000
        if stop:
            control.should_training_stop = True
            save = True
            if getattr(args, "metric_for_best_model", None) is not None and args.eval_strategy != "no":
                control.should_evaluate = True
        if save:
            control.should_save = True
            self.last_save = now
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last_save = time.monotonic()


class PreemptionCallback(TrainerCallback):
    """On SIGINT (Ctrl-C) or SIGTERM (a scheduler's preemption): finish the current step, save a checkpoint, stop.

    The handler only records the signal; at the end of the running step this callback asks for a checkpoint and
    the end of training. Under DDP any rank's signal stops all of them at the same step. A second signal is not
    caught (Ctrl-C twice stops at once), except within `echo_seconds` of the first under a launcher, which can
    deliver its own copy of the same signal. Handlers are installed only inside `catching_signals()`.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, echo_seconds: float | None = None):
        self.signum: int | None = None  # the signal that asked training to stop, once one did
        self.stopped_at_step: int | None = None
        if echo_seconds is None:  # torchrun's agent (under accelerate launch too) sets TORCHELASTIC_RUN_ID
            echo_seconds = 2.0 if "TORCHELASTIC_RUN_ID" in os.environ else 0.0
        self.echo_seconds = echo_seconds
        self._first_signal_at: float | None = None
        self._previous: dict[int, object] = {}

    @contextmanager
    def catching_signals(self) -> Iterator[PreemptionCallback]:
        """SIGINT and SIGTERM stop training cleanly while the block runs; the previous handlers come back after.
        Python delivers signals to the main thread only: elsewhere (a notebook's worker thread) nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        try:
            yield self
        finally:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            self._previous = {}

    @property
    def signal_name(self) -> str | None:
        """The name of the signal that asked training to stop ("SIGTERM"), None before one did."""
        return signal.Signals(self.signum).name if self.signum else None

    @property
    def exit_code(self) -> int:
        """The shell's status for a process ended by the signal, 128 + its number (130 for SIGINT, 143 for SIGTERM):
        not 0, so that a scheduler does not take a preempted job for a finished one."""
        return 128 + (self.signum or signal.SIGTERM)

    def _handle(self, signum, frame):
        now = time.monotonic()
        if self._first_signal_at is None:
            self.signum, self._first_signal_at = signum, now
            return
        if now - self._first_signal_at < self.echo_seconds:
            return  # the launcher's copy of the signal this process already got
        previous = self._previous.get(signum, signal.SIG_DFL)  # a second signal: what it would have done
        signal.signal(signum, previous)
        if callable(previous):
            previous(signum, frame)  # Python's SIGINT handler: KeyboardInterrupt
        else:
            signal.raise_signal(signum)  # SIG_DFL: the process ends by the signal; SIG_IGN: nothing

    def on_step_end(self, args, state, control, **kwargs):
        stop = self.signum is not None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([self.signum or 0], device=args.device)  # the signal, for the ranks without one
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            self.signum = int(flag.item()) or None
            stop = self.signum is not None
        if stop and self.stopped_at_step is None:
            self.stopped_at_step = state.global_step
            logger.debug("%s: saving checkpoint-%d and stopping", self.signal_name, state.global_step)
        if stop:
            control.should_save = True
            control.should_training_stop = True
        return control


def _saved_attributes(state: TrainerState | None, callback: str) -> dict:
    """The attributes a (resumed) TrainerState records for the stateful callback named `callback`."""
    saved = (getattr(state, "stateful_callbacks", None) or {}).get(callback)
    if isinstance(saved, list):
        saved = saved[-1] if saved else None
    return (saved or {}).get("attributes") or {}


def trained_seconds(state: TrainerState | None) -> float:
    """Seconds of training a (resumed) TrainerState records, on WallClockCallback's clock; 0 when it has none."""
    return float(_saved_attributes(state, WallClockCallback.__name__).get("trained_seconds") or 0.0)


def saved_batch_layout(state: TrainerState | None) -> dict | None:
    """The batch layout a (resumed) TrainerState records (`WallClockCallback.batch_layout`); None when it has none."""
    layout = _saved_attributes(state, WallClockCallback.__name__).get("batch_layout")
    return layout if isinstance(layout, dict) else None


class CheckpointAtEvaluationCallback(TrainerCallback):
    """A checkpoint at every evaluation during training, so that the best evaluated weights are on disk: Trainer
    records `best_model_checkpoint` only where a checkpoint of the evaluated step exists."""

    def on_evaluate(self, args, state, control, **kwargs):
        if state.global_step > 0 and args.save_strategy != "best":  # "best": Trainer saves exactly the new bests
            control.should_save = True
        return control


def evaluations_without_improvement(state: TrainerState | None) -> int:
    """`EarlyStoppingCallback`'s counter of evaluations without improvement that a (resumed) TrainerState records,
    for the job to restore; 0 when the state has none."""
    return int(_saved_attributes(state, "EarlyStoppingCallback").get("early_stopping_patience_counter") or 0)


class BudgetProgressCallback(ProgressCallback):
    """The training progress bar in minutes of the time budget (`WallClockCallback`), with the step beside it: under
    a budget the run ends on the clock, not at `max_steps`. Without a budget it is transformers' bar."""

    def __init__(self, clock: WallClockCallback):
        super().__init__()
        self.clock = clock

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.clock.budget_seconds:
            return super().on_train_begin(args, state, control, **kwargs)
        self.current_step = 0
        if state.is_world_process_zero:
            budget = self.clock.budget_seconds / 60
            self.training_bar = tqdm(
                total=budget,
                initial=min(self.clock.elapsed / 60, budget),
                unit="min",
                dynamic_ncols=True,
                bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} min [{elapsed}<{remaining}{postfix}]",
            )

    def on_step_end(self, args, state, control, **kwargs):
        if not self.clock.budget_seconds:
            return super().on_step_end(args, state, control, **kwargs)
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.n = min(self.clock.elapsed / 60, self.training_bar.total)
            self.training_bar.set_postfix_str(f"step {state.global_step}", refresh=False)
            self.training_bar.refresh()
        self.current_step = state.global_step


class SamplerEpochCallback(TrainerCallback):
    """Tells the token sampler the epoch before each epoch's batches are drawn, also in a resumed run, where
    transformers fast-forwards through a wrapper that does not pass `set_epoch` on."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.trainer.token_sampler is not None:
            self.trainer.token_sampler.set_epoch(math.floor(state.epoch + 1e-6) if state.epoch else 0)


class CurvesCallback(TrainerCallback):
    """Draws the logged curves (`state.log_history`, a resumed run's earlier steps included) to
    `training_curves.png` in the output folder at a save, at most once every `every_seconds`, and at the end.

    Drawing takes about a second on a CPU: nothing beside the paper's save every 10 minutes, but a second a save
    where checkpoints come every few seconds (a fast GPU with small `--save_steps`; the suite's runs)."""

    def __init__(self, every_seconds: float = 60.0):
        self.every_seconds, self.drawn_at = every_seconds, None

    def on_save(self, args, state, control, **kwargs):
        if self.drawn_at is None or time.monotonic() - self.drawn_at >= self.every_seconds:
            self.draw(args, state)

    def on_train_end(self, args, state, control, **kwargs):
        self.draw(args, state)

    def draw(self, args, state) -> None:
        if state.is_world_process_zero:
            best = state.best_global_step if args.metric_for_best_model is not None else None
            plot_curves(state.log_history, Path(args.output_dir) / "training_curves.png", best_step=best)
        self.drawn_at = time.monotonic()


def plot_curves(history: list[dict], path: Path, best_step: int | None = None) -> Path | None:
    """Loss, dev loss, learning rate, tokens/s and dev BLEU (`eval_bleu`) against the step, in one PNG; `best_step`
    (the best checkpoint's, under `--metric_for_best_model`) as a dashed line on the dev panels. A run that logged no
    step (shorter than `--logging_steps`) gets its mean loss (`train_loss`, logged at the end) as one point."""
    panels = [
        ("loss", ["loss", "eval_loss"]),
        ("learning rate", ["learning_rate"]),
        ("target tokens / s", ["target_tokens_per_second"]),
        ("dev BLEU", ["eval_bleu"]),
    ]
    if not any("loss" in row for row in history):  # a run shorter than --logging_steps: its mean loss, one point
        panels[0] = ("loss", ["train_loss", "eval_loss"])
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
        if best_step and any(key.startswith("eval_") for key in keys):
            axis.axvline(best_step, color="grey", linestyle="--", linewidth=1, label=f"best: step {best_step}")
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


__all__ = [
    "BudgetProgressCallback",
    "CheckpointAtEvaluationCallback",
    "CurvesCallback",
    "PreemptionCallback",
    "SamplerEpochCallback",
    "WallClockCallback",
    "evaluations_without_improvement",
    "plot_curves",
    "saved_batch_layout",
    "trained_seconds",
]
