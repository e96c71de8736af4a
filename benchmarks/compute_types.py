#!/usr/bin/env python
"""Compute types side by side (`load_for_inference(folder, compute_type=...)`): a saved model translates the built-in
test split with each type, interleaved in one process, with the paper's beam search (the model's own: 4 beams, its
GNMT alpha) and greedy search, both in batches of `--batch` sentences of similar length (`translate()`).

Reported per search and side: sentences/s (median over `--repeats` rounds of the whole split, the side order rotated
each round), the ratio to float32 (ratio of medians, and median of the per-round ratios), sacreBLEU, and the share of
lines identical to float32's. Sides:

- `float32`, `bfloat16` (weights cast to bf16), `int8` (PyTorch's dynamic int8, what `compute_type="int8"` does);
- `bfloat16_autocast`: the float32 model under `torch.autocast(bfloat16)`, the other way to bf16;
- `bfloat16_fp32_layernorm`: bf16 weights but the LayerNorms' gains and biases kept in float32;
- `int8_torchao`: torchao's `Int8DynamicActivationInt8WeightConfig` on every nn.Linear (int8 weights per row, int8
  activations per token), eager, without torch.compile; only where `import torchao` works.

`bfloat16` sides only where `native_bf16()`. Writes JSON (`--json`).

    python benchmarks/compute_types.py --model outputs/ding-cpu --json benchmarks/compute_types_2026-11-26.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import importlib.util
import warnings

import torch
from speed_common import MachineRecord, run_sides, split_pairs
from torch import nn

from vaswani_mt.inference.compute_types import apply_compute_type
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.translate import translate
from vaswani_mt.system.devices import native_bf16


class _TorchaoLinear(nn.Linear):
    """An nn.Linear whose weight torchao quantized: a type of its own, so the model's float32 fast path (plain
    nn.Linear only) calls the layer, and torchao's kernels run."""


def torchao_int8(model: nn.Module) -> nn.Module | None:
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except ImportError:
        return None
    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = _TorchaoLinear
    return model


def bf16_float_norms(model: nn.Module) -> nn.Module:
    """The model in bf16 but its LayerNorms' gains and biases in float32 (torch normalises bf16 input with them)."""
    model = model.to(torch.bfloat16)
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.float()
    return model


def make_sides(model) -> dict:
    """name -> (model, context manager factory)."""
    sides = {"float32": (model, contextlib.nullcontext)}
    if native_bf16():
        sides["bfloat16"] = (apply_compute_type(copy.deepcopy(model), "bfloat16"), contextlib.nullcontext)
        sides["bfloat16_autocast"] = (model, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
        sides["bfloat16_fp32_layernorm"] = (bf16_float_norms(copy.deepcopy(model)), contextlib.nullcontext)
    sides["int8"] = (apply_compute_type(copy.deepcopy(model), "int8"), contextlib.nullcontext)
    ao = torchao_int8(copy.deepcopy(model))
    if ao is not None:
        sides["int8_torchao"] = (ao, contextlib.nullcontext)
    return sides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="outputs/ding-cpu", help="a saved vaswani_mt folder")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the whole split per side and search")
    parser.add_argument("--max_sentences", type=int, default=None)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning, module="torchao")
    record = MachineRecord()
    model, tokenizer = load_for_inference(args.model, device="cpu")
    sources, references = split_pairs("test", args.max_sentences)
    sides = make_sides(model)
    torchao = importlib.util.find_spec("torchao") and importlib.metadata.version("torchao")
    result = {"model": args.model, "native_bf16": native_bf16(), "torchao": torchao or None,
              "sentences": len(sources), "batch": args.batch, "sides": list(sides), "searches": []}  # fmt: skip

    def side(model, context, kwargs):
        def call(sentences):
            with context():
                return translate(model, tokenizer, sentences, batch_size=args.batch, **kwargs)

        return call

    for search, kwargs in {"beam 4 (the model's search)": {}, "greedy": {"num_beams": 1}}.items():
        print(f"\n{search}, batch {args.batch}, {len(sources)} sentences, native_bf16={native_bf16()}")
        calls = {name: side(model, context, kwargs) for name, (model, context) in sides.items()}
        rows, _ = run_sides(calls, sources, references, args.repeats, "float32")
        result["searches"].append({"search": search, "sides": rows})
    record.report(result, args.json)


if __name__ == "__main__":
    main()
