"""What the hardware decides (`vaswani_mt.system.native_bf16`): the precision and attention kernel trained with,
the float32 fallback, and the process-wide settings (malloc, threads), each applied in one visible place.

None of it changes what the model computes, only how fast or in which precision; `--auto_bf16`'s float32 fallback
(`--float32_overrides`) also trains another shape or batch where bf16 would be emulated, as float32 is much slower.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch

from vaswani_mt.system import native_bf16, retain_freed_memory

if TYPE_CHECKING:  # annotations only: importing this module imports neither the options nor datasets
    from transformers import Seq2SeqTrainingArguments

    from .arguments import DataArguments, ModelArguments, RecipeArguments

logger = logging.getLogger(__name__)

ATTENTION_IMPLEMENTATIONS = ("auto", "sdpa", "eager")


def check_launch_has_gpus(recipe: RecipeArguments) -> None:
    """Raises, in one line, where a launcher started several processes (`accelerate launch --multi_gpu`, torchrun:
    WORLD_SIZE > 1) on a machine where torch sees no GPU and the options do not say `--use_cpu`: the processes
    would train on the CPU, unannounced. The launcher has started them by then: this is their first check, before
    any data is read (accelerate never looks at its own --multi_gpu's GPUs)."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or "use_cpu" in recipe.from_command_line | recipe.from_config_file:
        return
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") or torch.cuda.is_available():
        return
    raise ValueError(
        "several processes (accelerate launch --multi_gpu, torchrun) on a machine with no GPU that torch can use: "
        "add --use_cpu to the script's options for CPU processes (gloo)"
    )


def resolve_precision(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """Applies `--auto_bf16`, and warns when `--bf16` is asked for on a CPU that would emulate it."""
    if training_args.fp16:
        return
    native = native_bf16()
    if recipe.auto_bf16 and not training_args.bf16:
        if native:  # what TrainingArguments.__post_init__ derives from --bf16, which has already run
            training_args.bf16, training_args.mixed_precision = True, "bf16"
        logger.info("--auto_bf16: %s", "bf16 autocast (native bf16 here)" if native else "float32 (no native bf16)")
    elif training_args.bf16 and not native:
        logger.warning(
            "--bf16 on hardware without native bf16 (no AVX512-BF16 or AMX on this CPU): the products are emulated "
            "and likely slower than float32; --bf16 false or --auto_bf16 true avoids that"
        )


def apply_float32_overrides(
    recipe: RecipeArguments, model_args: ModelArguments, data_args: DataArguments, training_args
) -> dict:
    """Where `--auto_bf16` found no native bf16 (after `resolve_precision`), sets each option of
    `recipe.float32_overrides` (checked by `arguments.float32_overrides`) on the model or data arguments.
    Returns what it replaced, `{option: (before, after)}`; nothing where training runs in bf16 or fp16."""
    if not recipe.auto_bf16 or training_args.bf16 or training_args.fp16:
        return {}
    replaced = {}
    for name, value in (recipe.float32_overrides or {}).items():
        if name == "preset" and model_args.model_name_or_path:
            continue  # a saved model keeps its shape
        target = model_args if hasattr(model_args, name) else data_args
        replaced[name] = (getattr(target, name), value)
        setattr(target, name, value)
    if replaced:
        logger.info("--float32_overrides (float32 here): %s",
                    ", ".join(f"{k} {old} -> {new}" for k, (old, new) in replaced.items()))  # fmt: skip
    return replaced


def auto_attention(device_type: str, bf16: bool) -> str:
    """What `--attn_implementation auto` picks for training: eager on a CPU under bf16 autocast, sdpa elsewhere."""
    return "eager" if device_type == "cpu" and bf16 else "sdpa"


def resolve_attention(model_args: ModelArguments, training_args: Seq2SeqTrainingArguments) -> str:
    """Applies `--attn_implementation auto` (after `resolve_precision`) and returns the implementation trained with.

    On a CPU under bf16 autocast eager attention trains faster than torch's CPU flash-attention kernel, whose
    backward pass dominates at short sentences; in float32 they are close (benchmarks/RESULTS.md, eager attention).
    On a GPU, sdpa. Both compute Eq. (1) and give equal outputs, so the choice changes speed only.
    """
    choice = model_args.attn_implementation
    if choice not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"--attn_implementation must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, got {choice!r}")
    if choice == "auto":
        choice = auto_attention(training_args.device.type, training_args.bf16)
        logger.info("--attn_implementation auto: %s", choice)
    model_args.attn_implementation = choice
    return choice


def configure_process(recipe: RecipeArguments) -> None:
    """The process-wide settings training makes, in one place: malloc keeps freed memory (`--retain_freed_memory`,
    `vaswani_mt.system.allocator`). Threads: torch's default (one per core); see `use_every_core`."""
    if recipe.retain_freed_memory:
        retain_freed_memory()


def use_every_core(training_args: Seq2SeqTrainingArguments) -> None:
    """After DDP training on a CPU (one thread per rank), the averaging and the test translation on rank 0 take
    every core."""
    if training_args.world_size > 1 and training_args.device.type == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)


def precision_name(training_args: Seq2SeqTrainingArguments) -> str:
    if training_args.bf16:
        return "bf16 autocast (float32 weights, optimizer and loss)"
    if training_args.fp16:
        return "fp16 mixed precision"
    return "float32"


def hardware_name() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


__all__ = [
    "apply_float32_overrides",
    "auto_attention",
    "check_launch_has_gpus",
    "configure_process",
    "hardware_name",
    "precision_name",
    "resolve_attention",
    "resolve_precision",
    "use_every_core",
]
