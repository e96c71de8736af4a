#!/usr/bin/env python
"""Speed against the peers: vaswani_mt beside transformers.MarianMTModel with the same weights (`to_marian`), and
our own decoding options, each side run as its users run it; one command per figure:

    python benchmarks/speed.py train ...      # the training step, real batches, bf16 loss curves
    python benchmarks/speed.py decode ...     # generate() against Marian's: synthetic shapes or the test split
    python benchmarks/speed.py stopping ...   # the beam search's stopping rules against Marian's on test and dev
    python benchmarks/speed.py batching ...   # translate.py with token-budget against fixed-size batches
    python benchmarks/speed.py revisions ...  # translate() of this checkout against an earlier commit's

`python benchmarks/speed.py COMMAND --help` describes each. The harness (machine record, interleaving, ratios,
peak memory in a child process) is speed_common.py's.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from speed_common import (
    MachineRecord,
    child_argv,
    command_parser,
    dispatch,
    interleave,
    length_batches,
    measure_peak_rss,
    peak_rss_mib,
    print_table,
    profile_operators,
    speedups,
    split_pairs,
)
from transformers import DataCollatorForSeq2Seq
from transformers.trainer_pt_utils import LabelSmoother

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.data.tokenization import config_token_ids
from vaswani_mt.export.marian import hidden_permutation, to_marian

ROOT = Path(__file__).resolve().parents[1]
TRAIN_DOC = """"""
STOPPING_DOC = """"""
BATCHING_DOC = """"""
DECODE_DOC = """"""


def _parser(command: str, doc: str) -> argparse.ArgumentParser:
    return command_parser("speed.py", command, doc)


def _finish(result: dict, record: MachineRecord, args) -> dict:
    """The record (and the device) added, printed, written to --json."""
    result["record"] = record.finish()
    cuda = args.device.startswith("cuda")
    result["record"]["device"] = torch.cuda.get_device_name(args.device) if cuda else args.device
    print("\n" + json.dumps(result, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


# ---------------------------------------------------------------------------------------------------------------
# train: the training step


MODELS = ("vaswani_mt", "vaswani_mt_bf16", "marian", "marian_bf16")
# A step-mode side named with this suffix trains with activation checkpointing (`--gradient_checkpointing`).
CHECKPOINTED = "_checkpointed"


def train_args(argv=None) -> argparse.Namespace:
    parser = _parser("train", TRAIN_DOC)
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
        peaks = measure_peak_rss(__file__, ["train", *child_argv(args.argv)], sides)
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
        peaks = measure_peak_rss(__file__, ["train", *child_argv(args.argv)], list(models))
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


def train(argv=None) -> dict | None:
    args = train_args(argv)
    torch.set_num_threads(args.threads)
    record = MachineRecord()
    result = {"step": run_step_mode, "data": run_data_mode, "curve": run_curve_mode}[args.mode](args, record)
    return None if args.rss_child else _finish(result, record, args)


# ---------------------------------------------------------------------------------------------------------------
# decode: generate() against Marian's

SEARCHES = {"beam4": 4, "greedy": 1}


def decode_args(argv=None) -> argparse.Namespace:
    parser = _parser("decode", DECODE_DOC)
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
        peaks = measure_peak_rss(__file__, ["decode", *child_argv(args.argv)], list(sides))
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
            __file__, ["decode", *child_argv(args.argv)], list(sides)
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

    from vaswani_mt.evaluation.metrics import bleu

    if not args.model:
        raise SystemExit("--mode testset needs --model, a saved vaswani_mt folder (e.g. outputs/ding-cpu)")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ours = VaswaniForConditionalGeneration.from_pretrained(args.model).eval()
    marian = to_marian(ours).eval()
    ours, marian = ours.to(args.device), marian.to(args.device)
    sides = make_sides(ours, marian, args.bf16, args.static_cache, args.compile, args.int8)
    sources, references = split_pairs("test", args.max_sentences)
    order, batches = length_batches(tokenizer, sources, args.batch, args.device)
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


def decode(argv=None) -> dict | None:
    args = decode_args(argv)
    torch.set_num_threads(args.threads)
    record = MachineRecord()
    result = run_synthetic(args) if args.mode == "synthetic" else run_testset(args)
    return None if args.rss_child else _finish(result, record, args)


# ---------------------------------------------------------------------------------------------------------------
# stopping: §6.1's "terminate early when possible", three rules against Marian's


RULES = {"exact bound (never)": "never", "fairseq (True)": True, "transformers heuristic (False)": False}


class StepCounter:
    """Counts the forward calls of a decoder (one per search step with a KV cache)."""

    def __init__(self, decoder: torch.nn.Module):
        self.calls = 0
        decoder.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.calls += 1


def measure_split(name: str, sources, references, model, marian, tokenizer, batch_size: int) -> dict:
    from vaswani_mt.evaluation.metrics import bleu

    order, batches = length_batches(tokenizer, sources, batch_size)
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


def stopping(argv=None) -> dict:
    from vaswani_mt.inference.loading import load_for_inference
    from vaswani_mt.system.devices import native_bf16

    parser = _parser("stopping", STOPPING_DOC)
    parser.add_argument("model", help="a saved vaswani_mt folder (the main job's: outputs/ding-cpu)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max_sentences", type=int, default=None, help="the first N of each split (a quick look)")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args(argv)
    record = MachineRecord()
    model, tokenizer = load_for_inference(args.model, device="cpu")
    marian = to_marian(model).eval()
    result = {"model": args.model, "native_bf16": native_bf16(), "search": model.generation_config.to_diff_dict(),
              "batch": args.batch, "splits": []}  # fmt: skip
    for split in ("test", "validation"):
        sources, references = split_pairs(split, args.max_sentences)
        measured = measure_split(split, sources, references, model, marian, tokenizer, args.batch)
        result["splits"].append(measured)
        rows = [{"side": label, **values} for label, values in measured["sides"].items()]
        print_table(f"{split}: {measured['sentences']} sentences, {measured['batches']} batches of {args.batch}",
                    rows, list(rows[0]))  # fmt: skip
    return record.report(result, args.json)


# ---------------------------------------------------------------------------------------------------------------
# batching: translate.py with token-budget batches against fixed-size ones


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one run of `command`."""
    cpu, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return wall, _children_cpu() - cpu, done.stdout


