#!/usr/bin/env python
"""Quality of training runs: what a run's checkpoints, averaging, search and ensembles score.

    python benchmarks/quality.py curve RUN...      # BLEU (and NLL) of every checkpoint against training minutes
    python benchmarks/quality.py search RUN        # {final, mean of last K} x {beam 4, greedy, other searches}
    python benchmarks/quality.py ensemble RUN      # the last K checkpoints ensembled, averaged, or the last alone

`python benchmarks/quality.py COMMAND --help` describes each. MarianMTModel trained beside ours through the same
pipeline: train_vs_marian.py.
"""

import json
import os
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from speed_common import MachineRecord, command_parser, dispatch, print_table, run_sides, split_pairs
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

from vaswani_mt.data.corpus import BUILTIN_CORPUS
from vaswani_mt.evaluation.metrics import evaluate_bleu, token_nll
from vaswani_mt.model.generation_vaswani import PAPER_SEARCH
from vaswani_mt.training.checkpoints import average_checkpoints, list_checkpoints, log_history

# --- curve: BLEU against wall-clock minutes --------------------------------------------------------------------------


def checkpoint_minutes(run: Path, step: int) -> float | None:
    """Training minutes at `step`, interpolated between the run's logged `train_minutes`."""
    try:
        history = log_history(run)
    except FileNotFoundError:
        return None
    points = sorted((row["step"], row["train_minutes"]) for row in history if "train_minutes" in row)
    if not points:
        return None
    below = [p for p in points if p[0] <= step] or [(0, 0.0)]
    above = [p for p in points if p[0] >= step]
    (s0, m0), (s1, m1) = below[-1], (above[0] if above else points[-1])
    return m0 if s1 == s0 else m0 + (m1 - m0) * (step - s0) / (s1 - s0)


def run_labels(runs: list[Path]) -> list[str]:
    """Each run's name in the results: its folder name, or as many trailing folders as make it unique among `runs`.

    `a/marian` and `b/marian` are `a/marian` and `b/marian`; `s2` beside them stays `s2`. Two runs under one name
    would overwrite each other's points in the JSON file.
    """
    parts = [Path(run).resolve().parts for run in runs]
    if len(set(parts)) < len(parts):
        raise SystemExit("quality.py curve: a run is named twice")
    labels = []
    for own in parts:
        depth = 1
        while any(other != own and other[-depth:] == own[-depth:] for other in parts):
            depth += 1
        labels.append("/".join(own[-depth:]))
    return labels


def curve_score(folder: Path, sources, references, batch_size: int, train=None) -> dict:
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


def curve(argv=None) -> None:
    """BLEU, chrF and NLL of every checkpoint of each run against its training minutes (the NLL of as many
    training pairs too: the generalisation gap); --average_last K also scores the mean of the last K at each point."""
    parser = command_parser(curve, "write the points here (merged with what it holds)")
    parser.add_argument("runs", nargs="+", help="training output folders holding checkpoint-N folders")
    parser.add_argument(
        "--dataset", default=BUILTIN_CORPUS, help="the corpus the runs trained on (see --dataset of train.py)"
    )
    parser.add_argument("--split", default="validation", choices=["validation", "test"], help="the pairs scored")
    parser.add_argument("--max_samples", type=int, default=None, help="only the split's first N pairs")
    parser.add_argument("--average_last", type=int, default=0, help="also score the mean of the last K checkpoints")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per batch of the search")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))

    sources, references = split_pairs(args.split, args.max_samples, args.dataset)
    train = split_pairs("train", len(sources), args.dataset)  # as many training pairs: the generalisation gap
    results = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).is_file() else {}
    for run, label in zip(map(Path, args.runs), run_labels(args.runs), strict=True):
        points = []
        checkpoints = list_checkpoints(run)
        for index, checkpoint in enumerate(checkpoints):
            step = int(checkpoint.name.split("-")[1])
            point = {"step": step, "minutes": checkpoint_minutes(run, step)}
            point.update(curve_score(checkpoint, sources, references, args.batch_size, train))
            if args.average_last > 1 and index + 1 >= args.average_last:
                with tempfile.TemporaryDirectory() as tmp:
                    staging = Path(tmp) / "checkpoints"
                    staging.mkdir()
                    for previous in checkpoints[index + 1 - args.average_last : index + 1]:
                        os.symlink(previous.resolve(), staging / previous.name)
                    averaged = average_checkpoints(staging, args.average_last, Path(tmp) / "averaged")
                    averaged_score = curve_score(averaged, sources, references, args.batch_size)
                point.update({f"avg{args.average_last}_{k}": v for k, v in averaged_score.items()})
            print(label, json.dumps(point), flush=True)
            points.append(point)
        results[f"{label}:{args.split}"] = points
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


