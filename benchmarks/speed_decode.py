#!/usr/bin/env python
"""Decoding speed side by side: vaswani_mt `generate()` vs transformers.MarianMTModel `generate()` with the same
weights (`to_marian`), interleaved in one process, with a check that both produce the same tokens.

Modes:

- `synthetic` (default): transformer-base shapes, random weights, sources of `--length` tokens, beam 4 and greedy
  at batch 1 and 16, exactly `--steps` new tokens (min = max new tokens) so both sides do the same work. With every
  hypothesis forced to the same length, any length penalty ranks beams alike, so each side keeps its own formula
  (ours: GNMT ((5 + |Y|) / 6)^0.6, Marian: |Y|^0.6) and the tokens must be identical. Peak RSS of each side at
  beam 4, batch 16 is measured in its own process.
- `testset`: the built-in corpus's test split with its real lengths, translated by a trained model (`--model`, a
  saved vaswani_mt folder with its tokenizer) in batches of similar length. Settings where both searches are the
  same algorithm, so the tokens must be identical: greedy, and beam 4 with length penalty 0 and
  `early_stopping="never"`, both with `max_new_tokens` = longest source in the batch + 50. Plus each side's own
  defaults (ours: the paper's search; Marian: beam 4, |Y|^0.6, early stopping heuristic), reported with the share
  of identical outputs. Sentences per second.

    python benchmarks/speed_decode.py
    python benchmarks/speed_decode.py --mode testset --model outputs/ding-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from speed_common import MachineRecord, child_argv, interleave, measure_peak_rss, peak_rss_mib, print_table, speedups

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.export import to_marian

SEARCHES = {"beam4": 4, "greedy": 1}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["synthetic", "testset"], default="synthetic")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab_size", type=int, default=37000)
    parser.add_argument("--length", type=int, default=30, help="synthetic: source tokens")
    parser.add_argument("--steps", type=int, default=30, help="synthetic: new tokens, min = max")
    parser.add_argument("--batches", default="1,16", help="synthetic: batch sizes")
    parser.add_argument("--searches", default="beam4,greedy")
    parser.add_argument("--repeats", type=int, default=5, help="synthetic: timed calls per side and case")
    parser.add_argument("--model", default=None, help="testset: a saved vaswani_mt model folder")
    parser.add_argument("--batch", type=int, default=16, help="testset: sentences per batch")
    parser.add_argument("--max_sentences", type=int, default=None, help="testset: first N test sentences")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--profile", action="store_true", help="synthetic: top operators of one call per side")
    parser.add_argument("--json", default=None)
    parser.add_argument("--only_memory", action="store_true", help="measure peak RSS only, no timing")
    parser.add_argument("--rss_child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def synthetic_models(args):
    torch.manual_seed(args.seed)
    ours = VaswaniForConditionalGeneration(VaswaniConfig.from_preset(args.preset, vocab_size=args.vocab_size)).eval()
    return ours, to_marian(ours).eval()


def synthetic_source(config, batch: int, length: int, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed + batch)
    ids = torch.randint(4, config.vocab_size, (batch, length), generator=generator)
    ids[:, -1] = config.eos_token_id
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def forced_kwargs(search: str, steps: int) -> dict:
    kwargs = {"num_beams": SEARCHES[search], "min_new_tokens": steps, "max_new_tokens": steps, "do_sample": False}
    if kwargs["num_beams"] > 1:
        kwargs["length_penalty"] = 0.6  # each side's own formula; equal lengths make them rank alike
    return kwargs


def run_synthetic(args) -> dict:
    ours, marian = synthetic_models(args)
    sides = {"vaswani_mt": ours, "marian": marian}
    if args.rss_child:
        inputs = synthetic_source(ours.config, 16, args.length, args.seed)
        for _ in range(2):
            sides[args.rss_child].generate(**inputs, **forced_kwargs("beam4", args.steps))
        print(json.dumps({"side": args.rss_child, "peak_rss_mib": peak_rss_mib()}))
        return {}
    shape = f"{args.preset}, vocab {args.vocab_size}, source {args.length} tokens, {args.steps} new tokens forced"
    if args.only_memory:
        peaks = measure_peak_rss(os.path.abspath(__file__), child_argv(args.argv), list(sides))
        print_table(f"Peak RSS, beam 4, batch 16 ({shape})", [{"side": n, "peak_rss_mib": p} for n, p in peaks.items()],
                    ["side", "peak_rss_mib"])  # fmt: skip
        return {"mode": "synthetic", "shape": shape, "peak_rss_mib_beam4_batch16": peaks}
    cases = []
    for batch in [int(b) for b in args.batches.split(",")]:
        inputs = synthetic_source(ours.config, batch, args.length, args.seed)
        for search in args.searches.split(","):
            kwargs = forced_kwargs(search, args.steps)
            outputs = {name: model.generate(**inputs, **kwargs) for name, model in sides.items()}
            identical = torch.equal(outputs["vaswani_mt"], outputs["marian"])
            times = interleave(
                {name: (lambda m=model, i=inputs, k=kwargs: m.generate(**i, **k)) for name, model in sides.items()},
                args.repeats,
                warmup=0,  # the equality check above was the warm-up
            )
            summary = speedups(times, "marian")
            case = {
                "search": search,
                "batch": batch,
                "identical_tokens": identical,
                "sentences_per_s": {name: batch / row["median_s"] for name, row in summary.items()},
                "ratio_of_medians": summary["vaswani_mt"]["ratio_of_medians"],
                "median_of_ratios": summary["vaswani_mt"]["median_of_ratios"],
                "median_s": {name: row["median_s"] for name, row in summary.items()},
                "min_s": {name: row["min_s"] for name, row in summary.items()},
            }
            cases.append(case)
            print(json.dumps(case), flush=True)
            if args.profile:
                profile_calls(sides, inputs, kwargs, f"{search}, batch {batch}")
    result = {"mode": "synthetic", "shape": shape, "cases": cases}
    if args.memory:
        result["peak_rss_mib_beam4_batch16"] = measure_peak_rss(
            os.path.abspath(__file__), child_argv(args.argv), list(sides)
        )
    rows = [
        {
            "search": c["search"],
            "batch": c["batch"],
            "identical tokens": c["identical_tokens"],
            "vaswani_mt sent/s": c["sentences_per_s"]["vaswani_mt"],
            "marian sent/s": c["sentences_per_s"]["marian"],
            "ratio_of_medians": c["ratio_of_medians"],
            "median_of_ratios": c["median_of_ratios"],
        }
        for c in cases
    ]
    print_table(f"Decoding ({result['shape']}), {args.repeats} interleaved calls per side", rows, list(rows[0]))
    return result


def profile_calls(sides: dict, inputs: dict, kwargs: dict, title: str) -> None:
    from torch.profiler import profile

    for name, model in sides.items():
        with profile() as prof:
            model.generate(**inputs, **kwargs)
        print(f"\n{name}, {title}:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


# ---------------------------------------------------------------------------------------------------------------
# testset mode


def run_testset(args) -> dict:
    from transformers import AutoTokenizer

    from vaswani_mt.data import load_corpus, source_target

    if not args.model:
        raise SystemExit("--mode testset needs --model, a saved vaswani_mt folder (e.g. outputs/ding-cpu)")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ours = VaswaniForConditionalGeneration.from_pretrained(args.model).eval()
    marian = to_marian(ours).eval()
    sides = {"vaswani_mt": ours, "marian": marian}
    sources, _ = source_target(load_corpus("ding")["test"], "en", "de")
    sources = sources[: args.max_sentences] if args.max_sentences else sources
    encoded = tokenizer(sources)["input_ids"]
    order = sorted(range(len(sources)), key=lambda i: len(encoded[i]))  # batches of similar length, as translate()
    batches = []
    for start in range(0, len(order), args.batch):
        rows = [encoded[i] for i in order[start : start + args.batch]]
        batches.append(tokenizer.pad({"input_ids": rows}, return_tensors="pt"))

    settings = {
        "greedy (identical by construction)": dict(num_beams=1, do_sample=False),
        "beam 4, length penalty 0, early_stopping never (identical by construction)": dict(
            num_beams=4, length_penalty=0.0, early_stopping="never", do_sample=False
        ),
        "beam 4, each side's defaults (ours: GNMT 0.6, |X|+50; Marian: |Y|^0.6, early-stop heuristic)": None,
    }
    cases = []
    for title, setting in settings.items():
        seconds = {name: 0.0 for name in sides}
        same = 0
        lengths = {name: 0 for name in sides}
        for index, batch in enumerate(batches):
            budget = int(batch["attention_mask"].sum(-1).max()) + 50
            kwargs = {
                "vaswani_mt": dict(setting, max_new_tokens=budget) if setting is not None else {},
                "marian": dict(setting, max_new_tokens=budget)
                if setting is not None
                else dict(num_beams=4, length_penalty=0.6, max_new_tokens=budget),
            }
            names = list(sides) if index % 2 == 0 else list(sides)[::-1]
            outputs = {}
            for name in names:
                start = time.perf_counter()
                outputs[name] = sides[name].generate(**batch, **kwargs[name])
                seconds[name] += time.perf_counter() - start
            texts = {name: tokenizer.batch_decode(out, skip_special_tokens=True) for name, out in outputs.items()}
            same += sum(a == b for a, b in zip(texts["vaswani_mt"], texts["marian"], strict=True))
            for name, out in outputs.items():
                lengths[name] += int(out[:, 1:].ne(tokenizer.pad_token_id).sum())
        case = {
            "setting": title,
            "sentences": len(sources),
            "identical_share": same / len(sources),
            "sentences_per_s": {name: len(sources) / s for name, s in seconds.items()},
            "seconds": seconds,
            "output_tokens": lengths,
            "ratio": seconds["marian"] / seconds["vaswani_mt"],
        }
        cases.append(case)
        print(json.dumps(case), flush=True)
    rows = [
        {
            "setting": c["setting"],
            "identical outputs": f"{c['identical_share']:.1%}",
            "vaswani_mt sent/s": c["sentences_per_s"]["vaswani_mt"],
            "marian sent/s": c["sentences_per_s"]["marian"],
            "ratio": c["ratio"],
        }
        for c in cases
    ]
    print_table(
        f"Test split ({len(sources)} sentences, batches of {args.batch} by length, model {args.model})",
        rows,
        list(rows[0]),
    )
    return {"mode": "testset", "model": args.model, "batch": args.batch, "cases": cases}


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    record = MachineRecord()
    result = run_synthetic(args) if args.mode == "synthetic" else run_testset(args)
    if args.rss_child:
        return
    result["record"] = record.finish()
    print("\n" + json.dumps(result, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
