#!/usr/bin/env python
"""Where decoding time goes, and how far it is from what this machine can do: the decode roofline.

1. Peaks: the machine's matrix-product throughput on `torch.get_num_threads()` threads, float32 and bfloat16
   (`torch.mm`) and int8 (`torch._int_mm`, int32 accumulation), square products of `--peak_size`; best of repeats.
2. Profiles (`torch.profiler`, with FLOP counts): `translate()` of the built-in test split with a saved model
   (`--model`, the model's own search, batch 16), and a transformer-base model with random weights, beam 4 and
   greedy, batch 16, 30 forced steps. Operator self time goes into the buckets below; "Python and the rest" is the
   wall time no operator accounts for (the interpreter, transformers' and our search's Python, allocation).
3. Each side's matrix products: their FLOPs, time, and achieved GFLOP/s as a share of the float32 peak.

Buckets (by aten operator): matrix products (mm, addmm, bmm, matmul, linear); attention (scaled_dot_product
attention and its softmax); the cache (cat, index_select and copies that grow or reorder the KV cache); log-softmax
and top-k; host syncs (item, is_nonzero, _local_scalar_dense); the model's other operators (layer norm, residual adds,
ReLU, embedding, scaling); search bookkeeping (every other operator: the search's gathers, masks, comparisons, views).
The packed float32 products (`mkl::_mkl_linear`, fast_paths_vaswani.py) have no FLOP count of the profiler's: theirs
come from their shapes.

    python benchmarks/decode_profile.py --model outputs/ding-cpu --json benchmarks/decode_profile_2026-11-26.json

`--terms N` adds the first N test sentences with a Ding term (benchmarks/terminology.py), translated without and with
that term as a constraint: where the constrained search's time goes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed_common import MachineRecord

from vaswani_mt.model.configuration_vaswani import VaswaniConfig
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration
from vaswani_mt.system.devices import native_bf16

BUCKETS = {
    "matrix products": (
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::matmul",
        "aten::linear",
        "aten::baddbmm",
        "mkl::_mkl_linear",
    ),
    "attention": ("aten::_scaled_dot_product", "aten::scaled_dot_product", "aten::softmax", "aten::_softmax"),
    "cache": ("aten::cat", "aten::index_select", "aten::copy_", "aten::index_copy", "aten::_to_copy"),
    "log-softmax and top-k": ("aten::log_softmax", "aten::_log_softmax", "aten::topk", "aten::sort"),
    "host syncs": ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero"),
    "the model's other operators": (
        "aten::native_layer_norm",
        "aten::layer_norm",
        "aten::add",
        "aten::relu",
        "aten::embedding",
        "aten::dropout",
        "aten::mul",
        "aten::clamp_min",
    ),
}
MATMULS = BUCKETS["matrix products"]


def peaks(size: int, repeats: int = 5) -> dict:
    """GFLOP/s (int8: GOP/s) of a `size`-square product in float32, bfloat16 and int8, best of `repeats`."""
    out = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("int8", torch.int8)):
        if dtype is torch.int8:
            a, b = (torch.randint(-100, 100, (size, size), dtype=dtype) for _ in range(2))
            op = torch._int_mm
        else:
            a, b = (torch.randn(size, size, dtype=dtype) for _ in range(2))
            op = torch.mm
        op(a, b)
        best = min(_timed(lambda: op(a, b)) for _ in range(repeats))  # noqa: B023
        out[name] = round(2 * size**3 / best / 1e9, 1)
    return out


def bandwidth(mib: int = 512, repeats: int = 5) -> float:
    """GB/s of reading memory: a sum over `mib` MiB of float32, best of `repeats`."""
    data = torch.ones(mib * 2**18)
    data.sum()
    return round(data.numel() * 4 / min(_timed(data.sum) for _ in range(repeats)) / 1e9, 1)


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def bucket_of(key: str) -> str:
    for bucket, prefixes in BUCKETS.items():
        if key.startswith(prefixes):
            return bucket
    return "search bookkeeping"


def _flops(event) -> int:
    """The profiler's FLOP count, or for `mkl::_mkl_linear(input, packed, weight, ...)` 2 * rows * K * N."""
    if event.key == "mkl::_mkl_linear" and len(event.input_shapes) > 2 and event.input_shapes[2]:
        rows_k, (n, k) = event.input_shapes[0], event.input_shapes[2]
        rows = 1
        for size in rows_k[:-1]:
            rows *= size
        return 2 * rows * k * n * event.count
    return event.flops or 0


