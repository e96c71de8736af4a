"""bf16 weights for the forward and backward, float32 weights for Adam: `--bf16_weights` (issue 64).

Under bf16 autocast alone every matrix product casts its float32 weight to bf16 in each forward (once per micro-batch).
Here the model's parameters stay float32: they are what Adam updates, and what checkpoints, averaging (§6.1) and
`save_pretrained` see, as fairseq's FP16Optimizer keeps float32 master weights beside the half-precision ones
(Micikevicius et al. 2018). The forward and backward run on bf16 copies made once per optimizer step, and each copy's
gradient is added into its parameter's float32 gradient as soon as it is computed, so micro-batches accumulate in
float32. Without `--bf16` the whole step runs in bf16 (no activation casts either); with it, autocast still runs its
float32 operations (LayerNorm, softmax) in float32.

One process only: DDP reduces the gradients of the parameters it wraps, which these copies bypass; under FSDP the
same is FSDP's `MixedPrecisionPolicy(param_dtype=torch.bfloat16)` (training/sharding.py, accelerate's mixed precision).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.func import functional_call


def _add_to_master(master: torch.Tensor, copy: torch.Tensor) -> None:
    """The bf16 copy's gradient moved into its float32 parameter's (a post-accumulate-grad hook of the copy)."""
    grad = copy.grad.to(master.dtype)
    if master.grad is None:
        master.grad = grad
    else:
        master.grad.add_(grad)
    copy.grad = None


class Bf16Weights:
    """bf16 copies of `model`'s floating parameters, for the forward and backward of training.

    `bind(model, step)` returns `model` as a callable that runs on the copies, recast from the float32 parameters
    when `step` (the optimizer step) has changed since the last cast; `casts` counts the casts."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16):
        self._copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for param in model.parameters():  # a tied matrix (§3.4) once
            if not param.is_floating_point():
                continue
            copy = param.detach().to(dtype).requires_grad_(param.requires_grad)
            if param.requires_grad:
                copy.register_post_accumulate_grad_hook(partial(_add_to_master, param))
            self._copies[id(param)] = (param, copy)
        self._cast_at: int | None = None
        self.casts = 0

    def _cast(self) -> None:
        with torch.no_grad():
            for param, copy in self._copies.values():
                copy.copy_(param)
        self.casts += 1

    def bind(self, model: nn.Module, step: int) -> Callable[..., object]:
        """`model` (or a wrapper of it, a compiled module, say) called with the bf16 copies as its parameters."""
        if self._cast_at != step:
            self._cast()
            self._cast_at = step
        tensors = {}
        for name, param in model.named_parameters(remove_duplicate=False):  # every name of a tied matrix
            entry = self._copies.get(id(param))
            if entry is None:
                raise ValueError(f"--bf16_weights: parameter {name} was not in the model when its copies were made")
            tensors[name] = entry[1]
        return lambda *args, **kwargs: functional_call(model, tensors, args, kwargs)


__all__ = ["Bf16Weights"]
