#!/usr/bin/env python
"""Training speed side by side: vaswani_mt vs transformers.MarianMTModel with the same weights (`to_marian`).

Each side is run the way its users run it through transformers' Trainer:

- `vaswani_mt`: the model's own label-smoothed loss (`labels=` in the forward call), AdamW fused (our trainer's
  `adamw_torch_fused`); `vaswani_mt_bf16`: the same under CPU autocast to bfloat16, which is what `--bf16` does.
- `marian`: logits from `MarianMTModel`, then Trainer's `LabelSmoother(0.1)` (what `--label_smoothing_factor 0.1`
  does: Marian's own loss has no smoothing), AdamW fused (the Trainer's default optimizer with torch >= 2.8).
  `marian_bf16` is the same under autocast.

Modes:

- `step` (default): forward + loss + backward + optimizer step on one synthetic batch, `--batch` pairs of `--length`
  tokens each side, transformer-base shapes and a 37000 vocabulary unless told otherwise; sides interleaved,
  medians, ratios against `marian`, target tokens per second, and each side's peak RSS in its own process. First
  it checks that the two models compute the same loss and gradient (dropout off). `--profile` then prints each
  side's operators for one more step, by self CPU time. A side named `..._checkpointed` (`vaswani_mt_checkpointed`,
  `marian_checkpointed`) trains with activation checkpointing, as `--gradient_checkpointing true` does: its time
  and peak RSS against the same side without.
- `data`: real batches from the built-in corpus's training split, each side with its own batching (`MODEL:tokens=N`
  is our token-budget sampler, `MODEL:sentences=N` is the Trainer's default: N shuffled sentences, padded), run in
  alternating time slices; target tokens (real, not padding) per second of wall time, collation included.
- `curve`: `vaswani_mt` and `vaswani_mt_bf16` in lockstep on the same real batches from the same weights, with the
  same dropout seed per step; prints both loss curves and their largest relative gap (20-step means).

`--device` picks where every mode runs (`cuda`, `cuda:1`, `cpu`; default: cuda where torch sees one, else the CPU);
the `_bf16` sides autocast on that device.

The investigation modes `gemm`, `projections`, `attention`, `dropout` and `allocator` were removed once
benchmarks/RESULTS.md had recorded their answers; git history keeps them.

    python benchmarks/speed_train.py                                   # step, base shapes
    python benchmarks/speed_train.py --sides vaswani_mt,vaswani_mt_checkpointed,marian,marian_checkpointed
    python benchmarks/speed_train.py --mode data --seconds 600
    python benchmarks/speed_train.py --mode curve --steps 300 --sides vaswani_mt:tokens=1024,vaswani_mt_bf16:tokens=1024
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
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
from transformers import DataCollatorForSeq2Seq
from transformers.trainer_pt_utils import LabelSmoother

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.data.tokenization import config_token_ids
from vaswani_mt.export.marian import hidden_permutation, to_marian

MODELS = ("vaswani_mt", "vaswani_mt_bf16", "marian", "marian_bf16")
# A step-mode side named with this suffix trains with activation checkpointing (`--gradient_checkpointing`).
CHECKPOINTED = "_checkpointed"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["step", "data", "curve"], default="step")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab_size", type=int, default=37000, help="step mode; data modes train a BPE of this size")
    parser.add_argument("--dropout", type=float, default=None, help="default: the preset's")
    parser.add_argument("--batch", type=int, default=32, help="step mode: pairs per batch")
    parser.add_argument("--length", type=int, default=30, help="step mode: tokens per sentence, each side")
    parser.add_argument("--repeats", type=int, default=10, help="step mode: timed steps per side")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sides", default=None, help="comma-separated; step: models, data/curve: MODEL:BATCHING")
    parser.add_argument("--seconds", type=float, default=300, help="data mode: wall seconds per side")
    parser.add_argument("--steps", type=int, default=300, help="curve mode: steps per side")
    parser.add_argument("--max_train_samples", type=int, default=None, help="data modes: first N training pairs")
    parser.add_argument("--tokenizer", default=None, help="data modes: a saved tokenizer (default: train one)")
    parser.add_argument("--work_dir", default="outputs/bench-speed", help="where a trained tokenizer is kept")
    parser.add_argument("--lr", type=float, default=1e-4, help="constant learning rate (speed does not depend on it)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True, help="step mode: peak RSS")
    parser.add_argument("--json", default=None, help="also write the record to this file")
    parser.add_argument("--profile", action="store_true", help="step mode: top operators of one step per side")
    parser.add_argument("--only_memory", action="store_true", help="measure peak RSS only, no timing")
    parser.add_argument("--rss_child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.sides is None:
        args.sides = {
            "step": "vaswani_mt,vaswani_mt_bf16,marian",
            "data": "vaswani_mt:tokens=4096,marian:sentences=8",
            "curve": "vaswani_mt:tokens=4096,vaswani_mt_bf16:tokens=4096",
        }[args.mode]
    return args


# ---------------------------------------------------------------------------------------------------------------
# The sides


def build_models(config: VaswaniConfig, models: list[str], seed: int, device: str = "cpu") -> list[torch.nn.Module]:
    """One model per name, all with the same weights: ours, copies of it, and its exact Marian conversion; built on
    the CPU, then moved to `device`."""
    torch.manual_seed(seed)
    ours = VaswaniForConditionalGeneration(config)
    built, ours_used = [], False
    for name in models:
        if name.startswith("vaswani_mt"):
            built.append(copy.deepcopy(ours) if ours_used else ours)
            ours_used = True
        else:
            built.append(to_marian(ours))
    for name, model in zip(models, built, strict=True):
        if name.endswith(CHECKPOINTED):
            # transformers 5.23 renamed gradient_checkpointing_enable (now its deprecated alias)
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    return [model.to(device).train() for model in built]


def optimizer_for(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """Trainer's `adamw_torch_fused` with the paper's Adam settings (§5.3), no weight decay."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=True)


