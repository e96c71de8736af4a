#!/usr/bin/env python
"""Speed against the peers: vaswani_mt beside transformers.MarianMTModel with the same weights (`to_marian`), and
our own decoding options, each side run as its users run it; one command per figure:

    python benchmarks/speed.py train ...      # the training step against Marian's: synthetic or real batches
    python benchmarks/speed.py decode ...     # generate() against Marian's at forced lengths (float32, bf16)
    python benchmarks/speed.py batching ...   # translate.py with token-budget against fixed-size batches
    python benchmarks/speed.py peers ...      # one run: ours (float32, int8, bf16, terms), Marian, CTranslate2
    python benchmarks/speed.py commands ...   # translate.py on ours, on its CTranslate2 export, a plain CT2 script
    python benchmarks/speed.py products ...   # a decoder step's matrix products: plain, packed, prepacked, int8

`python benchmarks/speed.py COMMAND --help` describes each. The harness (machine record, interleaving, ratios, the
side-by-side runner, peak memory in a child process) is speed_common.py's.
"""

import argparse
import copy
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from speed_common import (
    TRANSLATE_PY,
    MachineRecord,
    child_peak,
    command_parser,
    dispatch,
    interleave,
    measure_peak_rss,
    print_table,
    rates,
    run_sides,
    speedups,
    split_pairs,
    synthetic_batch,
)
from transformers.trainer_pt_utils import LabelSmoother

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.export.marian import hidden_permutation, to_marian
from vaswani_mt.training.bf16_weights import Bf16Weights


def _shape_parser(command, repeats: int) -> argparse.ArgumentParser:
    """The options `train` and `decode` share: the model's shape, the timed rounds, the device, peak memory."""
    parser = command_parser(command)
    parser.add_argument("--preset", default="base", help="the model's shape (VaswaniConfig.from_preset)")
    parser.add_argument("--vocab_size", type=int, default=37000, help="the vocabulary's size")
    parser.add_argument("--length", type=int, default=30, help="tokens per synthetic sentence (decode: the source)")
    parser.add_argument("--repeats", type=int, default=repeats, help="timed calls per side (and case)")
    parser.add_argument("--threads", type=int, default=2, help="torch's threads")
    parser.add_argument("--seed", type=int, default=0, help="of the weights and the synthetic batches")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                        help="also each side's peak RSS, each in a process of its own")  # fmt: skip
    parser.add_argument("--rss_child", default=None, help=argparse.SUPPRESS)
    return parser


