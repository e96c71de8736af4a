"""Checkpoints: finding the last complete one, and averaging the last K (§6.1).

The paper averages the last 5 checkpoints (written at 10-minute intervals) for the base model and the last 20
for the big one. `average_checkpoints` writes the element-wise mean as a folder that loads with `from_pretrained`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# Trainer's own resume state: pickles and bookkeeping that a published model folder must not carry.
_TRAINING_STATE_FILES = ("optimizer.pt", "scheduler.pt", "trainer_state.json", "training_args.bin", "scaler.pt")


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def is_complete(checkpoint: Path) -> bool:
    """Trainer writes `trainer_state.json` last, after the weights, optimizer, scheduler and RNG state; a folder
    without a readable one was cut off while it was being written."""
    state = checkpoint / "trainer_state.json"
    if not state.is_file() or not _weight_files(checkpoint):
        return False
    try:
        json.loads(state.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return True


def list_checkpoints(
    directory: str | os.PathLike, complete_only: bool = True, up_to_step: int | None = None
) -> list[Path]:
    """`checkpoint-N` folders in `directory`, oldest first (only N <= `up_to_step` when given); incomplete ones are
    skipped with a warning."""
    found = []
    for path in Path(directory).iterdir() if Path(directory).is_dir() else []:
        match = _CHECKPOINT.match(path.name)
        if not (match and path.is_dir()) or (up_to_step is not None and int(match.group(1)) > up_to_step):
            continue
        if complete_only and not is_complete(path):
            logger.warning("ignoring %s: it was not completely written (no readable trainer_state.json)", path)
            continue
        found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def last_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in `directory`, or None."""
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1] if checkpoints else None


def log_history(run: str | os.PathLike) -> list[dict]:
    """A training run's logged rows (`trainer_state.json`'s `log_history`): the run's own final state where it wrote
    one, else its last complete checkpoint's (runs of `scripts/train.py` save their state with each checkpoint)."""
    state = Path(run) / "trainer_state.json"
    if not state.is_file():
        checkpoint = last_checkpoint(run)
        if checkpoint is None:
            raise FileNotFoundError(f"{run}: no trainer_state.json and no checkpoint-N folder with one")
        state = checkpoint / "trainer_state.json"
    return json.loads(state.read_text())["log_history"]


def run_summary(run: str | os.PathLike) -> dict:
    """What a finished run's log says about it: updates, epochs, the median of its logged target tokens per second
    (the upper one for an even count) and its last logged training loss."""
    history = log_history(run)
    rows = [row for row in history if "loss" in row]
    speeds = sorted(row["target_tokens_per_second"] for row in rows if "target_tokens_per_second" in row)
    return {
        "steps": max((row["step"] for row in history), default=0),
        "epochs": max((row["epoch"] for row in history if "epoch" in row), default=None),
        "final_train_loss": rows[-1]["loss"] if rows else None,
        "median_target_tokens_per_second": speeds[len(speeds) // 2] if speeds else None,
    }


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in _weight_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    if not tensors:
        raise FileNotFoundError(f"{folder}: no safetensors weights")
    return tensors


@torch.no_grad()
def average_checkpoints(
    checkpoint_dir: str | os.PathLike, last: int, output: str | os.PathLike, up_to_step: int | None = None
) -> Path:
    """Writes the element-wise mean of the last `last` complete checkpoints in `checkpoint_dir` to `output`.

    `up_to_step`: only checkpoints of that step or earlier count (what averaging would have given had the run
    stopped there; e.g. windows along one long run).

    The output holds `model.safetensors` (summed in float64, stored in the checkpoints' dtype) and the newest
    checkpoint's config, generation config, code and tokenizer files, so it loads with `from_pretrained`. It is
    written to a temporary folder first and moved into place whole.
    """
    if last < 1:
        raise ValueError(f"last must be at least 1, got {last}")
    checkpoints = list_checkpoints(checkpoint_dir, up_to_step=up_to_step)
    if not checkpoints:
        window = f" up to step {up_to_step}" if up_to_step is not None else ""
        raise FileNotFoundError(f"{checkpoint_dir}: no complete checkpoint-N folders{window}")
    if len(checkpoints) < last:
        logger.warning("asked to average %d checkpoints but %s has %d", last, checkpoint_dir, len(checkpoints))
    chosen = checkpoints[-last:]
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for checkpoint in chosen:
        weights = _read_weights(checkpoint)
        if total and weights.keys() != total.keys():
            raise ValueError(f"{checkpoint} holds different tensors than {chosen[0]}")
        for key, tensor in weights.items():
            dtypes[key] = tensor.dtype
            total[key] = total.get(key, 0) + tensor.to(torch.float64)
    averaged = {key: (value / len(chosen)).to(dtypes[key]).contiguous() for key, value in total.items()}

    output = Path(output)
    if output.resolve() in (Path(checkpoint_dir).resolve(), *Path(checkpoint_dir).resolve().parents):
        raise ValueError(f"output {output} would replace the folder that holds the checkpoints; choose another")
    if output.exists() and list_checkpoints(output, complete_only=False):
        raise ValueError(f"output {output} holds checkpoints of its own; refusing to replace it")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}-", dir=output.parent))
    try:
        newest = chosen[-1]
        for item in newest.iterdir():
            if item.is_file() and item.suffix != ".safetensors" and not item.name.startswith("rng_state"):
                if item.name not in _TRAINING_STATE_FILES and item.name != "model.safetensors.index.json":
                    shutil.copy2(item, staging / item.name)
        metadata = {"format": "pt", "averaged_checkpoints": json.dumps([c.name for c in chosen])}
        save_file(averaged, str(staging / "model.safetensors"), metadata=metadata)
        if output.exists():
            shutil.rmtree(output)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("averaged %s into %s", ", ".join(c.name for c in chosen), output)
    return output


__all__ = ["average_checkpoints", "is_complete", "last_checkpoint", "list_checkpoints", "log_history", "run_summary"]
