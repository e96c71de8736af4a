"""What the benchmarks read from a finished training run's log (`vaswani_mt.training.checkpoints.log_history`)."""

from __future__ import annotations

import os

from vaswani_mt.training.checkpoints import log_history


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
