#!/usr/bin/env python
"""§6.1 "terminate early when possible": three stopping rules of the paper's beam search, measured on BLEU, decoder
steps and time, on the built-in test split and the held-out dev split, beside MarianMTModel's `generate()` with the
same weights (`to_marian`).

The rules, `early_stopping` as transformers names it (`beam_search_vaswani.can_improve`):

- `"never"`: the exact bound (tensor2tensor's): a sentence is done once its best running hypothesis, given the
  largest GNMT penalty it could still reach (at the a·|X|+b limit), cannot beat the worst finished one;
- `True`: fairseq's rule: a sentence is done once `num_beams` hypotheses have finished;
- `False`: transformers' heuristic: the bound taken at the current length rather than the longest.

Each rule searches the model's saved search otherwise (beam, alpha, a·|X|+b), batches of `--batch` sentences sorted
by source length as `translate()` batches them. A forward hook on each decoder counts its steps; for each batch it
also records the step at which its longest returned hypothesis ended, so that the steps a rule runs after it (spent
proving that nothing longer can win) are counted apart. Marian searches with its own heuristic, |Y|^alpha at the same
alpha and the batch's longest source + 50 as its limit, as a transformers user runs it. Times: one pass per side and
batch, interleaved (rotated each batch), summed; sentences per second.

    python benchmarks/stopping_rules.py outputs/ding-cpu --json benchmarks/stopping_rules_2026-11-26.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed_common import MachineRecord, print_table

from vaswani_mt.data.corpus import BUILTIN_CORPUS, load_corpus, source_target
from vaswani_mt.evaluation.metrics import bleu
from vaswani_mt.export.marian import to_marian
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.system.devices import native_bf16

RULES = {"exact bound (never)": "never", "fairseq (True)": True, "transformers heuristic (False)": False}


class StepCounter:
    """Counts the forward calls of a decoder (one per search step with a KV cache)."""

    def __init__(self, decoder: torch.nn.Module):
        self.calls = 0
        decoder.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.calls += 1


def batches_of(tokenizer, sources: list[str], size: int) -> tuple[list[int], list[dict]]:
    """The order (by source length) and the padded batches of `size` sentences, as translate() forms them."""
    encoded = tokenizer(sources)["input_ids"]
    order = sorted(range(len(sources)), key=lambda i: len(encoded[i]))
    batches = [
        tokenizer.pad({"input_ids": [encoded[i] for i in order[start : start + size]]}, return_tensors="pt")
        for start in range(0, len(order), size)
    ]
    return order, batches


def measure_split(name: str, sources, references, model, marian, tokenizer, batch_size: int) -> dict:
    order, batches = batches_of(tokenizer, sources, batch_size)
    alpha = model.generation_config.length_penalty
    counters = {"ours": StepCounter(model.model.decoder), "marian": StepCounter(marian.model.decoder)}
    sides = {label: ("ours", {"early_stopping": rule}) for label, rule in RULES.items()}
    sides["MarianMTModel (its heuristic)"] = ("marian", None)
    steps = {label: 0 for label in sides}
    needed = {label: 0 for label in sides}  # steps up to the end of each batch's longest returned hypothesis
    seconds = {label: 0.0 for label in sides}
    texts = {label: [""] * len(sources) for label in sides}
    labels = list(sides)
    for index, batch in enumerate(batches):
        rows = order[index * batch_size : index * batch_size + len(batch["input_ids"])]
        rotated = labels[index % len(labels) :] + labels[: index % len(labels)]
        for label in rotated:
            which, kwargs = sides[label]
            if which == "marian":
                limit = int(batch["attention_mask"].sum(-1).max()) + 50
                kwargs = {"num_beams": model.generation_config.num_beams, "length_penalty": alpha,
                          "max_new_tokens": limit, "early_stopping": False}  # fmt: skip
            counter = counters[which]
            before = counter.calls
            start = time.perf_counter()
            with torch.inference_mode():
                out = (model if which == "ours" else marian).generate(**batch, **kwargs)
            seconds[label] += time.perf_counter() - start
            steps[label] += counter.calls - before
            # the generated tokens of the longest output, its EOS included (a step makes one token)
            needed[label] += int(out[:, 1:].ne(tokenizer.pad_token_id).sum(-1).max())
            for row, text in zip(rows, tokenizer.batch_decode(out, skip_special_tokens=True), strict=True):
                texts[label][row] = text.strip()
    exact = texts["exact bound (never)"]
    result = {"split": name, "sentences": len(sources), "batches": len(batches), "sides": {}}
    for label in sides:
        result["sides"][label] = {
            "bleu": round(bleu(texts[label], references)["score"], 2),
            "decoder_steps": steps[label],
            "steps_to_longest_output": needed[label],
            "steps_after_longest_output": steps[label] - needed[label],
            "seconds": round(seconds[label], 2),
            "sentences_per_s": round(len(sources) / seconds[label], 1),
            "identical_to_exact_bound": sum(a == b for a, b in zip(texts[label], exact, strict=True)),
            "output_words": sum(len(t.split()) for t in texts[label]),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a saved vaswani_mt folder (the main job's: outputs/ding-cpu)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max_sentences", type=int, default=None, help="the first N of each split (a quick look)")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args()
    record = MachineRecord()
    model, tokenizer = load_for_inference(args.model, device="cpu")
    marian = to_marian(model).eval()
    corpus = load_corpus(BUILTIN_CORPUS, None, "en", "de")
    result = {"model": args.model, "native_bf16": native_bf16(), "search": model.generation_config.to_diff_dict(),
              "batch": args.batch, "splits": []}  # fmt: skip
    for split in ("test", "validation"):
        sources, references = source_target(corpus[split], "en", "de")
        if args.max_sentences:
            sources, references = sources[: args.max_sentences], references[: args.max_sentences]
        measured = measure_split(split, sources, references, model, marian, tokenizer, args.batch)
        result["splits"].append(measured)
        rows = [{"side": label, **values} for label, values in measured["sides"].items()]
        print_table(f"{split}: {measured['sentences']} sentences, {measured['batches']} batches of {args.batch}",
                    rows, list(rows[0]))  # fmt: skip
    result.update(record.finish())
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
