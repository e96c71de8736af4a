#!/usr/bin/env python
"""Training loss against wall-clock minutes for runs with different step speeds: a markdown table.

Runs at a time budget compare at equal minutes, not equal steps. For each run this reads its loss log (the run's
or its last checkpoint's `trainer_state.json`: `loss` and `train_minutes` every `--logging_steps` updates) and
prints, at each mark, the mean of the losses logged within `--window` minutes of it; then each run's updates,
epochs, median target tokens per second and last logged loss (`vaswani_mt.training.checkpoints.run_summary`); then, for
each further run, at how many of the steps both it and the first run logged the two losses are equal (the same
seed under another version or machine should train the same numbers, only at another speed).

    python benchmarks/loss_at_minutes.py outputs/sweep11/d128 outputs/sweep11/d96 --first 2 --every 4
"""

import argparse
from pathlib import Path

from run_logs import run_summary

from vaswani_mt.training.checkpoints import log_history


def logged_losses(run: Path) -> list[tuple[float, float]]:
    """(training minute, loss) of every logged training step of `run`."""
    return [(row["train_minutes"], row["loss"]) for row in log_history(run) if "loss" in row and "train_minutes" in row]


def loss_at(points: list[tuple[float, float]], minute: float, window: float) -> float | None:
    """The mean loss logged within `window` minutes of `minute`; None where the run logged none there."""
    near = [loss for at, loss in points if abs(at - minute) <= window]
    return sum(near) / len(near) if near else None


def table(runs: list[Path], marks: list[float], window: float) -> str:
    points = {run: logged_losses(run) for run in runs}
    lines = ["| minute | " + " | ".join(run.name for run in runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for mark in marks:
        values = (loss_at(points[run], mark, window) for run in runs)
        lines.append(f"| {mark:g} | " + " | ".join("" if v is None else f"{v:.3f}" for v in values) + " |")
    return "\n".join(lines)


def summary(runs: list[Path]) -> str:
    lines = ["| run | steps | epochs | median target tok/s | final train loss |", "|---|---|---|---|---|"]
    for run in runs:
        r = run_summary(run)
        epochs = "" if r["epochs"] is None else f"{r['epochs']:.2f}"
        speed = "" if r["median_target_tokens_per_second"] is None else f"{r['median_target_tokens_per_second']:,.0f}"
        loss = "" if r["final_train_loss"] is None else f"{r['final_train_loss']:.3f}"
        lines.append(f"| {run.name} | {r['steps']:,} | {epochs} | {speed} | {loss} |")
    return "\n".join(lines)


def same_steps(first: Path, other: Path) -> dict:
    """The training steps both runs logged a loss at, how many of those losses are equal, and the first that is not."""
    losses = [{row["step"]: row["loss"] for row in log_history(run) if "loss" in row} for run in (first, other)]
    common = sorted(set(losses[0]) & set(losses[1]))
    differ = [step for step in common if losses[0][step] != losses[1][step]]
    return {
        "common": len(common),
        "last_common": common[-1] if common else None,
        "equal": len(common) - len(differ),
        "first_different": differ[0] if differ else None,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="training output folders holding checkpoint-N folders")
    parser.add_argument("--first", type=float, default=2.0, help="first mark, in minutes")
    parser.add_argument("--every", type=float, default=4.0, help="minutes between marks")
    parser.add_argument("--last", type=float, default=27.0, help="no mark after this minute")
    parser.add_argument("--window", type=float, default=1.0, help="average the losses within this many minutes")
    args = parser.parse_args(argv)
    marks, mark = [], args.first
    while mark <= args.last:
        marks.append(mark)
        mark += args.every
    print(table(args.runs, marks, args.window))
    print()
    print(summary(args.runs))
    for other in args.runs[1:]:
        same = same_steps(args.runs[0], other)
        print(
            f"\n{other.name} against {args.runs[0].name}: {same['equal']} of the {same['common']} steps both logged "
            f"(up to step {same['last_common']}) have equal losses; first different: {same['first_different']}"
        )


if __name__ == "__main__":
    main()
