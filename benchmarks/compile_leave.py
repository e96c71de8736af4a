#!/usr/bin/env python
"""Issue 52, item 4: translate() on the test split (the model's search, batches of 16, float32) with finished
sentences leaving the batch, eager against the decoder step torch.compile'd with dynamic shapes
(`compile_config=CompileConfig(dynamic=True)`), in one process: a cold first compiled round (inductor's cache in a
fresh folder: what one translate.py run pays), then paired rounds interleaved; equal lines, the largest score
difference, dynamo's counters (frames, recompiles, graphs) and the decoder step's median seconds by row count.

    python benchmarks/compile_leave.py --model outputs/ding-cpu --repeats 3
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor_cold_"))  # a cold compile

import torch
from speed_common import MachineRecord, command_parser, interleave, split_pairs
from transformers import CompileConfig

from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.translate import translate
from vaswani_mt.model import beam_search_vaswani as search


def main(argv=None) -> dict:
    parser = command_parser(__doc__)
    parser.add_argument("--model", required=True, help="a trained model folder (the main job's: outputs/ding-cpu)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lines", type=int, default=None, help="the test split's first lines (default: all 584)")
    parser.add_argument("--repeats", type=int, default=3, help="paired rounds, interleaved, after the cold one")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    record = MachineRecord()
    model, tokenizer = load_for_inference(args.model, device="cpu")
    sources = split_pairs("test", args.lines)[0]
    compiled = CompileConfig(dynamic=True, mode="default", fullgraph=False)
    output, step, scores, steps, found = search._output, search._Decoder.next_log_probs, [], defaultdict(list), {}
    search._output = lambda finished, *rest: scores.append(finished.scores[:, 0]) or output(finished, *rest)

    def timed_step(decoder, sequences, *rest):
        start = time.perf_counter()
        log_probs = step(decoder, sequences, *rest)
        steps[name_of[0], sequences.shape[0] * sequences.shape[1]].append(time.perf_counter() - start)
        return log_probs

    search._Decoder.next_log_probs, name_of = timed_step, ["eager"]

    def side(name: str, options: dict):
        def run():
            name_of[0] = name
            scores.clear()
            found[name] = translate(model, tokenizer, sources, batch_size=args.batch_size, **options), torch.cat(scores)

        return run

    runs = {"eager": side("eager", {}), "compiled": side("compiled", {"compile_config": compiled})}
    try:
        cold = interleave({"eager, first": runs["eager"], "compiled, cold": runs["compiled"]}, 1, warmup=0)
        counts = {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if k in ("frames", "stats", "recompiles")}
        times = interleave(runs, args.repeats, warmup=0)
    finally:
        search._output, search._Decoder.next_log_probs = output, step
    (eager, eager_scores), (comp, comp_scores) = found["eager"], found["compiled"]
    warm = {name: statistics.median(t) for name, t in times.items()}
    by_rows = {
        rows: {name: round(statistics.median(steps[name, rows]) * 1e3, 3) for name in runs if steps[name, rows]}
        for rows in sorted({rows for _, rows in steps})
    }  # fmt: skip
    result = {
        "sentences_per_s": {name: round(len(sources) / t, 2) for name, t in warm.items()},
        "compiled_against_eager": {
            "median_of_round_ratios": round(
                statistics.median(e / c for e, c in zip(times["eager"], times["compiled"], strict=True)), 3
            ),
            "ratio_of_medians": round(warm["eager"] / warm["compiled"], 3),
            "with_compile_time": round(warm["eager"] / cold["compiled, cold"][0], 3),
        },
        "seconds": {name: [round(x, 2) for x in t] for name, t in {**cold, **times}.items()},
        "compile_seconds": round(cold["compiled, cold"][0] - warm["compiled"], 1),
        "dynamo_counters_after_the_cold_round": counts,
        "step_ms_by_rows (median)": by_rows,
        "steps_per_round": {
            name: sum(len(v) for (n, _), v in steps.items() if n == name) // (args.repeats + 1) for name in runs
        },
        "lines_equal": f"{sum(a == b for a, b in zip(eager, comp, strict=True))}/{len(sources)}",
        "max_score_difference": float((eager_scores - comp_scores).abs().max()),
    }
    return record.report(result, args.json)


if __name__ == "__main__":
    main()
