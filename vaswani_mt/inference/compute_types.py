"""Compute types for inference, by CTranslate2's names: how a loaded model's matrix products run.

- `float32` (the default): the saved weights as they are; on a CPU each linear layer's weight reordered once for
  oneDNN (the payload's `fast_paths_vaswani._project`), as in the model's own `generate()`.
- `bfloat16`: the weights cast to bf16 (`model.to(torch.bfloat16)`), so every matrix product runs in bf16; the search
  still scores in float32 (our beam search and transformers' greedy search cast the logits before the log-softmax,
  the length penalty is applied to those float32 scores), softmax inside attention runs in float32 (eager) or with
  float32 accumulation (sdpa), and LayerNorm accumulates in float32; on a CPU the weights reordered once, as
  float32's. Only where the hardware multiplies bf16 natively (`native_bf16()`, or a CUDA GPU that has it):
  elsewhere torch emulates it, about 2x slower.
- `int8`: every `nn.Linear` (the encoder's and decoder's projections, the FFN and the pre-softmax projection
  `lm_head`) with int8 weights, one scale per output row, and its input quantized to int8 at each call (dynamic
  quantization, PyTorch's fbgemm kernels), as CTranslate2's int8. The embedding lookups stay float32: `lm_head`'s
  int8 copy is its own, the shared matrix (§3.4) that the embeddings read stays the float one. CPU only.
- `auto`: the fastest of these whose test BLEU is within 0.1 of float32 on this kind of hardware, measured
  beforehand (`AUTO_COMPUTE_TYPES`), never at run time.

Applied by the `Translator` (`TranslationOptions.compute_type`: a converted copy, the model given unchanged) or when a
model is loaded (`load_for_inference(folder, compute_type=...)`); the saved folder is unchanged.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from vaswani_mt.inference.options import COMPUTE_TYPES, CTRANSLATE2_COMPUTE_TYPES
from vaswani_mt.system.devices import native_bf16

# `auto` by hardware class: the fastest type whose sacreBLEU on the model's dev split is within 0.1 of float32's
# with the model's own search (benchmarks/speed.py peers --split validation, beam 4 at batch 16; greedy int8 lost
# 0.19 on test). On the main job's model of 2026-11-29 every type qualifies on dev (float32 7.58, bfloat16 7.63,
# int8 7.74) and on test (7.82, 7.82, 7.79): the speed decides, int8 1.11x float32 against bfloat16's 1.06x, all
# three on prepacked or int8 weights (RESULTS.md, 2026-11-29 float32 through oneDNN's prepacked weights).
AUTO_COMPUTE_TYPES = {
    "native-bf16 CPU": "int8",
    "AVX2 CPU": "float32",  # not measured
    "CUDA": "float32",  # not measured
}


def hardware_class(device: str | torch.device | None = None) -> str:
    """The row of `AUTO_COMPUTE_TYPES` that `device` (default: GPU if there is one) belongs to."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return "CUDA"
    return "native-bf16 CPU" if native_bf16() else "AVX2 CPU"


def resolve_compute_type(compute_type: str, device: str | torch.device | None = None) -> str:
    """`compute_type` checked for `device` (default: GPU if there is one), `auto` replaced by its table entry; a
    type this device cannot run well raises `ValueError`, one line, before any model loads."""
    if compute_type in CTRANSLATE2_COMPUTE_TYPES and compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute type {compute_type!r} is CTranslate2's: vaswani_mt's own models take "
                         f"{', '.join(COMPUTE_TYPES)}")  # fmt: skip
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"unknown compute type {compute_type!r}: use {', '.join(COMPUTE_TYPES)}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if compute_type == "auto":
        return AUTO_COMPUTE_TYPES[hardware_class(device)]
    if compute_type == "bfloat16":
        native = torch.cuda.is_bf16_supported() if device.type == "cuda" else native_bf16()
        if not native:
            where = "this GPU" if device.type == "cuda" else "this CPU (no AVX512-BF16/AMX)"
            raise ValueError(
                f"bfloat16 is not native on {where}: it would be about 2x slower than float32; use float32 or int8"
            )
    if compute_type == "int8" and device.type != "cpu":
        raise ValueError(f"int8 runs on the CPU only (PyTorch's dynamic int8 kernels), not {device}: use float32 or "
                         "bfloat16, or device cpu")  # fmt: skip
    return compute_type


class Int8Linear(torch.ao.nn.quantized.dynamic.Linear):
    """PyTorch's dynamic int8 linear layer (per-row weight scales), under a name of ours: the model's float32 fast path
    (fast_paths_vaswani._project) takes plain `nn.Linear` layers only and calls any other."""

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype=torch.qint8, per row"


def _quantize_int8(model: nn.Module) -> nn.Module:
    """Every `nn.Linear` of `model` replaced, in place, by an `Int8Linear` (per-row weight scales)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        # Deprecated in torch 2.13 for torchao, whose int8 is slower on CPU without torch.compile (RESULTS.md).
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*", category=UserWarning)
        return quantize_dynamic(
            model, {nn.Linear: per_channel_dynamic_qconfig}, mapping={nn.Linear: Int8Linear}, inplace=True
        )


def _bfloat16(model: nn.Module) -> nn.Module:
    """`model` in bf16, in place: weights, so the KV cache and the logits too."""
    return model.to(torch.bfloat16)


def compute_type_of(model: nn.Module) -> str:
    """The compute type `model` runs at: "int8" where its linear layers are `Int8Linear`, "bfloat16" where its
    weights are bf16, else "float32"."""
    if any(isinstance(module, Int8Linear) for module in model.modules()):
        return "int8"
    return "bfloat16" if next(model.parameters()).dtype == torch.bfloat16 else "float32"


def converted(model: nn.Module, compute_type: str) -> nn.Module:
    """`model` (in eval mode, on its device) converted, in place, to run with `compute_type`, one of `COMPUTE_TYPES`
    already resolved (`resolve_compute_type`); `float32` returns it untouched. Nothing else of the model changes:
    a converted model is for inference (an int8 one has no float weights to save)."""
    if compute_type == "float32" or compute_type_of(model) == compute_type:
        return model
    if compute_type == "bfloat16":
        return _bfloat16(model)
    if compute_type == "int8":
        return _quantize_int8(model)
    raise ValueError(f"compute type {compute_type!r} is not resolved: use resolve_compute_type first")


def apply_compute_type(model: nn.Module, compute_type: str) -> nn.Module:
    """`converted(model, compute_type)`: the name the benchmarks and older code use."""
    return converted(model, compute_type)


__all__ = [
    "AUTO_COMPUTE_TYPES", "COMPUTE_TYPES", "Int8Linear", "apply_compute_type", "compute_type_of", "converted",
    "hardware_class", "resolve_compute_type",
]  # fmt: skip