_LABEL_SMOOTHER = LabelSmoother(epsilon=0.1)


def loss_of(name: str, model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """The loss as each side computes it under Trainer (`num_items_in_batch` = real target tokens)."""
    count = int(batch["labels"].ne(-100).sum())
    if name.startswith("vaswani_mt"):
        return model(**batch, num_items_in_batch=count).loss
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return _LABEL_SMOOTHER(model(**inputs), batch["labels"], num_items_in_batch=count)


def make_step(name: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """One optimizer step as Trainer runs it: forward and loss under autocast for the *_bf16 sides, backward and
    the step outside."""
    bf16 = name.removesuffix(CHECKPOINTED).endswith("_bf16")
    device_type = next(model.parameters()).device.type

    def step(batch: dict) -> float:
        # float() waits for the step's kernels on an accelerator, so a step's time includes all of its work
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(name, model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def synthetic_batch(config: VaswaniConfig, batch: int, length: int, seed: int, device: str = "cpu") -> dict:
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(4, config.vocab_size, (batch, length), generator=generator)
    labels = torch.randint(4, config.vocab_size, (batch, length), generator=generator)
    source[:, -1] = labels[:, -1] = config.eos_token_id
    decoder_input_ids = torch.full_like(labels, config.pad_token_id)
    decoder_input_ids[:, 0] = config.decoder_start_token_id
    decoder_input_ids[:, 1:] = labels[:, :-1]
    tensors = {
        "input_ids": source,
        "attention_mask": torch.ones_like(source),
        "decoder_input_ids": decoder_input_ids,
        "labels": labels,
    }
    return {key: value.to(device) for key, value in tensors.items()}


def check_same_function(ours, marian, batch: dict) -> dict:
    """With dropout off, our training loss path and Marian's logits + LabelSmoother give the same loss and the same
    gradient of the shared embedding (Marian's hidden dimension is permuted: see `to_marian`)."""
    ours.eval(), marian.eval()
    count = int(batch["labels"].ne(-100).sum())
    hidden = ours.model(**{k: v for k, v in batch.items() if k != "labels"}).last_hidden_state
    loss_ours = ours._training_loss(hidden, batch["labels"], count)  # the fused path our training mode takes
    loss_marian = loss_of("marian", marian, batch)
    loss_ours.backward(), loss_marian.backward()
    grad_ours = ours.lm_head.weight.grad[:, hidden_permutation(ours.config.d_model)]
    grad_marian = marian.lm_head.weight.grad
    loss_gap = abs(loss_ours.item() - loss_marian.item()) / abs(loss_marian.item())
    grad_gap = ((grad_ours - grad_marian).abs().max() / grad_marian.abs().max()).item()
    ours.zero_grad(set_to_none=True), marian.zero_grad(set_to_none=True)
    ours.train(), marian.train()
    return {
        "loss_vaswani_mt": loss_ours.item(),
        "loss_marian": loss_marian.item(),
        "loss_rel_gap": loss_gap,
        "shared_grad_rel_gap": grad_gap,
        "same_function": loss_gap < 1e-5 and grad_gap < 1e-4,
    }


def model_config(args) -> VaswaniConfig:
    overrides = {"vocab_size": args.vocab_size}
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    return VaswaniConfig.from_preset(args.preset, **overrides)


# ---------------------------------------------------------------------------------------------------------------
# step mode


def run_step_mode(args, record: MachineRecord) -> dict:
    config = model_config(args)
    sides = args.sides.split(",")
    batch = synthetic_batch(config, args.batch, args.length, args.seed, args.device)
    if args.rss_child:  # one side alone, for its peak memory
        (model,) = build_models(config, [args.rss_child], args.seed, args.device)
        step = make_step(args.rss_child, model, optimizer_for(model, args.lr))
        for _ in range(3):
            step(batch)
        print(json.dumps({"side": args.rss_child, "peak_rss_mib": peak_rss_mib()}))
        return {}

    shape = f"{args.preset}, vocab {config.vocab_size}, {args.batch} x {args.length} tokens, dropout {config.dropout}"
    if args.only_memory:
        peaks = measure_peak_rss(os.path.abspath(__file__), child_argv(args.argv), sides)
        print_table(f"Peak RSS, training ({shape})", [{"side": n, "peak_rss_mib": p} for n, p in peaks.items()],
                    ["side", "peak_rss_mib"])  # fmt: skip
        return {"mode": "step", "shape": shape, "sides": {n: {"peak_rss_mib": p} for n, p in peaks.items()}}
    models = dict(zip(sides, build_models(config, sides, args.seed, args.device), strict=True))
    check = None
    if "vaswani_mt" in models and "marian" in models:
        check = check_same_function(models["vaswani_mt"], models["marian"], batch)
        print(json.dumps({"check": check}), flush=True)
    steps = {name: make_step(name, model, optimizer_for(model, args.lr)) for name, model in models.items()}
    times = interleave({name: (lambda s=s: s(batch)) for name, s in steps.items()}, args.repeats, args.warmup)
    baseline = "marian" if "marian" in times else sides[0]
    summary = speedups(times, baseline)
    tokens = int(batch["labels"].ne(-100).sum())
    for row in summary.values():
        row["target_tokens_per_s"] = tokens / row["median_s"]
    if args.memory:
        peaks = measure_peak_rss(os.path.abspath(__file__), child_argv(args.argv), list(models))
        for name, peak in peaks.items():
            summary[name]["peak_rss_mib"] = peak
    result = {
        "mode": "step",
        "shape": shape,
        "target_tokens_per_step": tokens,
        "check": check,
        "sides": summary,
        "times_s": {name: [round(t, 4) for t in values] for name, values in times.items()},
    }
    if args.profile:
        result["profile_ms"] = {
            name: profile_operators(lambda s=step: s(batch), f"{name}, one step") for name, step in steps.items()
        }
    rows = [{"side": name, **row} for name, row in summary.items()]
    print_table(
        f"Training step ({result['shape']}), {args.repeats} interleaved steps per side, baseline {baseline}",
        rows,
        [
            "side",
            "median_s",
            "min_s",
            "target_tokens_per_s",
            "ratio_of_medians",
            "median_of_ratios",
            "peak_rss_mib",
        ],
    )
    return result


# ---------------------------------------------------------------------------------------------------------------
# data and curve modes: real batches


def parse_side(spec: str) -> tuple[str, str, int]:
    """`MODEL:tokens=N` or `MODEL:sentences=N` -> (model, batching, N)."""
    model, _, batching = spec.partition(":")
    kind, _, size = batching.partition("=")
    if model not in MODELS or kind not in ("tokens", "sentences") or not size.isdigit():
        raise SystemExit(f"bad side {spec!r}: expected MODEL:tokens=N or MODEL:sentences=N, MODEL in {MODELS}")
    return model, kind, int(size)


def load_training_rows(args):
    """The built-in corpus's training split, tokenized with a BPE trained on it (kept in --work_dir for reuse)."""
    from transformers import AutoTokenizer

    from vaswani_mt.data.corpus import load_corpus, source_target
    from vaswani_mt.data.tokenization import tokenize_corpus, train_tokenizer

    corpus = load_corpus("ding")
    train = corpus["train"]
    if args.max_train_samples:
        train = train.select(range(min(args.max_train_samples, len(train))))
    if args.tokenizer:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        saved = Path(args.work_dir) / f"tokenizer-{args.vocab_size}-{len(train)}"
        if (saved / "tokenizer.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(saved)
        else:
            sources, targets = source_target(train, "en", "de")
            tokenizer = train_tokenizer(sources + targets, vocab_size=args.vocab_size)
            tokenizer.save_pretrained(saved)
    tokenized = tokenize_corpus({"train": train}, tokenizer, "en", "de")["train"]
    rows = tokenized.select_columns(["input_ids", "attention_mask", "labels"]).to_list()
    return tokenizer, rows, tokenized["source_length"], tokenized["target_length"]


def batch_stream(kind: str, size: int, source_lengths, target_lengths, seed: int):
    """Endless index lists: token-budget batches (§5.1) or Trainer's default (shuffled, `size` sentences each)."""
    from vaswani_mt.data.batching import TokenBudgetBatchSampler

    epoch = 0
    if kind == "tokens":
        sampler = TokenBudgetBatchSampler(source_lengths, target_lengths, size, shuffle=True, seed=seed)
    while True:
        if kind == "tokens":
            sampler.set_epoch(epoch)
            yield from sampler
        else:
            order = torch.randperm(len(source_lengths), generator=torch.Generator().manual_seed(seed + epoch)).tolist()
            for start in range(0, len(order), size):
                yield order[start : start + size]
        epoch += 1


class DataSide:
    """One side of a real-data run: its model, optimizer, batching and counters."""

    def __init__(self, spec: str, model, tokenizer, rows, lengths, lr: float, seed: int):
        self.name = spec
        self.model_name, kind, size = parse_side(spec)
        self.model = model
        self.device = next(model.parameters()).device
        self.rows = rows
        self.batches = batch_stream(kind, size, *lengths, seed)
        self.collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
        self.step_fn = make_step(self.model_name, model, optimizer_for(model, lr))
        self.seconds = 0.0
        self.steps = self.sentences = self.target_tokens = self.padded_target_tokens = 0
        self.losses: list[float] = []

    def step(self, timed: bool = True) -> float:
        start = time.perf_counter()
        indices = next(self.batches)
        batch = self.collator([self.rows[i] for i in indices])
        keep = ("input_ids", "attention_mask", "decoder_input_ids", "labels")
        batch = {k: v.to(self.device) for k, v in batch.items() if k in keep}
        loss = self.step_fn(batch)
        elapsed = time.perf_counter() - start
        if timed:
            self.seconds += elapsed
            self.steps += 1
            self.sentences += len(indices)
            self.target_tokens += int(batch["labels"].ne(-100).sum())
            self.padded_target_tokens += batch["labels"].numel()
            self.losses.append(loss)
        return elapsed

    def summary(self) -> dict:
        return {
            "steps": self.steps,
            "seconds": round(self.seconds, 1),
            "sentences_per_batch": round(self.sentences / max(self.steps, 1), 1),
            "target_tokens_per_batch": round(self.target_tokens / max(self.steps, 1), 1),
            "padding_share": round(1 - self.target_tokens / max(self.padded_target_tokens, 1), 3),
            "target_tokens_per_s": round(self.target_tokens / max(self.seconds, 1e-9), 1),
        }


def build_data_sides(args):
    tokenizer, rows, source_lengths, target_lengths = load_training_rows(args)
    specs = args.sides.split(",")
    overrides = config_token_ids(tokenizer)
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    config = VaswaniConfig.from_preset(args.preset, **overrides)
    models = build_models(config, [parse_side(spec)[0] for spec in specs], args.seed, args.device)
    lengths = (source_lengths, target_lengths)
    sides = [
        DataSide(spec, model, tokenizer, rows, lengths, args.lr, args.seed)
        for spec, model in zip(specs, models, strict=True)
    ]
    shape = f"{args.preset}, vocab {config.vocab_size}, dropout {config.dropout}, {len(rows)} training pairs"
    return sides, shape


def run_data_mode(args, record: MachineRecord) -> dict:
    """Alternating time slices: the first side takes one step, every other side steps until it has used as long."""
    sides, shape = build_data_sides(args)
    for side in sides:
        for _ in range(args.warmup):
            side.step(timed=False)
    while min(side.seconds for side in sides) < args.seconds:
        slice_seconds = sides[0].step()
        for side in sides[1:]:
            used = 0.0
            while used < slice_seconds:
                used += side.step()
    summary = {side.name: side.summary() for side in sides}
    baseline = next((side.name for side in sides if side.model_name == "marian"), sides[-1].name)
    for name, row in summary.items():
        if name != baseline:
            row["ratio"] = row["target_tokens_per_s"] / summary[baseline]["target_tokens_per_s"]
    print_table(
        f"Real batches ({shape}), alternating time slices, {args.seconds:.0f} s per side, baseline {baseline}",
        [{"side": name, **row} for name, row in summary.items()],
        [
            "side",
            "steps",
            "sentences_per_batch",
            "target_tokens_per_batch",
            "padding_share",
            "target_tokens_per_s",
            "ratio",
        ],
    )
    return {"mode": "data", "shape": shape, "baseline": baseline, "sides": summary}


def run_curve_mode(args, record: MachineRecord) -> dict:
    """Lockstep on identical batches and dropout seeds; the loss curves and their largest relative gap."""
    sides, shape = build_data_sides(args)
    for step in range(args.steps):
        for side in sides:
            torch.manual_seed(args.seed * 1_000_003 + step)
            side.step()
    window = 20
    means = {
        side.name: [statistics.fmean(side.losses[i : i + window]) for i in range(0, args.steps - window + 1, window)]
        for side in sides
    }
    reference = sides[0].name
    gaps = {}
    for side in sides[1:]:
        gaps[side.name] = max(abs(a - b) / abs(b) for a, b in zip(means[side.name], means[reference], strict=True))
    summary = {side.name: side.summary() for side in sides}
    for name, row in summary.items():
        row["final_loss_mean"] = round(means[name][-1], 4) if means[name] else None
        if name in gaps:
            row["max_rel_gap_of_20_step_means"] = round(gaps[name], 4)
            row["speed_ratio"] = row["target_tokens_per_s"] / summary[reference]["target_tokens_per_s"]
    print("\n20-step mean losses:")
    for name, values in means.items():
        print(f"  {name}: " + " ".join(f"{v:.3f}" for v in values))
    print_table(
        f"Loss curves ({shape}), {args.steps} lockstep steps, reference {reference}",
        [{"side": name, **row} for name, row in summary.items()],
        ["side", "steps", "target_tokens_per_s", "speed_ratio", "final_loss_mean", "max_rel_gap_of_20_step_means"],
    )
    return {
        "mode": "curve",
        "shape": shape,
        "reference": reference,
        "sides": summary,
        "window_means": means,
        "losses": {side.name: [round(x, 5) for x in side.losses] for side in sides},
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    record = MachineRecord()
    modes = {
        "step": run_step_mode,
        "data": run_data_mode,
        "curve": run_curve_mode,
    }
    result = modes[args.mode](args, record)
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
