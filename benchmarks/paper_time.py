#!/usr/bin/env python
"""Expected wall time of the paper's two training runs on 1 and 8 GPUs, from FLOPs counted from the model.

For base (100k steps) and big (300k steps) at ~25,000 target tokens per step: the training FLOPs per target token
counted by `vaswani_mt.training.flops.count_training_flops` (forward + backward, the fused loss included;
cross-checked against
the analytic count), the total, the paper's Table 2 cost beside it, and the hours each GPU kind needs at a stated
MFU (model FLOPs utilisation) of its dense bf16 tensor peak (fp16 on P100 and V100; vendor data sheets, see
`vaswani_mt.training.flops.GPU_PEAK_TFLOPS`), 8 GPUs assumed to keep the same MFU each. Prints only; writes no file.

Table 2's cost is the paper's own estimate, GPU-hours x 9.5 TFLOPS per P100 (fp32, 100% utilisation), so the
counted total over it is the utilisation the paper's run had of that figure.

    python benchmarks/paper_time.py                        # MFU 0.35, P100, V100, A100, H100
    python benchmarks/paper_time.py --mfu 0.5 --gpus H100
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for a run without installing

from vaswani_mt.training.flops import (
    GPU_PEAK_TFLOPS,
    PAPER_P100_TFLOPS,
    PAPER_RUNS,
    PAPER_TOKENS_PER_STEP,
    WMT14_MEAN_LENGTH,
    analytic_training_flops_per_token,
    count_training_flops,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mfu", type=float, default=0.35, help="model FLOPs utilisation assumed on every GPU")
    parser.add_argument("--gpus", default=",".join(GPU_PEAK_TFLOPS), help=f"of {', '.join(GPU_PEAK_TFLOPS)}")
    parser.add_argument("--counts", default="1,8", help="numbers of GPUs")
    parser.add_argument("--models", default="base,big")
    parser.add_argument("--length", type=int, default=WMT14_MEAN_LENGTH, help="tokens per sentence, each side")
    parser.add_argument("--tokens_per_step", type=int, default=PAPER_TOKENS_PER_STEP, help="target tokens")
    parser.add_argument("--vocab_size", type=int, default=37000)
    args = parser.parse_args(argv)
    unknown = [g for g in args.gpus.split(",") if g not in GPU_PEAK_TFLOPS]
    if unknown or not 0 < args.mfu <= 1:
        parser.error(f"unknown GPU kind {unknown}" if unknown else "--mfu must be in (0, 1]")
    return args


def estimate(args) -> dict:
    gpus = args.gpus.split(",")
    counts = [int(n) for n in args.counts.split(",")]
    models = {}
    for name in args.models.split(","):
        paper = PAPER_RUNS[name]
        counted = count_training_flops(name, args.length, vocab_size=args.vocab_size)
        analytic = analytic_training_flops_per_token(name, args.length, vocab_size=args.vocab_size)
        per_step = counted.per_target_token * args.tokens_per_step
        total = per_step * paper["steps"]
        hours = {gpu: {n: total / (n * args.mfu * GPU_PEAK_TFLOPS[gpu] * 1e12) / 3600 for n in counts} for gpu in gpus}
        paper_seconds = paper["hours_on_8_p100"] * 3600
        models[name] = {
            "steps": paper["steps"],
            "flops_per_target_token": counted.per_target_token,
            "analytic_flops_per_target_token": analytic["total"],
            "flops_per_step": per_step,
            "total_flops": total,
            "paper_table2_flops": paper["table2_flops"],
            "paper_hours_on_8_p100": paper["hours_on_8_p100"],
            # the counted work per second of the paper's run over its assumed 8 x 9.5 TFLOPS
            "paper_run_utilisation": total / (paper_seconds * 8 * PAPER_P100_TFLOPS * 1e12),
            "hours": hours,
        }
    return {
        "mfu": args.mfu,
        "length": args.length,
        "tokens_per_step": args.tokens_per_step,
        "peak_tflops": {gpu: GPU_PEAK_TFLOPS[gpu] for gpu in gpus},
        "models": models,
    }


def _duration(hours: float) -> str:
    if hours < 1:
        return f"{hours * 60:.0f} min"
    return f"{hours:.1f} h" if hours < 48 else f"{hours:.0f} h ({hours / 24:.1f} d)"


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = estimate(args)
    print(
        f"Training cost at {args.tokens_per_step:,} target tokens per step, sentences of {args.length} tokens each "
        "side (FLOPs counted from the model: forward + backward)\n"
    )
    print("| model | steps | MFLOP / target token (counted, analytic) | FLOPs / step | total FLOPs | "
          "Table 2 | paper: 8 P100 | paper's utilisation of 8 x 9.5 TFLOPS |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, m in result["models"].items():
        print(
            f"| {name} | {m['steps']:,} | {m['flops_per_target_token'] / 1e6:.1f}, "
            f"{m['analytic_flops_per_target_token'] / 1e6:.1f} | {m['flops_per_step']:.3g} | {m['total_flops']:.3g} "
            f"| {m['paper_table2_flops']:.2g} | {_duration(m['paper_hours_on_8_p100'])} "
            f"| {m['paper_run_utilisation']:.0%} |"
        )
    counts = [int(n) for n in args.counts.split(",")]
    print(f"\nExpected wall time at MFU {args.mfu:.2f} of the dense bf16/fp16 tensor peak (vendor data sheets)\n")
    header = " | ".join(f"{name}, {n} GPU{'s' if n > 1 else ''}" for name in result["models"] for n in counts)
    print(f"| GPU | peak TFLOPS | {header} |")
    print("|---|---|" + "---|" * (len(result["models"]) * len(counts)))
    for gpu, peak in result["peak_tflops"].items():
        cells = " | ".join(_duration(m["hours"][gpu][n]) for m in result["models"].values() for n in counts)
        print(f"| {gpu} | {peak:g} | {cells} |")
    print("\n" + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
