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

`--bf16` adds two opt-in sides, each model with its weights cast to bfloat16 (`model.to(torch.bfloat16)`, what a
transformers user does; the search itself scores in float32): `vaswani_mt_bf16` and `marian_bf16`. Their ratios are
against Marian in float32 as well, and since bf16 changes the numbers, the tokens are not expected to equal the
float32 ones: the synthetic mode reports the share of float32 outputs each reproduces, the test-split mode the
share and every side's sacreBLEU against the references.

`--static_cache` adds `vaswani_mt_static` and `marian_static`: the same float32 models generating with transformers'
preallocated KV cache (`cache_implementation="static"`, which torch.compile'd decoding needs) instead of the
growing `DynamicCache`; the same numbers, so their tokens must equal the float32 ones. `--compile` adds
`vaswani_mt_compiled` and `marian_compiled`: the static cache plus transformers' automatic `torch.compile` of the
forward (a `CompileConfig`, told to compile on a CPU too); the first call of each case compiles (its seconds are
reported as `compile_s`), the timed calls reuse the compiled code. transformers (5.24) compiles greedy search and
sampling only: its beam search calls the model uncompiled, so there the `_compiled` sides are the static cache again.

`--device` picks where both modes run (`cuda`, `cuda:1`, `cpu`; default: cuda where torch sees one, else the CPU); on
an accelerator every timed call waits for its kernels to finish.

    python benchmarks/speed_decode.py
    python benchmarks/speed_decode.py --mode testset --model outputs/ding-cpu
    python benchmarks/speed_decode.py --bf16 --searches beam4 --batches 16
    python benchmarks/speed_decode.py --static_cache --compile
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch
from speed_common import (
    MachineRecord,
    child_argv,
    interleave,
    measure_peak_rss,
    peak_rss_mib,
    print_table,
    profile_operators,
    speedups,
)

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.export.marian import to_marian

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
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--bf16", action="store_true", help="also both models with bf16 weights (opt-in numerics)")
    parser.add_argument("--static_cache", action="store_true", help="also both models with a preallocated KV cache")
    parser.add_argument("--int8", action="store_true", help="also both models with dynamic int8 Linear layers "
                        "(compute_type='int8': inference.compute_types.apply_compute_type)")  # fmt: skip
    parser.add_argument("--compile", action="store_true", help="also both models compiled, with the static cache")
    parser.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--profile", action="store_true", help="synthetic: top operators of one call per side")
    parser.add_argument("--json", default=None)
    parser.add_argument("--only_memory", action="store_true", help="measure peak RSS only, no timing")
    parser.add_argument("--rss_child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return args


def wait(device: str) -> None:
    """On an accelerator, waits for the kernels queued so far (a timed call then includes all of its work)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    elif device != "cpu":
        torch.accelerator.synchronize()


def synchronized(call, device: str):
    """`call`, then `wait(device)`; on the CPU `call` itself."""
    if device == "cpu":
        return call

    def call_and_wait():
        out = call()
        wait(device)
        return out

    return call_and_wait


def synthetic_models(args):
    torch.manual_seed(args.seed)
    ours = VaswaniForConditionalGeneration(VaswaniConfig.from_preset(args.preset, vocab_size=args.vocab_size)).eval()
    marian = to_marian(ours).eval()
    return ours.to(args.device), marian.to(args.device)


class WithStaticCache:
    """`model.generate()` with transformers' preallocated KV cache (`cache_implementation="static"`)."""

    def __init__(self, model):
        self.model = model

    def generate(self, **kwargs):
        return self.model.generate(**kwargs, cache_implementation="static")


class Compiled(WithStaticCache):
    """`model.generate()` with the static cache and transformers' automatic `torch.compile` of the forward."""

    def __init__(self, model):
        from transformers import CompileConfig

        super().__init__(model)
        self.compile_config = CompileConfig(mode="default")
        self.compile_config._compile_all_devices = True  # transformers compiles on accelerators only unless told

    def generate(self, **kwargs):
        return super().generate(**kwargs, compile_config=self.compile_config)


# The opt-in variants of a float32 side, as suffixes of its name.
VARIANTS = ("_bf16", "_int8", "_static", "_compiled")


def float32_side(name: str) -> str:
    """The float32 side a variant is of: `vaswani_mt_bf16` -> `vaswani_mt`."""
    for suffix in VARIANTS:
        name = name.removesuffix(suffix)
    return name


def make_sides(ours, marian, bf16: bool, static_cache: bool = False, compiled: bool = False,
               int8: bool = False) -> dict:  # fmt: skip
    sides = {"vaswani_mt": ours, "marian": marian}
    if int8:
        from vaswani_mt.inference.compute_types import apply_compute_type

        sides["vaswani_mt_int8"] = apply_compute_type(copy.deepcopy(ours), "int8")
        sides["marian_int8"] = apply_compute_type(copy.deepcopy(marian), "int8")
    if bf16:
        sides["vaswani_mt_bf16"] = copy.deepcopy(ours).to(torch.bfloat16)
        sides["marian_bf16"] = copy.deepcopy(marian).to(torch.bfloat16)
    if static_cache:
        sides["vaswani_mt_static"] = WithStaticCache(ours)
        sides["marian_static"] = WithStaticCache(marian)
    if compiled:
        sides["vaswani_mt_compiled"] = Compiled(ours)
        sides["marian_compiled"] = Compiled(marian)
    return sides


def _same_rows(a: torch.Tensor, b: torch.Tensor) -> float:
    """Share of rows (sentences, or hypotheses) of two generate() outputs that are the same tokens."""
    if a.shape != b.shape:
        width = max(a.shape[1], b.shape[1])
        a, b = (torch.nn.functional.pad(t, (0, width - t.shape[1]), value=-1) for t in (a, b))
    return a.eq(b).all(dim=1).float().mean().item()


def synthetic_source(config, batch: int, length: int, seed: int, device: str = "cpu") -> dict:
    generator = torch.Generator().manual_seed(seed + batch)
    ids = torch.randint(4, config.vocab_size, (batch, length), generator=generator)
    ids[:, -1] = config.eos_token_id
    ids = ids.to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def forced_kwargs(search: str, steps: int) -> dict:
    kwargs = {"num_beams": SEARCHES[search], "min_new_tokens": steps, "max_new_tokens": steps, "do_sample": False}
    if kwargs["num_beams"] > 1:
        kwargs["length_penalty"] = 0.6  # each side's own formula; equal lengths make them rank alike
    return kwargs


def run_synthetic(args) -> dict:
    ours, marian = synthetic_models(args)
    sides = make_sides(ours, marian, args.bf16, args.static_cache, args.compile, args.int8)
    if args.rss_child:
        inputs = synthetic_source(ours.config, 16, args.length, args.seed, args.device)
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
        inputs = synthetic_source(ours.config, batch, args.length, args.seed, args.device)
        for search in args.searches.split(","):
            kwargs = forced_kwargs(search, args.steps)
            outputs, first_call_s = {}, {}
            for name, model in sides.items():  # the warm-up; for the compiled sides, the compilation
                start = time.perf_counter()
                outputs[name] = model.generate(**inputs, **kwargs)
                wait(args.device)
                first_call_s[name] = time.perf_counter() - start
            identical = torch.equal(outputs["vaswani_mt"], outputs["marian"])
            times = interleave(
                {
                    name: synchronized(lambda m=model, i=inputs, k=kwargs: m.generate(**i, **k), args.device)
                    for name, model in sides.items()
                },
                args.repeats,
                warmup=0,  # the equality check above was the warm-up
            )
            summary = speedups(times, "marian")
            case = {
                "search": search,
                "batch": batch,
                "identical_tokens": identical,
                "share_equal_to_marian_fp32": {n: _same_rows(out, outputs["marian"]) for n, out in outputs.items()},
                "ratios_of_medians": {name: row.get("ratio_of_medians", 1.0) for name, row in summary.items()},
                "sentences_per_s": {name: batch / row["median_s"] for name, row in summary.items()},
                "ratio_of_medians": summary["vaswani_mt"]["ratio_of_medians"],
                "median_of_ratios": summary["vaswani_mt"]["median_of_ratios"],
                "median_s": {name: row["median_s"] for name, row in summary.items()},
                "min_s": {name: row["min_s"] for name, row in summary.items()},
            }
            if args.compile and kwargs["num_beams"] == 1:  # beam search is not compiled (module docstring)
                case["compile_s"] = {n: first_call_s[n] - case["median_s"][n] for n in sides if n.endswith("_compiled")}
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
    for row, c in zip(rows, cases, strict=True):
        for name in sides:
            if name != float32_side(name):
                row[f"{name} x"] = c["ratios_of_medians"][name]
                row[f"{name} = fp32"] = f"{c['share_equal_to_marian_fp32'][name]:.0%}"
    print_table(f"Decoding ({result['shape']}), {args.repeats} interleaved calls per side", rows, list(rows[0]))
    return result


def profile_calls(sides: dict, inputs: dict, kwargs: dict, title: str) -> None:
    for name, model in sides.items():
        profile_operators(lambda m=model: m.generate(**inputs, **kwargs), f"{name}, {title}")


# ---------------------------------------------------------------------------------------------------------------
# testset mode


def run_testset(args) -> dict:
    from transformers import AutoTokenizer

    from vaswani_mt.data.corpus import load_corpus, source_target
    from vaswani_mt.evaluation.metrics import bleu

    if not args.model:
        raise SystemExit("--mode testset needs --model, a saved vaswani_mt folder (e.g. outputs/ding-cpu)")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ours = VaswaniForConditionalGeneration.from_pretrained(args.model).eval()
    marian = to_marian(ours).eval()
    ours, marian = ours.to(args.device), marian.to(args.device)
    sides = make_sides(ours, marian, args.bf16, args.static_cache, args.compile, args.int8)
    sources, references = source_target(load_corpus("ding")["test"], "en", "de")
    if args.max_sentences:
        sources, references = sources[: args.max_sentences], references[: args.max_sentences]
    encoded = tokenizer(sources)["input_ids"]
    order = sorted(range(len(sources)), key=lambda i: len(encoded[i]))  # batches of similar length, as translate()
    batches = []
    for start in range(0, len(order), args.batch):
        rows = [encoded[i] for i in order[start : start + args.batch]]
        batches.append(tokenizer.pad({"input_ids": rows}, return_tensors="pt").to(args.device))
    in_order = [references[i] for i in order]

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
        same = {name: 0 for name in sides if name != "marian"}  # outputs equal to the side's float32 twin
        lengths = {name: 0 for name in sides}
        translations = {name: [] for name in sides}
        for index, batch in enumerate(batches):
            budget = int(batch["attention_mask"].sum(-1).max()) + 50
            own = {
                "vaswani_mt": dict(setting, max_new_tokens=budget) if setting is not None else {},
                "marian": dict(setting, max_new_tokens=budget)
                if setting is not None
                else dict(num_beams=4, length_penalty=0.6, max_new_tokens=budget),
            }
            kwargs = {name: own[float32_side(name)] for name in sides}
            names = list(sides) if index % 2 == 0 else list(sides)[::-1]
            outputs = {}
            for name in names:
                start = time.perf_counter()
                outputs[name] = sides[name].generate(**batch, **kwargs[name])
                wait(args.device)
                seconds[name] += time.perf_counter() - start
            texts = {name: tokenizer.batch_decode(out, skip_special_tokens=True) for name, out in outputs.items()}
            for name, text in texts.items():
                translations[name] += [t.strip() for t in text]
                # float32 vaswani_mt and Marian against each other; the variants against their float32 selves
                twin = "marian" if name == "vaswani_mt" else float32_side(name)
                if twin != name:
                    same[name] += sum(a == b for a, b in zip(text, texts[twin], strict=True))
            for name, out in outputs.items():
                lengths[name] += int(out[:, 1:].ne(tokenizer.pad_token_id).sum())
        case = {
            "setting": title,
            "sentences": len(sources),
            "identical_share": same["vaswani_mt"] / len(sources),
            "sentences_per_s": {name: len(sources) / s for name, s in seconds.items()},
            "seconds": seconds,
            "output_tokens": lengths,
            "ratio": seconds["marian"] / seconds["vaswani_mt"],
            "ratios": {name: seconds["marian"] / s for name, s in seconds.items()},
            "bleu": {name: bleu(texts, in_order)["score"] for name, texts in translations.items()},
        }
        variants = [name for name in sides if name != float32_side(name)]
        if variants:
            case["equal_to_own_fp32_share"] = {name: same[name] / len(sources) for name in variants}
        cases.append(case)
        print(json.dumps(case), flush=True)
    rows = [
        {
            "setting": c["setting"],
            "identical outputs": f"{c['identical_share']:.1%}",
            "vaswani_mt sent/s": c["sentences_per_s"]["vaswani_mt"],
            "marian sent/s": c["sentences_per_s"]["marian"],
            "ratio": c["ratio"],
            "BLEU ours / Marian": f"{c['bleu']['vaswani_mt']:.2f} / {c['bleu']['marian']:.2f}",
        }
        for c in cases
    ]
    for row, c in zip(rows, cases, strict=True):
        for name in c.get("equal_to_own_fp32_share", {}):
            row[f"{name} x"] = c["ratios"][name]
            row[f"{name} = fp32, BLEU"] = f"{c['equal_to_own_fp32_share'][name]:.0%}, {c['bleu'][name]:.2f}"
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
    cuda = args.device.startswith("cuda")
    result["record"]["device"] = torch.cuda.get_device_name(args.device) if cuda else args.device
    print("\n" + json.dumps(result, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