def _parse(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return args


def _report(result: dict, record: MachineRecord, args) -> dict:
    """The record with the device added, printed, written to --json."""
    cuda = args.device.startswith("cuda")
    return record.report(result, args.json, device=torch.cuda.get_device_name(args.device) if cuda else args.device)


# --- train: the training step ----------------------------------------------------------------------------------------


# A step-mode side named with this suffix trains with activation checkpointing (`--gradient_checkpointing`).
CHECKPOINTED = "_checkpointed"
# A step-mode side named with one of these suffixes runs its model with the loss compiled (`torch.compile`, inductor;
# the optimizer step stays eager, as under Trainer's --torch_compile): COMPILED in the default mode, GRAPHS in mode
# "reduce-overhead" (CUDA graphs, for the small batch where the host is the limit). Compiling is in the warmup steps.
COMPILED, GRAPHS = "_compiled", "_graphs"
# A step-mode side of ours named with this suffix (before those above) trains as `--bf16_weights` does: forward and
# backward on bf16 copies of the weights cast once per optimizer step, the optimizer on the float32 weights;
# `vaswani_mt_weights` runs the rest of the step in bf16 too, `vaswani_mt_bf16_weights` under autocast.
WEIGHTS = "_weights"


def base_side(name: str) -> str:
    """A side's name without the suffixes of how it runs (`vaswani_mt_bf16_compiled` -> `vaswani_mt_bf16`)."""
    for suffix in (GRAPHS, COMPILED, CHECKPOINTED, WEIGHTS):
        name = name.removesuffix(suffix)
    return name


def train_args(argv=None) -> argparse.Namespace:
    parser = _shape_parser(train, repeats=10)
    parser.add_argument("--mode", choices=["step"], default="step", help="one synthetic batch (real ones: removed)")
    parser.add_argument("--dropout", type=float, default=None, help="default: the preset's")
    parser.add_argument("--batch", type=int, default=32, help="pairs per batch")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    parser.add_argument("--sides", default="vaswani_mt,vaswani_mt_bf16,marian", help="comma-separated models")
    parser.add_argument("--profile", type=int, default=0, help="also profile this many steps per side "
                        "(device busy time, kernels per step, the top ops)")  # fmt: skip
    parser.add_argument("--compile_backend", default="inductor", help="torch.compile backend of the _compiled sides "
                        "(aot_eager: the same graph without code generation, for a quick check)")  # fmt: skip
    return _parse(parser, argv)


def build_models(config: VaswaniConfig, models: list[str], seed: int, device: str = "cpu",
                 backend: str = "inductor") -> list[torch.nn.Module]:  # fmt: skip
    """One model per name, all with the same weights: ours, copies of it, and its exact Marian conversion; built on
    the CPU, then moved to `device`; the _compiled and _graphs sides compiled by `backend`."""
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
        if name.removesuffix(GRAPHS).removesuffix(COMPILED).endswith(CHECKPOINTED):
            # transformers 5.23 renamed gradient_checkpointing_enable (now its deprecated alias)
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    built = [model.to(device).train() for model in built]
    for at, name in enumerate(models):
        if name.endswith((COMPILED, GRAPHS)):
            mode = "reduce-overhead" if name.endswith(GRAPHS) else None
            built[at] = torch.compile(built[at], backend=backend, mode=mode)
    return built


def optimizer_for(model: torch.nn.Module, lr: float = 1e-4) -> torch.optim.Optimizer:
    """Trainer's `adamw_torch_fused` with the paper's Adam settings (§5.3), no weight decay, a constant rate (a step's
    speed does not depend on it)."""
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
    """One optimizer step as Trainer runs it: forward and loss under autocast for the *_bf16 sides (on bf16 copies of
    the weights for the WEIGHTS sides), backward and the step outside."""
    bf16 = base_side(name).endswith("_bf16")
    device_type = next(model.parameters()).device.type
    copies = Bf16Weights(model) if name.removesuffix(GRAPHS).removesuffix(COMPILED).endswith(WEIGHTS) else None
    steps = itertools.count()

    def step(batch: dict) -> float:
        # float() waits for the step's kernels on an accelerator, so a step's time includes all of its work
        run = model if copies is None else copies.bind(model, next(steps))
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(name, run, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


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
    return {"loss_vaswani_mt": loss_ours.item(), "loss_marian": loss_marian.item(), "loss_rel_gap": loss_gap,
            "shared_grad_rel_gap": grad_gap, "same_function": loss_gap < 1e-5 and grad_gap < 1e-4}  # fmt: skip


def model_config(args, **overrides) -> VaswaniConfig:
    """--preset at --vocab_size with --dropout where given, then `overrides` (a tokenizer's size and ids)."""
    overrides = {"vocab_size": args.vocab_size, **overrides}
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    return VaswaniConfig.from_preset(args.preset, **overrides)


def run_step_mode(args) -> dict:
    config = model_config(args)
    sides = args.sides.split(",")
    batch = synthetic_batch(config, args.batch, args.length, args.seed, args.device)
    if args.rss_child:  # one side alone, for its peak memory
        (model,) = build_models(config, [args.rss_child], args.seed, args.device, args.compile_backend)
        child_peak(args.rss_child, partial(make_step(args.rss_child, model, optimizer_for(model)), batch), 3)
        return {}
    shape = f"{args.preset}, vocab {config.vocab_size}, {args.batch} x {args.length} tokens, dropout {config.dropout}"
    models = dict(zip(sides, build_models(config, sides, args.seed, args.device, args.compile_backend), strict=True))
    check = None
    if "vaswani_mt" in models and "marian" in models:
        check = check_same_function(models["vaswani_mt"], models["marian"], batch)
        print(json.dumps({"check": check}), flush=True)
    steps = {name: make_step(name, model, optimizer_for(model)) for name, model in models.items()}
    times = interleave({name: partial(step, batch) for name, step in steps.items()}, args.repeats, args.warmup)
    baseline = "marian" if "marian" in times else sides[0]
    summary = speedups(times, baseline)
    tokens = int(batch["labels"].ne(-100).sum())
    for row in summary.values():
        row["target_tokens_per_s"] = tokens / row["median_s"]
    for name, step in steps.items() if args.profile else ():
        summary[name]["profile"] = profile_steps(partial(step, batch), args.profile)
    if args.memory:
        peaks = measure_peak_rss(__file__, ["train", *args.argv], list(models), f"training ({shape})")
        for name, peak in peaks.items():
            summary[name]["peak_rss_mib"] = peak
    rows = [{"side": name, **row} for name, row in summary.items()]
    print_table(f"Training step ({shape}), {args.repeats} interleaved steps per side, baseline {baseline}", rows,
                ["side", "median_s", "min_s", "target_tokens_per_s", "ratio_of_medians", "median_of_ratios",
                 "peak_rss_mib"])  # fmt: skip
    return {"mode": "step", "shape": shape, "target_tokens_per_step": tokens, "check": check, "sides": summary,
            "times_s": {name: [round(t, 4) for t in values] for name, values in times.items()}}  # fmt: skip


def profile_steps(step, count: int) -> dict:
    """Where a step's time goes, by torch.profiler over `count` steps: the wall time (the profiler's overhead in it),
    the accelerator's busy time, kernels launched, and the top ops by device time (CPU time where there is no
    accelerator). Busy far below wall means the host cannot keep the device fed."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    accelerator = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if accelerator else [])]) as prof:
        start = time.perf_counter()
        for _ in range(count):
            step()
        wall = (time.perf_counter() - start) / count
    kernels = [event for event in prof.events() if event.device_type == DeviceType.CUDA]
    busy = sum(kernel.time_range.elapsed_us() for kernel in kernels) / count / 1e6
    own = "self_device_time_total" if accelerator else "self_cpu_time_total"  # host ops: the kernels they launched
    ops = [op for op in prof.key_averages() if op.device_type == DeviceType.CPU]
    top = sorted(ops, key=lambda op: getattr(op, own), reverse=True)[:10]
    return {"wall_s_per_step": round(wall, 5), "device_busy_s_per_step": round(busy, 5),
            "device_busy_share": round(busy / wall, 3), "kernels_per_step": len(kernels) / count,
            "top_ops_ms_per_step": {op.key[:80]: round(getattr(op, own) / count / 1e3, 3) for op in top}}  # fmt: skip


def train(argv=None) -> dict | None:
    """The training step, ours (float32, `_bf16` autocast, `_checkpointed`) beside MarianMTModel's with the same
    weights: one synthetic batch, timed after a same-loss check."""
    args = train_args(argv)
    torch.set_num_threads(args.threads)
    record = MachineRecord()
    result = run_step_mode(args)
    return None if args.rss_child else _report(result, record, args)


# --- decode: generate() against Marian's -----------------------------------------------------------------------------

SEARCHES = {"beam4": 4, "greedy": 1}


def decode_args(argv=None) -> argparse.Namespace:
    parser = _shape_parser(decode, repeats=5)
    parser.add_argument("--steps", type=int, default=30, help="new tokens, min = max")
    parser.add_argument("--batches", default="1,16", help="batch sizes")
    parser.add_argument("--searches", default="beam4,greedy", help="comma-separated, of beam4, greedy")
    parser.add_argument("--bf16", action="store_true", help="also both models with bf16 weights (opt-in numerics)")
    return _parse(parser, argv)


def synchronized(call, device: str):
    """`call`, then on an accelerator a wait for the kernels it queued (a timed call then includes all its work)."""

    def call_and_wait():
        out = call()
        if device != "cpu":
            torch.accelerator.synchronize(device)
        return out

    return call_and_wait


def make_sides(ours, marian, bf16: bool) -> dict:
    """Both models in float32, and with --bf16 a copy of each with bf16 weights (`NAME_bf16`)."""
    sides = {"vaswani_mt": ours, "marian": marian}
    if bf16:
        sides["vaswani_mt_bf16"] = copy.deepcopy(ours).to(torch.bfloat16)
        sides["marian_bf16"] = copy.deepcopy(marian).to(torch.bfloat16)
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


def decode(argv=None) -> dict | None:
    """generate() of ours beside MarianMTModel's with the same weights, exactly --steps new tokens (so the same
    tokens); --bf16 adds copies of both with bf16 weights, timed against Marian in float32."""
    args = decode_args(argv)
    torch.set_num_threads(args.threads)
    record = MachineRecord()
    torch.manual_seed(args.seed)
    ours = VaswaniForConditionalGeneration(VaswaniConfig.from_preset(args.preset, vocab_size=args.vocab_size)).eval()
    marian = to_marian(ours).eval()
    sides = make_sides(ours.to(args.device), marian.to(args.device), args.bf16)
    if args.rss_child:
        inputs = synthetic_source(ours.config, 16, args.length, args.seed, args.device)
        run = partial(sides[args.rss_child].generate, **inputs, **forced_kwargs("beam4", args.steps))
        return child_peak(args.rss_child, run, 2)
    shape = f"{args.preset}, vocab {args.vocab_size}, source {args.length} tokens, {args.steps} new tokens forced"
    cases = []
    for batch in [int(b) for b in args.batches.split(",")]:
        inputs = synthetic_source(ours.config, batch, args.length, args.seed, args.device)
        for search in args.searches.split(","):
            kwargs = forced_kwargs(search, args.steps)
            calls = {name: synchronized(partial(model.generate, **inputs, **kwargs), args.device)
                     for name, model in sides.items()}  # fmt: skip
            outputs = {name: call() for name, call in calls.items()}  # the warm-up
            summary = speedups(interleave(calls, args.repeats, warmup=0), "marian")
            case = {"search": search, "batch": batch,
                    "identical_tokens": torch.equal(outputs["vaswani_mt"], outputs["marian"]),
                    "share_equal_to_marian_fp32": {n: _same_rows(out, outputs["marian"]) for n, out in outputs.items()},
                    "ratios_of_medians": {name: row.get("ratio_of_medians", 1.0) for name, row in summary.items()},
                    "sentences_per_s": {name: batch / row["median_s"] for name, row in summary.items()},
                    "ratio_of_medians": summary["vaswani_mt"]["ratio_of_medians"],
                    "median_of_ratios": summary["vaswani_mt"]["median_of_ratios"],
                    "median_s": {name: row["median_s"] for name, row in summary.items()},
                    "min_s": {name: row["min_s"] for name, row in summary.items()}}  # fmt: skip
            cases.append(case)
            print(json.dumps(case), flush=True)
    result = {"shape": shape, "cases": cases}
    if args.memory:
        peaks = measure_peak_rss(__file__, ["decode", *args.argv], list(sides), f"beam 4, batch 16 ({shape})")
        result["peak_rss_mib_beam4_batch16"] = peaks
    rows = []
    for c in cases:
        rows.append({"search": c["search"], "batch": c["batch"], "identical tokens": c["identical_tokens"],
                     "vaswani_mt sent/s": c["sentences_per_s"]["vaswani_mt"],
                     "marian sent/s": c["sentences_per_s"]["marian"], "ratio_of_medians": c["ratio_of_medians"],
                     "median_of_ratios": c["median_of_ratios"]})  # fmt: skip
        for name in list(sides)[2:]:
            rows[-1][f"{name} x"] = c["ratios_of_medians"][name]
            rows[-1][f"{name} = fp32"] = f"{c['share_equal_to_marian_fp32'][name]:.0%}"
    print_table(f"Decoding ({shape}), {args.repeats} interleaved calls per side", rows, list(rows[0]))
    return _report(result, record, args)


def _run_commands(commands: dict[str, list[str]], repeats: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Each command `repeats` times, interleaved, a whole process each (start-up included): seconds per run, and each
    side's standard output (a side whose runs disagree is an error)."""
    outputs: dict[str, str] = {}

    def run(name: str) -> None:
        done = subprocess.run(commands[name], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(commands[name])} failed:\n{done.stderr[-3000:]}")
        if outputs.setdefault(name, done.stdout) != done.stdout:
            raise AssertionError(f"{name}: another run gave other translations")

    return interleave({name: partial(run, name) for name in commands}, repeats, warmup=0), outputs


def _split_file(folder: str, limit: int | None = None) -> tuple[str, int]:
    """The test split's English side (its first `limit` lines) written to a file in `folder`: (path, lines)."""
    sources = split_pairs("test", limit)[0]
    path = Path(folder) / "test.en"
    path.write_text("\n".join(sources) + "\n", encoding="utf-8")
    return str(path), len(sources)


def batching(argv=None) -> dict:
    """scripts/translate.py with token-budget batches (--max_tokens) against fixed-size ones (--batch_size) on the
    test split, each run a whole command, interleaved: the same output lines, and sentences/s of each."""
    from vaswani_mt.system import native_bf16

    parser = command_parser(batching)
    parser.add_argument("--model", required=True, help="a trained model folder")
    parser.add_argument("--max_tokens", type=int, default=1200, help="the token budget of a batch (translate.py's)")
    parser.add_argument("--batch_size", type=int, default=16, help="the fixed-size batches compared against")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of each command")
    args = parser.parse_args(argv)
    record = MachineRecord()
    with tempfile.TemporaryDirectory() as tmp:
        source, lines = _split_file(tmp)
        base = [sys.executable, TRANSLATE_PY, "--model", args.model, "--input", source]
        commands = {f"batch_size {args.batch_size}": [*base, "--batch_size", str(args.batch_size)],
                    f"max_tokens {args.max_tokens}": [*base, "--max_tokens", str(args.max_tokens)]}  # fmt: skip
        times, outputs = _run_commands(commands, args.repeats)
    if len(set(outputs.values())) > 1:
        raise AssertionError("token-budget batches gave other translations than fixed-size ones")
    result = {"model": args.model, "sentences": lines, "native_bf16": native_bf16(), "outputs_identical": True,
              "commands": {name: " ".join(["python", *command[1:]]) for name, command in commands.items()},
              "sides": rates(times, lines, f"batch_size {args.batch_size}")}  # fmt: skip
    return record.report(result, args.json)


# Issue 66's reference: CTranslate2 as its users script it (tokenize, translate_batch, detokenize, write). Arguments:
# the folder, the input, intra_threads (0: CTranslate2's default), the beam.
PLAIN_CTRANSLATE2 = """import sys, ctranslate2, transformers
folder, source, threads, beam = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
translator = ctranslate2.Translator(folder, device="cpu", intra_threads=threads)
lines = open(source, encoding="utf-8").read().splitlines()
tokens = [tokenizer.convert_ids_to_tokens(tokenizer.encode(line)) for line in lines]
found = translator.translate_batch(tokens, beam_size=beam, max_batch_size=64)
ids = [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in found]
sys.stdout.write("".join(text + "\\n" for text in tokenizer.batch_decode(ids, skip_special_tokens=True)))
"""


def commands(argv=None) -> dict:
    """Whole commands on the test split, wall time with start-up, --repeats rounds interleaved (issue 66): translate.py
    on our float32 model; translate.py on its CTranslate2 float32 export and a plain CTranslate2 script
    (`PLAIN_CTRANSLATE2`: translate_batch at beam 4, max_batch_size 64) at each of --threads (`default`: translate.py
    without --threads, the script with CTranslate2's intra_threads 0). Issue 66's targets: the export through
    translate.py takes at most 1.2x the script's time, and less than translate.py on our model."""
    from vaswani_mt.export.marian import export_model

    parser = command_parser(commands)
    parser.add_argument("--model", required=True, help="a saved vaswani_mt folder (the main job's: outputs/ding-cpu)")
    parser.add_argument("--export", default=None, help="its CTranslate2 float32 export (default: exported anew)")
    parser.add_argument("--threads", default="1,2,default", help="comma-separated thread counts, or default")
    parser.add_argument("--beam", type=int, default=4, help="beams of every side")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of each command")
    parser.add_argument("--max_sentences", type=int, default=None, help="the first N test sentences (a quick look)")
    args = parser.parse_args(argv)
    record = MachineRecord()
    with tempfile.TemporaryDirectory(prefix="commands-") as tmp:
        source, lines = _split_file(tmp, args.max_sentences)
        export = args.export or str(export_model(args.model, "ctranslate2", Path(tmp) / "ct2", None))
        ours = "translate.py, ours float32"
        sides = {ours: [sys.executable, TRANSLATE_PY, "--model", args.model, "--input", source, "--num_beams",
                        str(args.beam)]}  # fmt: skip
        for threads in args.threads.split(","):
            flag = [] if threads == "default" else ["--threads", threads]
            sides[f"translate.py, CTranslate2 export, threads {threads}"] = [*sides[ours][:3], export,
                                                                             *sides[ours][4:], *flag]  # fmt: skip
            sides[f"plain CTranslate2 script, threads {threads}"] = [
                sys.executable, "-c", PLAIN_CTRANSLATE2, export, source, "0" if threads == "default" else threads,
                str(args.beam)]  # fmt: skip
        times, outputs = _run_commands(sides, args.repeats)
    rows = rates(times, lines, ours)
    ratios = {}
    for threads in args.threads.split(","):
        export_side, script = (f"translate.py, CTranslate2 export, threads {threads}",
                               f"plain CTranslate2 script, threads {threads}")  # fmt: skip
        for other, at_least in ((script, 1 / 1.2), (ours, 1.0)):
            ratio = _pair_ratio(rows, export_side, other)
            ratios[f"{export_side} / {other}"] = {**ratio, "target": round(at_least, 3),
                                                  "met": ratio["ratio_of_medians"] >= at_least}  # fmt: skip
    same = {side: round(sum(a == b for a, b in zip(text.splitlines(), outputs[ours].splitlines(), strict=True))
                        / lines, 4) for side, text in outputs.items()}  # fmt: skip
    print_table(f"Whole commands on {lines} test sentences, beam {args.beam}, start-up included (issue 66)",
                [{"side": side, **row, "identical_to_ours": same[side]} for side, row in rows.items()],
                ["side", "median_s", "sentences_per_s", "ratio_of_medians", "identical_to_ours"])  # fmt: skip
    print_table("Issue 66's targets (ratio of speeds, medians)", [{"ratio": n, **r} for n, r in ratios.items()],
                ["ratio", "ratio_of_medians", "median_of_round_ratios", "target", "met"])  # fmt: skip
    result = {"model": args.model, "export": args.export, "sentences": lines, "beam": args.beam, "sides": rows,
              "identical_to_ours": same, "ratios": ratios, "plain_script": PLAIN_CTRANSLATE2}  # fmt: skip
    return record.report(result, args.json)


# --- peers: ours beside MarianMTModel and CTranslate2 as their users run them, in one run (issue 52, item 6) ---------

# The ratios issues 52 and 66 set targets on: (side, against it, at least).
THROUGH = "CTranslate2 float32 through translate.py"
PEER_TARGETS = {"ours float32 / MarianMTModel float32": ("ours float32", "MarianMTModel float32", 1.5),
                "ours float32 / CTranslate2 float32": ("ours float32", "CTranslate2 float32", 1.0),
                "ours int8 / CTranslate2 int8": ("ours int8", "CTranslate2 int8", 1.0),
                "ours one term / ours no terms": ("ours one term", "ours no terms", 0.7),
                # issue 66: CTranslate2 through translate.py (our Translator, the paper's ranking)
                "CTranslate2 through translate.py / ours float32": (THROUGH, "ours float32", 1.0),
                "CTranslate2 through translate.py / its own ranking": (THROUGH, f"{THROUGH}, own ranking",
                                                                       1 / 1.15)}  # fmt: skip


def _longest_first(tokenizer, batch: int, limit, search):
    """A peer's side (sentences -> translations), batched as ours batches: longest first, `batch` at a time.
    `search(ids, limit)` translates one batch's source ids into token ids, under the length limit of its longest
    source (`limit(tokens)`: the model's a·|X| + b, `</s>` counted; the peers take one limit per call)."""
    from vaswani_mt.model.pipeline_vaswani import single_line

    def translate(sentences: list[str]) -> list[str]:
        ids = tokenizer(list(sentences))["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out = [""] * len(ids)
        for start in range(0, len(order), batch):
            rows = order[start : start + batch]
            found = search([ids[i] for i in rows], limit(max(len(ids[i]) for i in rows)))
            for i, text in zip(rows, tokenizer.batch_decode(found, skip_special_tokens=True), strict=True):
                out[i] = single_line(text)
        return out

    return translate


def _pair_ratio(rows: dict, side: str, other: str) -> dict:
    """`side`'s speed over `other`'s: the ratio of their medians, and the median of the per-round ratios."""
    rounds = [b / a for a, b in zip(rows[side]["seconds"], rows[other]["seconds"], strict=True) if a > 0]
    return {"ratio_of_medians": round(rows[side]["sentences_per_s"] / rows[other]["sentences_per_s"], 3),
            "median_of_round_ratios": round(statistics.median(rounds), 3) if rounds else None}  # fmt: skip


def count_work(args, model, tokenizer, limit, sources, references) -> dict:
    """The work ours (`Translator`, float32, the model's saved search) and CTranslate2 (float32, its own ranking, as
    `peers` runs it) do on the same lines, counted (deterministic, unlike times): decoder steps (calls of the decoder,
    over all batches), row-steps (the rows each call decodes, summed), rows per step, and sentence-steps (each
    sentence's steps in the batch, summed). Ours: counted at the search's decoder step. CTranslate2's, from its
    outputs by its search's rules (decoding.cc's BeamSearch): a hypothesis ending at step s (from 0) has s tokens,
    `</s>` not counted; a sentence leaves at the step it has `beam` hypotheses (patience 1), so its steps are 1 + its
    longest hypothesis' tokens (at most the batch's length limit; its `beam` best are returned, and one dropped for a
    better one at that step would make this a lower bound); the first step decodes one row per sentence (the CPU
    expands the beams after it), the others `beam` rows per sentence still searched."""
    import importlib

    import ctranslate2

    from vaswani_mt.evaluation.metrics import bleu
    from vaswani_mt.export.marian import export_model
    from vaswani_mt.inference.translator import Translator

    search_module = importlib.import_module(type(model).__module__.rsplit(".", 1)[0] + ".beam_search_vaswani")
    rows: list[tuple[int, int]] = []  # (sentences, rows) a decoder step
    step = search_module._Decoder.next_log_probs

    def counted_step(decoder, sequences, generated, *rest):
        alone = generated == 1 and getattr(decoder, "first_alone", False)  # the first step: one row a sentence
        rows.append((sequences.shape[0], sequences.shape[0] * (1 if alone else sequences.shape[1])))
        return step(decoder, sequences, generated, *rest)

    search_module._Decoder.next_log_probs = counted_step
    can_leave, texts, work, nbest = search_module._sentences_can_leave, {}, {}, {}
    try:
        for side, leave in (("ours float32", can_leave), ("ours float32, every row kept", lambda *_: False)):
            search_module._sentences_can_leave = leave
            rows.clear()
            ours = Translator(model, tokenizer, batch_size=args.batch, num_beams=args.beam, compute_type="float32")
            texts[side] = ours.translate(sources)
            work[side] = {"decoder_steps": len(rows), "row_steps": sum(r for _, r in rows),
                          "sentence_steps": sum(n for n, _ in rows)}  # fmt: skip
            nbest[side] = Translator(model, tokenizer, batch_size=args.batch, num_beams=args.beam, nbest=args.beam,
                                     compute_type="float32").translate(sources)  # fmt: skip
            work[side]["nbest_row_steps"] = sum(r for _, r in rows) - work[side]["row_steps"]
    finally:
        search_module._Decoder.next_log_probs, search_module._sentences_can_leave = step, can_leave
    pairs = [(a, b) for x, y in zip(*nbest.values(), strict=True) for a, b in zip(x, y, strict=True)]
    same = [(a, b) for a, b in pairs if a.text == b.text]
    leaving = {"lines_identical": round(sum(a == b for a, b in zip(*texts.values(), strict=True)) / len(sources), 4),
               "nbest_hypotheses": len(pairs), "nbest_texts_identical": len(same),
               "nbest_max_abs_diff_log_prob": max((abs(a.log_prob - b.log_prob) for a, b in same), default=0.0),
               "nbest_max_abs_diff_score": max((abs(a.score - b.score) for a, b in same), default=0.0)}  # fmt: skip
    ct2 = {"decoder_steps": 0, "row_steps": 0, "sentence_steps": 0}

    def ct2_batch(ids, most):  # as `peers`' ct2_search, its hypotheses counted
        found = engine.translate_batch([tokenizer.convert_ids_to_tokens(x) for x in ids], beam_size=args.beam,
                                       length_penalty=model.generation_config.length_penalty, num_hypotheses=args.beam,
                                       max_decoding_length=most - 1, max_input_length=0)  # fmt: skip
        steps = [min(1 + max(len(h) for h in result.hypotheses), most - 1) for result in found]
        ct2["decoder_steps"] += max(steps)
        ct2["row_steps"] += len(ids) + sum(args.beam * sum(s > t for s in steps) for t in range(1, max(steps)))
        ct2["sentence_steps"] += sum(steps)
        return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in found]

    with tempfile.TemporaryDirectory(prefix="work-") as scratch:
        folder = export_model(args.model, "ctranslate2", Path(scratch) / "float32", None)
        engine = ctranslate2.Translator(str(folder), device="cpu", intra_threads=args.threads, inter_threads=1)
        texts["CTranslate2 float32"] = _longest_first(tokenizer, args.batch, limit, ct2_batch)(sources)
    work["CTranslate2 float32"] = ct2
    for side, row in work.items():
        row["rows_per_step"] = round(row["row_steps"] / row["decoder_steps"], 2)
        row["bleu"] = round(bleu(texts[side], references)["score"], 2)
    ours_row, theirs = work["ours float32"], work["CTranslate2 float32"]
    leaving["bleu_diff"] = round(ours_row["bleu"] - work["ours float32, every row kept"]["bleu"], 4)
    ratios = {
        name: round(ours_row[name] / theirs[name], 3) for name in ("decoder_steps", "row_steps", "sentence_steps")
    }
    print_table(f"Work on {len(sources)} test sentences, beam {args.beam}, batches of {args.batch} (counted)",
                [{"side": side, **row} for side, row in work.items()],
                ["side", "decoder_steps", "row_steps", "rows_per_step", "sentence_steps", "bleu"])  # fmt: skip
    ours_lines, ct2_lines = texts["ours float32"], texts["CTranslate2 float32"]
    identical = sum(a == b for a, b in zip(ours_lines, ct2_lines, strict=True)) / len(sources)
    print(f"sentences leaving against every row kept: {leaving}")
    return {"model": args.model, "beam": args.beam, "batch": args.batch, "sentences": len(sources),
            "work": work, "ours_over_ctranslate2": ratios, "identical_lines": round(identical, 4),
            "leaving_against_every_row_kept": leaving}  # fmt: skip


def peers(argv=None) -> dict:
    """A saved model on the built-in test split, beam 4 and batches of 16, each side as its users run it, --repeats
    rounds interleaved (medians): ours (`Translator`, the model's saved search) in float32, int8 and, where
    `native_bf16()`, bfloat16 (the compute types against float32); MarianMTModel's generate() (`to_marian` of the
    same weights, its own stopping rule); CTranslate2's translate_batch (the model exported in float32 and int8, its
    own ranking log P / |Y|^alpha); both peers in batches of 16, longest first, at most |X| + 50 tokens (the longest
    source's). Beside them the float32 export through translate.py (`THROUGH`: our `Translator` on it, as the command
    runs it: its batches, §6.1's ranking), and the same with CTranslate2's own ranking. Then ours on the test
    sentences with a reference term (`reference_terms`), each with its one term, beside the same sentences without.
    Sentences/s, BLEU, the ratios of issues 52's and 66's targets and whether each is met."""
    import logging

    import ctranslate2

    from vaswani_mt.evaluation.terminology import reference_terms
    from vaswani_mt.export.ctranslate2 import CTranslate2Model
    from vaswani_mt.export.marian import export_model
    from vaswani_mt.inference.loading import load_for_inference
    from vaswani_mt.inference.translator import Translator
    from vaswani_mt.system import native_bf16

    parser = command_parser(peers)
    parser.add_argument("--model", required=True, help="a saved vaswani_mt folder (the main job's: outputs/ding-cpu)")
    parser.add_argument("--beam", type=int, default=4, help="beams of every side")
    parser.add_argument("--batch", type=int, default=16, help="sentences per batch of every side")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of the whole split per side")
    parser.add_argument("--max_sentences", type=int, default=None, help="the first N test sentences (a quick look)")
    parser.add_argument("--split", default="test", choices=["test", "validation"],
                        help="the built-in corpus's split (validation: the dev split `auto` is chosen on)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch's and CTranslate2's")
    parser.add_argument("--count_work", action="store_true",
                        help="no timing: the decoder steps and rows each side decodes, ours and CTranslate2 float32 "
                             "(issue 62, item 1: `count_work`)")  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    record = MachineRecord()
    model, tokenizer = load_for_inference(args.model, device="cpu")
    search = model.generation_config
    alpha = search.length_penalty

    def limit(tokens: int) -> int:  # the model's a·|X| + b (§6.1's |X| + 50 where it saved none)
        a, b = (1, 50) if search.max_len_b is None else (search.max_len_a or 0, search.max_len_b)
        return int(a * tokens + b)

    marian = to_marian(model).eval()

    @torch.no_grad()
    def marian_search(ids, most):
        inputs = tokenizer.pad({"input_ids": ids}, return_tensors="pt")
        return marian.generate(**inputs, num_beams=args.beam, length_penalty=alpha, early_stopping=False,
                               max_new_tokens=most)  # fmt: skip

    def ct2_search(engine):
        def search_batch(ids, most):  # CTranslate2 does not count </s> in max_decoding_length
            tokens = [tokenizer.convert_ids_to_tokens(x) for x in ids]
            found = engine.translate_batch(tokens, beam_size=args.beam, length_penalty=alpha,
                                           max_decoding_length=most - 1, max_input_length=0)  # fmt: skip
            return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in found]

        return search_batch

    sources, references = split_pairs(args.split, args.max_sentences)
    if args.count_work:
        return record.report(count_work(args, model, tokenizer, limit, sources, references), args.json)
    ours = {ct: Translator(model, tokenizer, batch_size=args.batch, num_beams=args.beam, compute_type=ct)
            for ct in ("float32", "int8", *(("bfloat16",) if native_bf16() else ()))}  # fmt: skip
    result = {"model": args.model, "split": args.split, "native_bf16": native_bf16(), "beam": args.beam,
              "batch": args.batch, "alpha": alpha, "ctranslate2": ctranslate2.__version__}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="peers-") as scratch:
        sides = {**{f"ours {ct}": translator.translate for ct, translator in ours.items()},
                 "MarianMTModel float32": _longest_first(tokenizer, args.batch, limit, marian_search)}  # fmt: skip
        for ct in ("float32", "int8"):
            folder = export_model(args.model, "ctranslate2", Path(scratch) / ct, None if ct == "float32" else ct)
            engine = ctranslate2.Translator(str(folder), device="cpu", intra_threads=args.threads, inter_threads=1)
            sides[f"CTranslate2 {ct}"] = _longest_first(tokenizer, args.batch, limit, ct2_search(engine))
            if ct == "float32":  # issue 66: through translate.py, as the command runs it, and with its own ranking
                sides[THROUGH] = Translator(str(folder), num_beams=args.beam, threads=args.threads).translate
                own = CTranslate2Model(folder, ranking="ctranslate2", intra_threads=args.threads)
                sides[f"{THROUGH}, own ranking"] = Translator(own, num_beams=args.beam).translate
        torch.set_num_threads(args.threads)  # a CTranslate2 translator sets the OpenMP thread count, torch's too
        print(
            f"\n{len(sources)} {args.split} sentences, beam {args.beam}, batches of {args.batch}, "
            f"{args.threads} threads"
        )
        rows = run_sides(sides, sources, references, args.repeats, "ours float32")[0]
    terms = reference_terms(sources, references)
    chosen = [i for i, wanted in enumerate(terms) if wanted]
    term_of = {sources[i]: terms[i] for i in chosen}
    controls = logging.getLogger("vaswani_mt.inference.controls")
    level = controls.level
    controls.setLevel(logging.ERROR)  # the terms' notes (rare words, unmet terms) are not what is measured
    try:
        print(f"\n{len(chosen)} of them with a reference term")
        rows.update(run_sides(
            {"ours no terms": ours["float32"].translate,
             "ours one term": lambda lines: ours["float32"].translate(lines, terms=[term_of[s] for s in lines])},
            [sources[i] for i in chosen], [references[i] for i in chosen], args.repeats, "ours no terms",
        )[0])  # fmt: skip
    finally:
        controls.setLevel(level)
    result["sentences"], result["sentences_with_a_term"], result["sides"] = len(sources), len(chosen), rows
    result["ratios"] = {name: {**_pair_ratio(rows, side, other), "target": at_least,
                               "met": rows[side]["sentences_per_s"] >= at_least * rows[other]["sentences_per_s"]}
                        for name, (side, other, at_least) in PEER_TARGETS.items()}  # fmt: skip
    targets = [{"ratio": name, **ratio} for name, ratio in result["ratios"].items()]
    print_table("Issues 52 and 66: targets (ratio of medians)", targets,
                ["ratio", "ratio_of_medians", "median_of_round_ratios", "target", "met"])  # fmt: skip
    return record.report(result, args.json)