def batching(argv=None) -> dict:
    from vaswani_mt.system import native_bf16

    parser = _parser("batching", BATCHING_DOC)
    parser.add_argument("--model", required=True, help="a trained model folder")
    parser.add_argument("--input", help="source file (default: the built-in test split's English side)")
    parser.add_argument("--max_tokens", type=int, default=1200)
    parser.add_argument("--batch_size", type=int, default=16, help="the fixed-size batches compared against")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    record = MachineRecord()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(args.input or Path(tmp) / "test.en")
        if not args.input:
            source.write_text("\n".join(split_pairs("test")[0]) + "\n", encoding="utf-8")
        lines = len(source.read_text(encoding="utf-8").splitlines())
        base = [sys.executable, str(ROOT / "scripts" / "translate.py"), "--model", args.model, "--input", str(source)]
        sides = {
            f"batch_size {args.batch_size}": [*base, "--batch_size", str(args.batch_size)],
            f"max_tokens {args.max_tokens}": [*base, "--max_tokens", str(args.max_tokens)],
        }
        names = list(sides)
        walls: dict[str, list[float]] = {name: [] for name in names}
        cpus: dict[str, list[float]] = {name: [] for name in names}
        reference = None
        for round_ in range(args.repeats):
            for name in names if round_ % 2 == 0 else names[::-1]:
                wall, cpu, output = run_once(sides[name])
                reference = output if reference is None else reference
                if output != reference:
                    differ = sum(a != b for a, b in zip(output.splitlines(), reference.splitlines(), strict=True))
                    raise AssertionError(f"{name}: {differ} of {lines} translations differ from the first run's")
                walls[name].append(wall)
                cpus[name].append(cpu)
                print(f"round {round_ + 1}, {name}: {wall:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr, flush=True)
    fixed, budget = names
    result = {
        "benchmark": "translate_batching",
        "model": args.model,
        "sentences": lines,
        "native_bf16": native_bf16(),
        "commands": {name: " ".join(["python", *command[1:]]) for name, command in sides.items()},
        "outputs_identical": True,
        **{
            name: {
                "median_wall_s": round(statistics.median(walls[name]), 2),
                "sentences_per_s": round(lines / statistics.median(walls[name]), 2),
                "median_cpu_s": round(statistics.median(cpus[name]), 2),
                "wall_s": [round(x, 2) for x in walls[name]],
                "cpu_s": [round(x, 2) for x in cpus[name]],
            }
            for name in names
        },
        "speedup_wall": round(statistics.median(walls[fixed]) / statistics.median(walls[budget]), 3),
        "speedup_cpu": round(statistics.median(cpus[fixed]) / statistics.median(cpus[budget]), 3),
    }
    return record.report(result, args.json)


REVISION_CHILD = """
import hashlib, json, sys, time
import torch
torch.set_num_threads(int(sys.argv[4]))
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.translate import translate, translate_nbest
from vaswani_mt.inference.alignments import format_aligned_line
model, tokenizer = load_for_inference(sys.argv[1], device="cpu")
lines = [line.rstrip("\\n") for line in open(sys.argv[2], encoding="utf-8")]
options = json.loads(sys.argv[3])
nbest = options.pop("nbest", None)  # translate_nbest: the name both revisions have
def run(sentences):
    return translate_nbest(model, tokenizer, sentences, nbest, **options) if nbest else translate(model, tokenizer,
                                                                                                  sentences, **options)
run(lines[:32])  # warm-up
start = time.perf_counter()
out = run(lines)
seconds = time.perf_counter() - start
flat = [h.text for hs in out for h in hs] if nbest else list(out)
text = "\\n".join(format_aligned_line(t) if hasattr(t, "links") else str(t) for t in flat)
print(json.dumps({"seconds": seconds, "digest": hashlib.sha256(text.encode()).hexdigest()}))
"""
REVISION_OPTIONS = {"plain": {}, "nbest 2": {"nbest": 2}, "alignments": {"alignments": "hard"},
                    "greedy": {"num_beams": 1}}  # fmt: skip


def revisions(argv=None) -> dict:
    """`translate()` of this checkout against `--before` (a commit, checked out in a temporary git worktree), each in
    a fresh process per round, rounds interleaved: sentences/s (medians), the ratio, and whether both give the same
    outputs (a digest of every line). The model: `--model`, or the tests' fitted tiny model (per-batch overhead shows
    most on a small model); the lines: `--lines` copies of its six sentences, batches of 16."""
    parser = _parser("revisions", revisions.__doc__)
    parser.add_argument("--before", required=True, help="the commit to compare with (e.g. HEAD~3)")
    parser.add_argument("--model", default=None, help="a saved model folder (default: the tiny fitted one)")
    parser.add_argument("--lines", type=int, default=100, help="copies of the six sentences (600 lines)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.set_defaults(device="cpu")
    args = parser.parse_args(argv)
    from speed_common import PAIRS, tiny_model_folder

    record = MachineRecord()
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        model = args.model or str(tiny_model_folder(work / "model"))
        (work / "lines.txt").write_text("".join(f"{en}\n" for en, _ in PAIRS * args.lines), encoding="utf-8")
        before = work / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.before], check=True,
                       capture_output=True)  # fmt: skip
        try:
            result = {}
            for name, options in REVISION_OPTIONS.items():
                options = {"batch_size": 16, **options}
                runs = {side: [] for side in ("before", "after")}
                for _ in range(args.repeats):
                    for side, root in (("before", before), ("after", ROOT)):
                        out = subprocess.run(
                            [sys.executable, "-c", REVISION_CHILD, model, str(work / "lines.txt"), json.dumps(options),
                             str(args.threads)], cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root)},
                            capture_output=True, text=True, check=True,
                        )  # fmt: skip
                        runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
                count = 6 * args.lines
                rates = {side: statistics.median(count / r["seconds"] for r in rows) for side, rows in runs.items()}
                digests = {side: {r["digest"] for r in rows} for side, rows in runs.items()}
                result[name] = {
                    "sentences_per_s": rates,
                    "after_over_before": rates["after"] / rates["before"],
                    "same_outputs": digests["before"] == digests["after"] and len(digests["after"]) == 1,
                }
                print(
                    f"{name}: {rates['before']:.1f} -> {rates['after']:.1f} sentences/s "
                    f"({result[name]['after_over_before']:.2f}x), same outputs: {result[name]['same_outputs']}"
                )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], capture_output=True)
    return _finish({"before": args.before, "revisions": result}, record, args)


def main(argv=None):
    commands = {"train": train, "decode": decode, "stopping": stopping, "batching": batching, "revisions": revisions}
    return dispatch(__doc__, commands, argv)


if __name__ == "__main__":
    main()
