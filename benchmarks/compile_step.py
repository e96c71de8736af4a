#!/usr/bin/env python
"""Issue 62, item 5: the decoder step eager and compiled with its weights frozen (`--compile_step on`), each through the
Translator as translate.py runs it (the model's search, batches of 16, float32, sentences leaving), each in fresh
processes: a cold one (inductor's cache empty) and a second on the cache the first left, as a second translate.py run
meets it. Per side: the first round's seconds (its compile in it), the rounds after it, the compile (first round less
a steady one), sentences/s, lines equal to eager's and the largest difference of the best hypothesis' score, dynamo's
and inductor's counters, and where each compiled side pays: the input, in lines, whose time saved covers the compile
from the kept cache.

    python benchmarks/compile_step.py --model outputs/ding-cpu --threads 2 --json OUT.json
    python benchmarks/compile_step.py --model outputs/ding-cpu --max_sentences 32 --repeats 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIDES = ("eager", "on")  # "on" without freezing (0.98-1.01x eager) removed: RESULTS


def _parser():
    from speed_common import command_parser

    parser = command_parser(__doc__)
    parser.add_argument("--model", required=True, help="a trained model folder (the main job's: outputs/ding-cpu)")
    parser.add_argument("--max_sentences", type=int, default=None, help="the test split's first N (default: all)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="rounds after the first, in each process")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"of {', '.join(SIDES)}")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)  # a process of one side
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    return parser


def child(args) -> None:
    """One process of one side: the model loaded, the test lines translated 1 + `repeats` times; one JSON line."""
    import torch
    from speed_common import split_pairs

    from vaswani_mt.inference.options import TranslationOptions
    from vaswani_mt.inference.translator import Translator
    from vaswani_mt.model import beam_search_vaswani as search

    sources = split_pairs("test", args.max_sentences)[0]
    options = TranslationOptions(batch_size=args.batch_size, threads=args.threads,
                                 compile_step=None if args.child == "eager" else args.child)  # fmt: skip
    translator = Translator(args.model, options=options)
    output, scores = search._output, []
    search._output = lambda finished, *rest: scores.append(finished.scores[:, 0].clone()) or output(finished, *rest)
    seconds, lines = [], None
    for _ in range(1 + args.repeats):
        scores.clear()
        start = time.perf_counter()
        lines = translator.translate(sources)
        seconds.append(time.perf_counter() - start)
    counters = torch._dynamo.utils.counters
    kept = {"frames", "stats", "inductor", "aot_autograd"}
    counts = {kind: {k: v for k, v in dict(c).items() if "matcher" not in k} for kind, c in counters.items()
              if kind in kept}  # fmt: skip
    print(json.dumps({"seconds": seconds, "lines": lines, "scores": torch.cat(scores).tolist(), "counters": counts,
                      "threads": torch.get_num_threads()}))  # fmt: skip


def _run(args, side: str, cache: Path) -> dict:
    given = {"--model": args.model, "--child": side, "--cache": cache, "--batch_size": args.batch_size,
             "--threads": args.threads, "--repeats": args.repeats, "--max_sentences": args.max_sentences}  # fmt: skip
    given = [str(x) for option, value in given.items() if value is not None for x in (option, value)]
    command = [sys.executable, __file__, *given]
    environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environment)
    found = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{side} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return {**json.loads(found[-1]), "process_seconds": time.perf_counter() - start}


def main(argv=None) -> dict:
    args = _parser().parse_args(argv)
    if args.child:
        return child(args)
    from speed_common import MachineRecord

    record, sides, result = MachineRecord(), args.sides.split(","), {}
    root = Path(tempfile.mkdtemp(prefix="compile_step_"))
    runs = {}
    try:
        for side in sides:  # a cold process, then (compiled sides) a fresh one on the cache the cold one left
            runs[side, "cold"] = _run(args, side, root / side)
            if side != "eager":
                runs[side, "kept cache"] = _run(args, side, root / side)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    eager = runs.get(("eager", "cold"))
    sentences = len(next(iter(runs.values()))["lines"])
    eager_rate = sentences / statistics.median(eager["seconds"][1:]) if eager else None
    for (side, process), run in runs.items():
        steady = statistics.median(run["seconds"][1:])
        row = {
            "first_round_s": round(run["seconds"][0], 2), "rounds_after_s": [round(s, 2) for s in run["seconds"][1:]],
            "sentences_per_s": round(sentences / steady, 2), "process_s": round(run["process_seconds"], 1),
            "counters": run["counters"],
        }  # fmt: skip
        if side != "eager":
            row["compile_s"] = round(run["seconds"][0] - steady, 1)
        if eager and side != "eager":
            row["against_eager"] = round(row["sentences_per_s"] / eager_rate, 3)
            row["lines_equal"] = f"{sum(a == b for a, b in zip(eager['lines'], run['lines'], strict=True))}/{sentences}"
            row["max_score_difference"] = max(abs(a - b) for a, b in zip(eager["scores"], run["scores"], strict=True))
            saved = 1 / eager_rate - 1 / row["sentences_per_s"]  # seconds a sentence
            row["pays_from_lines"] = round(row["compile_s"] / saved) if saved > 0 else None
        result[f"{side}, {process}"] = row
    result["sentences"], result["threads"] = sentences, eager["threads"] if eager else args.threads
    return record.report(result, args.json)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