def products(argv=None) -> dict:
    """A decoder step's matrix products at decode row counts (the model's linear shapes: d x d, d x d_ff, d_ff x d,
    d x V), each way we can run them, --repeats interleaved rounds of --calls calls (medians, microseconds a call):
    float32 and bf16 `F.linear`; float32 through MKL's packed GEMM packed for those rows (what CTranslate2 uses);
    float32 and bf16 reordered once for oneDNN, any rows (the payload's `_project`); dynamic int8 (`Int8Linear`);
    and what packing costs (one `_mkl_reorder_linear_weight` for those rows, done again at each new row count; one
    oneDNN reorder, done once): how many calls at one row count repay a pack (issue 62, item 4)."""
    from vaswani_mt.inference.compute_types import Int8Linear
    from vaswani_mt.model import fast_paths_vaswani as fast

    mkl = torch.backends.mkl.is_available() and all(
        hasattr(torch.ops.mkl, name) for name in ("_mkl_reorder_linear_weight", "_mkl_linear")
    )

    parser = command_parser(products)
    parser.add_argument("--model", default=None, help="a saved folder whose shapes to use (default: preset `small`)")
    parser.add_argument("--rows", default="4,16,32,64", help="rows a product multiplies (beams x sentences)")
    parser.add_argument("--calls", type=int, default=200, help="calls a timed round")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch's threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    record = MachineRecord()
    config = (VaswaniConfig.from_pretrained(args.model) if args.model
              else VaswaniConfig.from_preset("small", vocab_size=8000))  # fmt: skip
    d, ff, vocab = config.d_model, config.d_ff, config.vocab_size
    torch.manual_seed(0)
    cases = []
    shapes = {"d x d": (d, d), "FFN in": (d, ff), "FFN out": (ff, d), "logits": (d, vocab)}
    for name, (fan_in, fan_out) in shapes.items():
        linear = torch.nn.Linear(fan_in, fan_out).eval()
        bf16 = copy.deepcopy(linear).to(torch.bfloat16)
        int8 = Int8Linear.from_float(_dynamic_qconfig(copy.deepcopy(linear)))
        for rows in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(rows, fan_in)
            xb = x.to(torch.bfloat16)
            ways = {"float32": partial(torch.nn.functional.linear, x, linear.weight, linear.bias),
                    "bfloat16": partial(torch.nn.functional.linear, xb, bf16.weight, bf16.bias),
                    "int8": partial(int8, x)}  # fmt: skip
            if mkl:
                packed = torch.ops.mkl._mkl_reorder_linear_weight(linear.weight.detach(), rows)
                ways["float32 MKL packed"] = partial(torch.ops.mkl._mkl_linear, x, packed, linear.weight, linear.bias,
                                                     rows)  # fmt: skip
                ways["MKL pack"] = partial(torch.ops.mkl._mkl_reorder_linear_weight, linear.weight.detach(), rows)
            if torch.float32 in fast._PREPACKED_DTYPES:
                ways["float32 prepacked"] = partial(fast._project, linear, x)
            if torch.bfloat16 in fast._PREPACKED_DTYPES:
                ways["bfloat16 prepacked"] = partial(fast._project, bf16, xb)
                ways["oneDNN reorder bf16"] = partial(torch.ops.mkldnn._reorder_linear_weight, bf16.weight.detach(),
                                                      None)  # fmt: skip
            with torch.no_grad():
                times = interleave({way: partial(_calls, call, args.calls) for way, call in ways.items()},
                                   args.repeats)  # fmt: skip
            case = {"product": name, "shape": f"{rows} x {fan_in} x {fan_out}",
                    **{way: round(1e6 * statistics.median(t) / args.calls, 1) for way, t in times.items()}}  # fmt: skip
            cases.append(case)
            print(json.dumps(case), flush=True)
    print_table(f"Matrix products, microseconds a call (medians of {args.repeats} rounds of {args.calls})", cases,
                list(dict.fromkeys(k for c in cases for k in c)))  # fmt: skip
    return record.report({"model": args.model or "preset small, vocab 8000", "cases": cases}, args.json)


def _dynamic_qconfig(linear: torch.nn.Linear) -> torch.nn.Linear:
    from torch.ao.quantization import per_channel_dynamic_qconfig

    linear.qconfig = per_channel_dynamic_qconfig
    return linear


def _calls(call, count: int) -> None:
    for _ in range(count):
        call()


def main(argv=None):
    commands_ = {"train": train, "decode": decode, "batching": batching, "peers": peers, "commands": commands,
                 "products": products}  # fmt: skip
    return dispatch(__doc__, commands_, argv)


if __name__ == "__main__":
    main()