# --- search: checkpoint averaging and beam search, each with and without ---------------------------------------------


SEARCHES = {"beam 4 (paper)": dict(PAPER_SEARCH), "greedy": {**PAPER_SEARCH, "num_beams": 1}}


def parse_search(text: str) -> dict:
    """`length_penalty=1.2,no_repeat_ngram_size=3` -> {"length_penalty": 1.2, "no_repeat_ngram_size": 3}."""
    kwargs = {}
    for item in filter(None, text.split(",")):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise SystemExit(f"--search {text!r}: {item!r} is not KEY=VALUE")
        try:
            kwargs[key] = json.loads(value)  # 3, 1.2, true, false
        except json.JSONDecodeError:
            raise SystemExit(f"--search {text!r}: {value!r} is not a number or true/false") from None
    if not kwargs:
        raise SystemExit(f"--search {text!r}: no KEY=VALUE given")
    return kwargs


def saved_search(run: Path) -> str | None:
    """The row name of the search a run saved in its generation config, when it is not the paper's."""
    checkpoints = list_checkpoints(run)
    if not checkpoints:
        return None
    config = GenerationConfig.from_pretrained(checkpoints[-1])
    if all(getattr(config, key, None) == value for key, value in PAPER_SEARCH.items()):
        return None
    return f"beam {config.num_beams}, alpha {config.length_penalty} (saved)"


def score_run(run: Path, sources, references, average_last: list[int], batch_size: int, searches: dict) -> list[dict]:
    """One row per (weights, search): the final checkpoint and the mean of each last K, each with every search
    (name -> `generate()` keyword arguments)."""
    checkpoints = list_checkpoints(run)
    if not checkpoints:
        raise SystemExit(f"{run}: no complete checkpoint-N folders")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        weights = {f"final ({checkpoints[-1].name})": checkpoints[-1]}
        for last in average_last:
            if last > 1 and len(checkpoints) > 1:
                used = checkpoints[-last:]
                weights[f"mean of last {len(used)} ({used[0].name} .. {used[-1].name})"] = average_checkpoints(
                    run, last, Path(tmp) / f"averaged-{last}"
                )
        tokenizer = AutoTokenizer.from_pretrained(checkpoints[-1])
        for name, folder in weights.items():
            model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
            for search, kwargs in searches.items():
                start = time.perf_counter()
                result = evaluate_bleu(model, tokenizer, sources, references, batch_size=batch_size, **kwargs)
                seconds = round(time.perf_counter() - start, 1)
                rows.append({"weights": name, "search": search, "bleu": round(result["score"], 2),
                             "chrf": round(result["chrf"], 2), "bp": round(result["bp"], 3), "seconds": seconds,
                             "signature": result["signature"]})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    return rows


