"""A run's folder from one command to the next.

- A finished run stays finished: a job that ended by its own rule (its time budget, its deadline, `--max_steps`,
  its epochs, early stopping) writes `results.json` last, naming the rule (`finished_by`); the same command on that
  folder (`already_finished`) trains nothing and writes nothing, and says so in one line (`finished_line`), which
  names the option that trains on: `--resume_from_checkpoint last`.
- A run resumed on another number of processes keeps the tokens of its steps (`keep_tokens_per_step`): the token
  budget is a global one (§5.1, ~25,000 target tokens a step over 8 GPUs), so the accumulation or the batch of each
  process changes instead; where no whole numbers give the same tokens a step, the resume is refused in one line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from transformers import EarlyStoppingCallback, Seq2SeqTrainingArguments, TrainerState

from .arguments import DataArguments
from .callbacks import WallClockCallback, saved_batch_layout
from .checkpoints import CheckpointError

logger = logging.getLogger(__name__)

RESULTS = "results.json"  # written last by a finished job, on global rank 0
TRAIN_ON = "--resume_from_checkpoint last"


def finished_run(output_dir: str | Path) -> dict | None:
    """The results of the finished run in `output_dir` (its `results.json`), None when it holds none."""
    try:
        results = json.loads((Path(output_dir) / RESULTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return results if isinstance(results, dict) and isinstance(results.get("step"), int) else None


def already_finished(training_args: Seq2SeqTrainingArguments) -> dict | None:
    """The results of a finished run in `--output_dir` that this command leaves as it is: any command but one that
    names `--resume_from_checkpoint`. Under DDP rank 0 reads them for every rank (a machine that keeps its own
    folder holds no results.json), so all ranks do the same."""
    import torch.distributed as dist

    if training_args.resume_from_checkpoint not in (None, ""):
        return None
    if max(1, training_args.world_size) == 1 or not (dist.is_available() and dist.is_initialized()):
        return finished_run(training_args.output_dir)  # `world_size` above started the process group, if any
    found = [finished_run(training_args.output_dir) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(found, src=0)
    return found[0]


def finished_line(output_dir: str | Path, results: dict) -> str:
    """The one line of a command that found its run finished: the folder, the step, the test BLEU, what stopped it
    and the option that trains on."""
    score = (results.get("test") or {}).get("score")
    bleu = f"test BLEU {score:.2f}" if isinstance(score, (int, float)) else "no test BLEU"
    by = f", stopped by {results['finished_by']}" if results.get("finished_by") else ""
    return (
        f"{output_dir} holds a finished run (step {results['step']}, {bleu}{by}): nothing trained or written; "
        f"{TRAIN_ON} trains it on (with a larger --time_budget_minutes or --max_steps where those stopped it), "
        "another --output_dir starts a new run"
    )


def finished_by(trainer, clock: WallClockCallback) -> str:
    """The rule that ended `trainer`'s training: early stopping, the clock's (time budget, deadline), or the step
    count (`--max_steps`, else the epochs)."""
    if any(isinstance(c, EarlyStoppingCallback) and c.early_stopping_patience_counter >= c.early_stopping_patience
           for c in trainer.callback_handler.callbacks):  # fmt: skip
        return "early stopping, --early_stopping_patience"
    if clock.stopped_by:
        return clock.stopped_by
    return "--max_steps" if trainer.args.max_steps > 0 else "--num_train_epochs"


# ---------------------------------------------------------------------------------------------------------------
# Tokens a step


def batch_layout(data_args: DataArguments, training_args: Seq2SeqTrainingArguments) -> dict:
    """What makes the tokens of a step: processes x accumulation x each batch's tokens (or sentences)."""
    return {
        "processes": max(1, training_args.world_size),
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "max_tokens_per_batch": data_args.max_tokens_per_batch or 0,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
    }


def _recorded_layout(checkpoint: Path, state: TrainerState | None, now: dict) -> dict | None:
    """The layout `checkpoint` was trained with; for one written before layouts were recorded, the number of
    processes from its RNG files (one per process) and the rest from this command."""
    saved = saved_batch_layout(state)
    if saved:
        return {**now, **saved}
    ranks = len(list(checkpoint.glob("rng_state_*.pth")))
    processes = ranks or (1 if (checkpoint / "rng_state.pth").is_file() else None)
    return {**now, "processes": processes} if processes else None


def keep_tokens_per_step(
    checkpoint: str | None, state: TrainerState | None, data_args: DataArguments,
    training_args: Seq2SeqTrainingArguments,
) -> str | None:  # fmt: skip
    """Where `checkpoint` was trained by another number of processes, sets the accumulation (or else each process's
    batch) so that a step holds as many tokens as before, and returns the line that says so; raises
    `CheckpointError` (nothing written yet) where no whole numbers can. None where the processes are the same."""
    if not checkpoint:
        return None
    now = batch_layout(data_args, training_args)
    before = _recorded_layout(Path(checkpoint), state, now)
    if before is None or before["processes"] == now["processes"]:
        return None
    option = "max_tokens_per_batch" if before["max_tokens_per_batch"] else "per_device_train_batch_size"
    unit = "tokens" if option == "max_tokens_per_batch" else "sentences"
    shares = before["processes"] * before["gradient_accumulation_steps"]  # batches a step
    total = before[option] * shares
    processes = now["processes"]
    accumulation, size = now["gradient_accumulation_steps"], now[option]
    if accumulation * size * processes == total:
        pass  # this command's options already give the run's tokens a step
    elif shares % processes == 0:
        accumulation, size = shares // processes, before[option]
    elif total % (processes * accumulation) == 0:
        size = total // (processes * accumulation)
    else:
        raise CheckpointError(
            f"{checkpoint} was trained by {_processes(before['processes'])} with {total} {unit} a step "
            f"(--{option} {before[option]} x --gradient_accumulation_steps {before['gradient_accumulation_steps']}"
            f" each), which {_processes(processes)} cannot make: resume it on {before['processes']}, or start a new "
            "run in another --output_dir"
        )
    training_args.gradient_accumulation_steps = accumulation
    if option == "max_tokens_per_batch":
        data_args.max_tokens_per_batch = size
    else:
        training_args.per_device_train_batch_size = size
    return (
        f"resuming {checkpoint}, trained by {_processes(before['processes'])}, on {processes}: "
        f"--gradient_accumulation_steps {accumulation} and --{option} {size} keep its {total} {unit} a step"
    )


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


__all__ = [
    "RESULTS",
    "TRAIN_ON",
    "already_finished",
    "batch_layout",
    "finished_by",
    "finished_line",
    "finished_run",
    "keep_tokens_per_step",
]
