#!/usr/bin/env python
"""The paper's beam search, ours (`beam_search_vaswani.beam_search`, public transformers API), against `generate()`
as it was before (transformers' `_beam_search` with the paper's rules hooked into its private methods, the payload's
file at commit `--before`, read with git) and against MarianMTModel's `generate()` with the same weights: the same
tokens and `sequences_scores`, and sentences/s, on a split of the built-in corpus.

Each search runs every test sentence in batches of `--batch_size` (sources sorted by length, as `translate` does);
the three sides are timed interleaved, `--repeats` rounds. Marian's search has transformers' `|Y|^alpha` penalty and
stopping heuristic, so its tokens are not expected to equal ours: it is timed, and its share of equal sentences is
given. It gets the same length limit, each sentence's `|X| + 50` (`PerSentenceMaxLength` and the batch's longest as
`max_new_tokens`); without one, transformers stops it at its default `max_length` of 20 tokens.

    python benchmarks/search_before_after.py outputs/ding-cpu --json benchmarks/search_before_after_2026-11-25.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import torch
from speed_common import MachineRecord, interleave, speedups
from transformers import AutoTokenizer, LogitsProcessorList

from vaswani_mt.data.corpus import BUILTIN_CORPUS, load_corpus, source_target
from vaswani_mt.export.marian import to_marian
from vaswani_mt.model.generation_vaswani import PerSentenceMaxLength
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration
from vaswani_mt.system import native_bf16

ROOT = Path(__file__).resolve().parents[1]
SEARCHES = {"beam 4, alpha 0.6": (4, 0.6), "beam 4, alpha 1.2": (4, 1.2), "beam 8, alpha 1.2": (8, 1.2)}


def model_before(model: VaswaniForConditionalGeneration, commit: str) -> VaswaniForConditionalGeneration:
    """`model` with the generation mixin of `commit` (its `generate` and the private hooks it overrode)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:vaswani_mt/model/generation_vaswani.py"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    source = source.replace("return super().generate(", "return GenerationMixin.generate(self, ")
    source = source.replace(
        "return super()._update_finished_beams(", "return GenerationMixin._update_finished_beams(self, "
    )
    module = types.ModuleType("generation_before")
    exec(compile(source, f"{commit}:generation_vaswani.py", "exec"), module.__dict__)  # our own file, from git
    mixin = module.VaswaniGenerationMixin
    names = {"generate": mixin.generate, "_reorder_cache": mixin._reorder_cache,
             "_update_finished_beams": mixin._update_finished_beams,
             "_check_early_stop_heuristic": staticmethod(mixin._check_early_stop_heuristic)}  # fmt: skip
    before = type("VaswaniBefore", (VaswaniForConditionalGeneration,), names)
    copy = before(model.config).eval()
    copy.load_state_dict(model.state_dict())
    copy.generation_config = model.generation_config
    return copy


def batches(tokenizer, sources: list[str], size: int) -> list[dict]:
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    return [tokenizer([sources[i] for i in order[start : start + size]], return_tensors="pt", padding=True)
            for start in range(0, len(order), size)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--before", default="56db6a8", help="the commit whose generate() is 'before'")
    parser.add_argument("--dataset", default=BUILTIN_CORPUS)
    parser.add_argument("--split", default="test")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--searches", default="|".join(SEARCHES), help="some of the searches, separated by |")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    record = MachineRecord()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ours = VaswaniForConditionalGeneration.from_pretrained(args.model).eval()
    before, marian = model_before(ours, args.before), to_marian(ours).eval()
    sources, _ = source_target(load_corpus(args.dataset)[args.split], "en", "de")
    inputs = batches(tokenizer, sources, args.batch_size)
    results = {}
    for name in args.searches.split("|"):
        beams, alpha = SEARCHES[name]
        options = dict(num_beams=beams, length_penalty=alpha)

        def limit(model, batch):
            """Marian's length limit: ours, each sentence's |X| + 50 (a fresh processor per call: it keeps state)."""
            if model is not marian:
                return {}
            limits = batch["attention_mask"].sum(-1) + 50
            processor = PerSentenceMaxLength(limits, marian.generation_config.eos_token_id)
            return {"max_new_tokens": int(limits.max()), "logits_processor": LogitsProcessorList([processor])}

        def run(model, options=options):
            with torch.inference_mode():
                return [model.generate(**batch, **options, **limit(model, batch)) for batch in inputs]

        # Compared batch by batch: the per-step scores that `sequences_scores` comes with are large.
        equal, same_as_marian = True, 0
        with torch.inference_mode():
            for batch in inputs:
                a, b = (model.generate(**batch, **options, output_scores=True, return_dict_in_generate=True)
                        for model in (ours, before))  # fmt: skip
                equal &= torch.equal(a.sequences, b.sequences) and torch.equal(a.sequences_scores, b.sequences_scores)
                theirs = marian.generate(**batch, **options, **limit(marian, batch))
                same_as_marian += sum(x[1:][x[1:] != 1].tolist() == y[1:][y[1:] != 1].tolist()
                                      for x, y in zip(a.sequences, theirs, strict=True))  # fmt: skip
        times = interleave({"ours": lambda: run(ours), "before": lambda: run(before), "marian": lambda: run(marian)},
                           args.repeats, warmup=0)  # fmt: skip
        ratios = speedups(times, "before")
        results[name] = {
            "tokens_and_scores_equal_to_before": equal,
            "share_equal_to_marian": round(same_as_marian / len(sources), 3),
            "sentences_per_s": {side: round(len(sources) / row["median_s"], 1) for side, row in ratios.items()},
            "ours_vs_before": round(ratios["ours"]["ratio_of_medians"], 3),
            "ours_vs_marian": round(ratios["marian"]["median_s"] / ratios["ours"]["median_s"], 3),
        }
        print(name, json.dumps(results[name]), flush=True)
    out = {"what": "benchmarks/search_before_after.py", "machine": {**record.finish(), "native_bf16": native_bf16()},
           "model": args.model, "sentences": len(sources), "args": vars(args), "searches": results}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    sys.exit(0 if all(row["tokens_and_scores_equal_to_before"] for row in results.values()) else 1)


if __name__ == "__main__":
    main()
