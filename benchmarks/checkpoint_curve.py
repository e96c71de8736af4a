#!/usr/bin/env python
"""BLEU against wall-clock minutes: every checkpoint of one or more training runs, scored on a split.

Because Eq. (3) does not depend on the planned number of steps, the checkpoint a run wrote at minute m is the
model a run with an m-minute budget would have ended with (before averaging), so one long run gives the whole
BLEU-vs-minutes curve of its config. Each checkpoint is translated with the model's own search (ours: beam 4 and
the GNMT penalty; MarianMTModel: its generation config), scored with sacreBLEU (with the per-token NLL of the
references and of as many training pairs: the generalisation gap), and placed at the wall-clock
minute of training it was written at (`train_minutes` in the run's logs; runs from before that field existed use
steps x mean seconds per step). Optionally also the mean of the last K checkpoints (§6.1) at each point.

    python benchmarks/checkpoint_curve.py outputs/sweep/d03 outputs/sweep/d01 --split validation \
        --plot benchmarks/curves.png --json benchmarks/curves.json
"""

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vaswani_mt.data.corpus import BUILTIN_CORPUS, load_corpus, source_target
from vaswani_mt.evaluation.metrics import evaluate_bleu, token_nll
from vaswani_mt.training.checkpoints import average_checkpoints, list_checkpoints, log_history


def checkpoint_minutes(run: Path, step: int) -> float | None:
    """Training minutes at `step`, interpolated between the run's logged `train_minutes`."""
    try:
        history = log_history(run)
    except FileNotFoundError:
        return None
    points = sorted((row["step"], row["train_minutes"]) for row in history if "train_minutes" in row)
    if points:
        below = [p for p in points if p[0] <= step] or [(0, 0.0)]
        above = [p for p in points if p[0] >= step]
        (s0, m0), (s1, m1) = below[-1], (above[0] if above else points[-1])
        return m0 if s1 == s0 else m0 + (m1 - m0) * (step - s0) / (s1 - s0)
    runtime = [row for row in history if "train_runtime" in row]
    if runtime:
        return step * runtime[-1]["train_runtime"] / 60 / max(runtime[-1]["step"], 1)
    return None


def run_labels(runs: list[Path]) -> list[str]:
    """Each run's name in the results: its folder name, or as many trailing folders as make it unique among `runs`.

    `a/marian` and `b/marian` are `a/marian` and `b/marian`; `s2` beside them stays `s2`. Two runs under one name
    would overwrite each other's points in the JSON file.
    """
    parts = [Path(run).resolve().parts for run in runs]
    if len(set(parts)) < len(parts):
        raise SystemExit("checkpoint_curve: a run is named twice")
    labels = []
    for own in parts:
        depth = 1
        while any(other != own and other[-depth:] == own[-depth:] for other in parts):
            depth += 1
        labels.append("/".join(own[-depth:]))
    return labels


def score(folder: Path, sources, references, batch_size: int, train=None) -> dict:
    """BLEU and chrF with the model's own search, and the per-token NLL of the references (and of `train`
    pairs, the same number of training pairs, to show the generalisation gap)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    result = evaluate_bleu(model, tokenizer, sources, references, batch_size=batch_size)
    out = {"bleu": round(result["score"], 2), "chrf": round(result["chrf"], 2)}
    out["nll"] = round(token_nll(model, tokenizer, sources, references, batch_size), 4)
    if train is not None:
        out["train_nll"] = round(token_nll(model, tokenizer, *train, batch_size), 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="training output folders holding checkpoint-N folders")
    parser.add_argument(
        "--dataset", default=BUILTIN_CORPUS, help="the corpus the runs trained on (see --dataset of train.py)"
    )
    parser.add_argument("--split", default="validation", choices=["validation", "test"])
    parser.add_argument("--max_samples", type=int, default=None)
    parser.add_argument("--average_last", type=int, default=0, help="also score the mean of the last K checkpoints")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--json", help="write the points here (merged with what the file already holds)")
    parser.add_argument("--plot", help="draw BLEU against minutes to this PNG")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))

    corpus = load_corpus(args.dataset)
    sources, references = source_target(corpus[args.split], "en", "de")
    sources, references = sources[: args.max_samples], references[: args.max_samples]
    train_sources, train_references = source_target(corpus["train"], "en", "de")
    train = (train_sources[: len(sources)], train_references[: len(sources)])
    results = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).is_file() else {}
    for run, label in zip(map(Path, args.runs), run_labels(args.runs), strict=True):
        points = []
        checkpoints = list_checkpoints(run)
        for index, checkpoint in enumerate(checkpoints):
            step = int(checkpoint.name.split("-")[1])
            point = {"step": step, "minutes": checkpoint_minutes(run, step)}
            point.update(score(checkpoint, sources, references, args.batch_size, train))
            if args.average_last > 1 and index + 1 >= args.average_last:
                with tempfile.TemporaryDirectory() as tmp:
                    staging = Path(tmp) / "checkpoints"
                    staging.mkdir()
                    for previous in checkpoints[index + 1 - args.average_last : index + 1]:
                        os.symlink(previous.resolve(), staging / previous.name)
                    averaged = average_checkpoints(staging, args.average_last, Path(tmp) / "averaged")
                    averaged_score = score(averaged, sources, references, args.batch_size)
                point.update({f"avg{args.average_last}_{k}": v for k, v in averaged_score.items()})
            print(label, json.dumps(point), flush=True)
            points.append(point)
        results[f"{label}:{args.split}"] = points
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(7, 4.5))
        for name, points in sorted(results.items()):
            xy = [(p["minutes"], p["bleu"]) for p in points if p["minutes"] is not None]
            if xy:
                axis.plot(*zip(*xy, strict=True), marker=".", label=name)
        axis.set_xlabel("training minutes (wall clock, 2 CPU threads)")
        axis.set_ylabel("sacreBLEU (beam 4)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
        figure.tight_layout()
        figure.savefig(args.plot, dpi=100)


if __name__ == "__main__":
    main()