def profile(call, model, peak_fp32: float, gb_per_s: float) -> dict:
    """Wall time of `call` and its operator self time by bucket; the matrix products' FLOPs and share of the peak;
    the roofline: the decoder steps (forward calls of `model`'s decoder) and the least time they could take, each
    reading the decoder's and output projection's float32 weights once at `gb_per_s`, or doing all the products'
    FLOPs at the peak, whichever is longer (the encoder's products are included in the FLOPs)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    steps = []
    hook = model.model.decoder.register_forward_pre_hook(lambda module, args: steps.append(1))
    call()  # warm-up, untimed
    steps.clear()
    unprofiled = _timed(call)
    decoder_steps = len(steps)
    hook.remove()
    with torch_profile(activities=[ProfilerActivity.CPU], with_flops=True, record_shapes=True) as prof:
        start = time.perf_counter()
        call()
        wall = time.perf_counter() - start
    buckets = {bucket: 0.0 for bucket in [*BUCKETS, "search bookkeeping"]}
    flops, matmul_s = 0, 0.0
    for event in prof.key_averages(group_by_input_shape=True):
        seconds = event.self_cpu_time_total / 1e6
        buckets[bucket_of(event.key)] += seconds
        if event.key.startswith(MATMULS):
            flops += _flops(event)
            matmul_s += seconds
    operators = sum(buckets.values())
    buckets["Python and the rest"] = max(wall - operators, 0.0)
    achieved = flops / matmul_s / 1e9 if matmul_s else 0.0
    decoder = model.model.decoder
    weight_bytes = 4 * (sum(p.numel() for p in decoder.parameters()) + model.lm_head.weight.numel())
    weights_s = decoder_steps * weight_bytes / gb_per_s / 1e9
    return {
        "wall_s": round(wall, 3),
        "wall_s_unprofiled": round(unprofiled, 3),
        "share": {bucket: round(seconds / wall, 3) for bucket, seconds in buckets.items()},
        "seconds": {bucket: round(seconds, 3) for bucket, seconds in buckets.items()},
        "matmul_gflop": round(flops / 1e9, 2),
        "matmul_gflop_per_s": round(achieved, 1),
        "matmul_share_of_fp32_peak": round(achieved / peak_fp32, 3),
        "all_at_fp32_peak_s": round(flops / 1e9 / peak_fp32, 3),
        "decoder_steps": decoder_steps,
        "weights_read_at_bandwidth_s": round(weights_s, 3),
        "roofline_s": round(max(weights_s, flops / 1e9 / peak_fp32), 3),
        "unprofiled_over_roofline": round(unprofiled / max(weights_s, flops / 1e9 / peak_fp32), 2),
    }


def test_split_call(folder: str, batch: int):
    from vaswani_mt.data.corpus import BUILTIN_CORPUS, load_corpus, source_target
    from vaswani_mt.inference.loading import load_for_inference
    from vaswani_mt.inference.translate import translate

    model, tokenizer = load_for_inference(folder, device="cpu")
    sources, _ = source_target(load_corpus(BUILTIN_CORPUS, None, "en", "de")["test"], "en", "de")
    return (lambda: translate(model, tokenizer, sources, batch_size=batch)), model, len(sources)


def term_calls(folder: str, batch: int, sentences: int) -> dict:
    """translate() of the first `sentences` test sentences with a Ding term (terminology.py's term test), without
    and with that term as a constraint: {name: (call, model)}."""
    from terminology import noun_pairs, term_test

    from vaswani_mt.data.corpus import BUILTIN_CORPUS, _fetch_ding_dictionary, cache_dir, load_corpus, source_target
    from vaswani_mt.inference.loading import load_for_inference
    from vaswani_mt.inference.translate import translate

    model, tokenizer = load_for_inference(folder, device="cpu")
    sources, references = source_target(load_corpus(BUILTIN_CORPUS, None, "en", "de")["test"], "en", "de")
    terms = term_test(sources, references, noun_pairs(_fetch_ding_dictionary(cache_dir() / "ding")))
    chosen = [(source, term) for source, term in zip(sources, terms, strict=True) if term][:sentences]
    texts, wanted = [source for source, _ in chosen], [term for _, term in chosen]
    name = f"{len(texts)} term sentences, batch {batch}"
    return {
        f"{name}, unconstrained": ((lambda: translate(model, tokenizer, texts, batch_size=batch)), model),
        f"{name}, one constraint each": ((lambda: translate(model, tokenizer, texts, batch_size=batch,
                                                            constraints=wanted)), model),
    }  # fmt: skip


def base_shape_call(beams: int, batch: int, steps: int, length: int = 24):
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("base", vocab_size=32000)).eval()
    ids = torch.randint(4, 32000, (batch, length))
    ids[:, -1] = model.config.eos_token_id
    kwargs = {"num_beams": beams, "min_new_tokens": steps, "max_new_tokens": steps, "do_sample": False}
    return (lambda: model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)), model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a saved vaswani_mt folder: profile translate() of the test split with it")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30, help="forced steps of the base-shape runs")
    parser.add_argument("--peak_size", type=int, default=2048)
    parser.add_argument("--terms", type=int, default=0, help="also N term sentences without and with a constraint")
    parser.add_argument("--no_base", action="store_true", help="skip the base-shape runs")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args()
    record = MachineRecord()
    result = {"native_bf16": native_bf16(), "threads": torch.get_num_threads(), "peaks": peaks(args.peak_size),
              "memory_gb_per_s": bandwidth()}  # fmt: skip
    print(json.dumps(result), flush=True)
    fp32 = result["peaks"]["float32"]
    runs = {}
    if args.model:
        call, model, sentences = test_split_call(args.model, args.batch)
        runs[f"test split ({sentences} sentences), the model's search, batch {args.batch}"] = (call, model)
    if args.model and args.terms:
        runs.update(term_calls(args.model, args.batch, args.terms))
    for beams in () if args.no_base else (4, 1):
        name = f"base shapes, {'beam 4' if beams > 1 else 'greedy'}, batch {args.batch}, {args.steps} forced steps"
        runs[name] = base_shape_call(beams, args.batch, args.steps)
    result["profiles"] = {}
    for name, (call, model) in runs.items():
        result["profiles"][name] = profile(call, model, fp32, result["memory_gb_per_s"])
        print(name, json.dumps(result["profiles"][name]), flush=True)
    result.update(record.finish())
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
