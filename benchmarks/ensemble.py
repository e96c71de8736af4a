#!/usr/bin/env python
"""Ensembling against checkpoint averaging: test sacreBLEU and decoding speed of one training run's last K
checkpoints (§6.1 averages the last 5) used three ways, each with the model's own search (its generation config):

- the ensemble of the last K checkpoints (`vaswani_mt.inference.ensemble`: the mean of their probabilities at every
  step, K decoders per step; the newest checkpoint first, so that its generation config is the search);
- their average (`average_checkpoints`, what training publishes): one model;
- the last checkpoint alone.

Prints one JSON object (rows, the run, the machine, `native_bf16()`) and a markdown table. Speed is translated
sentences per second (tokenizing, batching and the search; scoring excluded), after a few sentences of warm-up.

    python benchmarks/ensemble.py outputs/run --last 5
    python benchmarks/ensemble.py outputs/ding-cpu --last 5 --limit 100 --threads 1 --json ensemble.json
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed_common import MachineRecord

from vaswani_mt.data.corpus import BUILTIN_CORPUS, load_corpus, source_target
from vaswani_mt.evaluation.metrics import bleu
from vaswani_mt.hub.card import search_summary
from vaswani_mt.inference.ensemble import load_ensemble
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.translate import translate
from vaswani_mt.system import native_bf16
from vaswani_mt.training.checkpoints import average_checkpoints, list_checkpoints

WARMUP_SENTENCES = 4


def score(load, sources: list[str], references: list[str], batch_size: int) -> dict:
    """Loads a model (`load()` -> model, tokenizer), translates `sources` with its own search, scores them."""
    model, tokenizer = load()
    translate(model, tokenizer, sources[:WARMUP_SENTENCES], batch_size)
    start = time.perf_counter()
    translations = translate(model, tokenizer, sources, batch_size)
    seconds = time.perf_counter() - start
    result = bleu(translations, references)
    return {
        "bleu": round(result["score"], 2),
        "chrf": round(result["chrf"], 2),
        "bp": round(result["bp"], 3),
        "seconds": round(seconds, 1),
        "sentences_per_second": round(len(sources) / seconds, 2),
        "search": search_summary(model.generation_config),
        "signature": result["signature"],
    }


def run_benchmark(run: Path, last: int, sources, references, batch_size: int, device: str | None) -> list[dict]:
    checkpoints = list_checkpoints(run, resumable=False)
    if not checkpoints:
        raise SystemExit(f"error: {run}: no complete checkpoint-N folders")
    chosen = checkpoints[-last:]
    window = f"{chosen[0].name} .. {chosen[-1].name}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        averaged = average_checkpoints(run, last, Path(tmp) / "averaged")
        candidates = {
            f"ensemble of the last {len(chosen)} ({window})": (
                len(chosen), lambda: load_ensemble([str(c) for c in reversed(chosen)], device=device)
            ),
            f"average of the last {len(chosen)} ({window}; published)": (
                1, lambda: load_for_inference(str(averaged), device=device)
            ),
            f"last checkpoint ({chosen[-1].name})": (1, lambda: load_for_inference(str(chosen[-1]), device=device)),
        }  # fmt: skip
        for name, (models, load) in candidates.items():
            rows.append({"weights": name, "models": models, **score(load, sources, references, batch_size)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a finished training run's folder, holding checkpoint-N folders")
    parser.add_argument("--last", type=int, default=5, help="K: the last K checkpoints (default 5, as §6.1's base)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N test sentences")
    parser.add_argument("--dataset", default=BUILTIN_CORPUS, help="the corpus the run trained on")
    parser.add_argument("--split", default="test", choices=["validation", "test"])
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--device", default=None, help="default: GPU if there is one")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error(f"--last must be at least 1, got {args.last}")
    if args.threads:
        torch.set_num_threads(args.threads)

    record = MachineRecord()
    sources, references = source_target(load_corpus(args.dataset)[args.split], "en", "de")
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]
    rows = run_benchmark(Path(args.run), args.last, sources, references, args.batch_size, args.device)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    result = {
        "run": args.run,
        "split": args.split,
        "sentences": len(sources),
        "limited": bool(args.limit),
        "device": device,
        "native_bf16": native_bf16(),
        "rows": rows,
        **record.finish(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{args.run}, {args.split} split ({len(sources)} sentences), {device}, native_bf16() = {native_bf16()}")
    print(f"search: {rows[0]['search']}; sacreBLEU {rows[0]['signature']}\n")
    print("| weights | models per step | BLEU | chrF | BP | sentences/s |\n|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['weights']} | {row['models']} | {row['bleu']} | {row['chrf']} | {row['bp']} | "
              f"{row['sentences_per_second']} |")  # fmt: skip


if __name__ == "__main__":
    main()