def search(argv=None) -> None:
    """BLEU of a run's final checkpoint and of the mean of its last K, each under beam 4, greedy, the run's saved
    search and any other given (--length_penalties, --search), on one split."""
    parser = command_parser(search)
    parser.add_argument("run", help="a training output folder holding checkpoint-N folders")
    parser.add_argument("--dataset", default=BUILTIN_CORPUS, help="the corpus the run trained on (train.py's)")
    parser.add_argument("--split", default="test", choices=["validation", "test"], help="the pairs scored")
    parser.add_argument("--average_last", default="5", help="K, or several: 3,5,8")
    parser.add_argument("--length_penalties", default="", help="also beam 4 with these GNMT alphas: 0.8,1.0")
    parser.add_argument(
        "--search", action="append", default=[], help="another beam-4 search as generate() kwargs: KEY=VALUE,KEY=VALUE"
    )
    parser.add_argument("--max_samples", type=int, default=None, help="only the split's first N pairs")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per batch of the search")
    args = parser.parse_args(argv)
    record = MachineRecord()
    sources, references = split_pairs(args.split, args.max_samples, args.dataset)
    average_last = [int(value) for value in args.average_last.split(",")]
    searches = dict(SEARCHES)
    saved = saved_search(Path(args.run))
    if saved is not None:
        searches[saved] = {}  # the model's own generation config
    for alpha in filter(None, args.length_penalties.split(",")):
        searches[f"beam 4, alpha {float(alpha)}"] = {"length_penalty": float(alpha)}
    searches.update({f"beam 4, {text}": parse_search(text) for text in args.search})
    rows = score_run(Path(args.run), sources, references, average_last, args.batch_size, searches)
    print_table(f"{args.run}, {args.split} split ({len(sources)} sentences), sacreBLEU {rows[0]['signature']}", rows,
                ["weights", "search", "bleu", "chrf", "bp", "seconds"])  # fmt: skip
    record.report({"run": args.run, "split": args.split, "rows": rows}, args.json)


# --- ensemble: the last K checkpoints ensembled against their average ------------------------------------------------


def ensemble(argv=None) -> dict:
    """The last K checkpoints ensembled (one search over their mean log-probabilities) beside their average (what the
    job publishes) and the last alone, translating a split side by side with the model's own search: BLEU, speed."""
    from vaswani_mt.inference.ensemble import load_ensemble
    from vaswani_mt.inference.loading import load_for_inference
    from vaswani_mt.inference.translate import translate
    from vaswani_mt.system import native_bf16

    parser = command_parser(ensemble)
    parser.add_argument("run", help="a finished training run's folder, holding checkpoint-N folders")
    parser.add_argument("--last", type=int, default=5, help="K: the last K checkpoints (default 5, as §6.1's base)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N test sentences")
    parser.add_argument("--dataset", default=BUILTIN_CORPUS, help="the corpus the run trained on")
    parser.add_argument("--split", default="test", choices=["validation", "test"], help="the pairs translated")
    parser.add_argument("--batch_size", type=int, default=32, help="sentences per batch")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the split per side")
    parser.add_argument("--device", default=None, help="default: GPU if there is one")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error(f"--last must be at least 1, got {args.last}")
    if args.threads:
        torch.set_num_threads(args.threads)
    record = MachineRecord()
    sources, references = split_pairs(args.split, args.limit, args.dataset)
    chosen = list_checkpoints(Path(args.run), resumable=False)[-args.last :]
    if not chosen:
        raise SystemExit(f"error: {args.run}: no complete checkpoint-N folders")
    window = f"{chosen[0].name} .. {chosen[-1].name}"
    with tempfile.TemporaryDirectory() as tmp:
        averaged = average_checkpoints(Path(args.run), args.last, Path(tmp) / "averaged")
        models = {
            f"ensemble of the last {len(chosen)} ({window})": load_ensemble(map(str, reversed(chosen)), args.device),
            "average (published)": load_for_inference(str(averaged), args.device),
            f"last checkpoint ({chosen[-1].name})": load_for_inference(str(chosen[-1]), args.device),
        }
    sides = {name: partial(translate, model, tokenizer, batch_size=args.batch_size)
             for name, (model, tokenizer) in models.items()}  # fmt: skip
    print(f"{args.run}, {args.split} split ({len(sources)} sentences), native_bf16() = {native_bf16()}")
    rows, _ = run_sides(sides, sources, references, args.repeats, "average (published)")
    result = {"run": args.run, "split": args.split, "sentences": len(sources), "limited": bool(args.limit),
              "native_bf16": native_bf16(), "rows": rows}  # fmt: skip
    return record.report(result, args.json)


def main(argv=None):
    return dispatch(__doc__, {"curve": curve, "search": search, "ensemble": ensemble}, argv)


if __name__ == "__main__":
    main()
