#!/usr/bin/env python
"""A change to the beam search against the code before it, in one process: bit-equal tokens and sequences_scores,
and interleaved timed calls (medians). `--old`: a copy of an earlier vaswani_mt/model/beam_search_vaswani.py, run
in place of the working tree's (its cache reordered as transformers' `DynamicCache.reorder_cache` does).

- `base`: transformer-base shapes, random weights (seed 0), batch 16, beam 4, 30 forced new tokens.
- `testset`: the first `--sentences` test sentences, batches of 16 by length, `--model`'s own search.

    git show 5f73a92:vaswani_mt/model/beam_search_vaswani.py > /tmp/old_bs.py
    python benchmarks/lean_step_ab.py base --old /tmp/old_bs.py --repeats 7
    python benchmarks/lean_step_ab.py testset --old /tmp/old_bs.py --model outputs/ding-cpu --sentences 160
"""

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed_common import MachineRecord

import vaswani_mt.model.beam_search_vaswani as new
import vaswani_mt.model.generation_vaswani as generation
from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.system import native_bf16


def load_old(path: str):
    """The earlier search as a sibling module of the payload (its relative imports resolve)."""
    spec = importlib.util.spec_from_file_location("vaswani_mt.model._lean_step_old", path)
    old = importlib.util.module_from_spec(spec)
    old.__package__ = "vaswani_mt.model"
    spec.loader.exec_module(old)

    def reorder(self, beam_idx):
        if self.cache is not None:
            self.cache.self_attention_cache.reorder_cache(beam_idx)

    old._Decoder.reorder = reorder
    return old


def calls(args):
    """A callable running the case with `generation.beam_search` as it is, returning (sequences, scores) per batch."""
    if args.mode == "base":
        torch.manual_seed(0)
        config = VaswaniConfig.from_preset("base", vocab_size=37000)
        model = VaswaniForConditionalGeneration(config).eval()
        ids = torch.randint(4, 37000, (16, 30))
        ids[:, -1] = config.eos_token_id
        batches = [{"input_ids": ids}]
        options = dict(num_beams=4, min_new_tokens=30, max_new_tokens=30)
    else:
        from transformers import AutoTokenizer

        from vaswani_mt.data.corpus import load_corpus, source_target

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = VaswaniForConditionalGeneration.from_pretrained(args.model).eval()
        sources = source_target(load_corpus("ding")["test"], "en", "de")[0][: args.sentences]
        encoded = tokenizer(sources)["input_ids"]
        order = sorted(range(len(sources)), key=lambda i: len(encoded[i]))
        batches = [tokenizer.pad({"input_ids": [encoded[i] for i in order[s : s + 16]]}, return_tensors="pt")
                   for s in range(0, len(order), 16)]  # fmt: skip
        options = {}

    def run():
        outputs = [model.generate(**b, **options, return_dict_in_generate=True, output_scores=True) for b in batches]
        return [(o.sequences, o.sequences_scores) for o in outputs]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["base", "testset"])
    parser.add_argument("--old", required=True, help="an earlier beam_search_vaswani.py")
    parser.add_argument("--model", default="outputs/ding-cpu")
    parser.add_argument("--sentences", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    record = MachineRecord()
    searches = {"old": load_old(args.old).beam_search, "new": new.beam_search}
    run = calls(args)

    def side(name):
        generation.beam_search = searches[name]
        return run()

    first = {name: side(name) for name in searches}
    equal = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*first.values(), strict=True))
    times = {name: [] for name in searches}
    for round_ in range(args.repeats):
        for name in list(searches)[:: 1 if round_ % 2 == 0 else -1]:
            start = time.perf_counter()
            side(name)
            times[name].append(round(time.perf_counter() - start, 3))
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {"mode": args.mode, "native_bf16": native_bf16(), "bit_equal": equal, "rounds_s": times,
              "median_s": medians, "new_x_old": round(medians["old"] / medians["new"], 3)}  # fmt: skip
    record.report(result, args.json)


if __name__ == "__main__":
    main()
