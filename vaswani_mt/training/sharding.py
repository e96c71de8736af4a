"""The paper's model sharded with torch's FSDP2 (`fully_shard`), the tied matrix of §3.4 included.

Under `accelerate launch --use_fsdp --fsdp_version 2` (GPUs) accelerate shards the model itself: it puts the input
embedding and the pre-softmax layer in one group, which covers both embeddings once the encoder and decoder use the
`shared` module itself (`share_embedding_module`, which VaswaniTrainer calls under FSDP). accelerate refuses FSDP on
CPU processes, so this module gives the same layout with torch's `fully_shard` directly (the CPU test,
tests/fsdp_worker.py, runs it on 2 gloo ranks), and what a sharded run needs around it:

- `shard_model`: one group per encoder and decoder layer, one for the shared matrix with its two users (the embedding
  module and `lm_head`), the root for the rest; the shared matrix is sharded once and gathered before each use.
- `save_sharded` / `load_sharded`: the model's and the optimizer's shards with torch.distributed.checkpoint (DCP),
  each rank its own; a resumed run goes on bit-exact.
- `save_pretrained_from_sharded`: the whole weights gathered to rank 0, written as the ordinary `save_pretrained`
  folder (the tied copies left out, as always).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def share_embedding_module(model) -> None:
    """The encoder and decoder made to use the `shared` embedding module itself, not modules of their own holding
    the same matrix: FSDP2 keeps a shared parameter in one group, which must then hold every module that reads it;
    accelerate's FSDP2 layout groups the input embedding (`shared`) with `lm_head`, and the stacks' own modules would
    be outside it. The weights, the state dict's keys and the saved folder stay as they are."""
    inner = model.model
    inner.encoder.embed_tokens = inner.decoder.embed_tokens = inner.shared


def shard_model(model, mesh=None, reshard_after_forward: bool = True, param_dtype: torch.dtype | None = None):
    """Shards `model` (a `VaswaniForConditionalGeneration`) in place with FSDP2 and returns it.

    Each encoder and decoder layer is a group; the shared matrix is one group of its users, the embedding module
    (both stacks call it) and `lm_head`; the root holds the rest (the positional tables, any LayerNorm outside the
    layers). `mesh`: a 1-D DeviceMesh (default: every rank of the default group, on this device type).

    `param_dtype` (torch.bfloat16, say): the weights the forward and backward use, cast once per step as they are
    gathered (FSDP2's `MixedPrecisionPolicy`), instead of at every use as autocast does; the optimizer keeps the
    float32 weights, and the gradients are reduced in float32."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward, "mp_policy": policy}
    for stack in (model.model.encoder, model.model.decoder):
        for layer in stack.layers:
            fully_shard(layer, **kwargs)
    share_embedding_module(model)
    fully_shard([model.get_input_embeddings(), model.lm_head], **kwargs)
    fully_shard(model, mesh=mesh, mp_policy=policy)  # the root keeps its few parameters gathered through the step
    return model


def save_sharded(folder: str | Path, model, optimizer=None) -> None:
    """Every rank writes its shards of the model (and the optimizer's state) to `folder` (DCP)."""
    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
    else:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
    dcp.save(state, checkpoint_id=str(folder))


def load_sharded(folder: str | Path, model, optimizer=None) -> None:
    """Loads what `save_sharded` wrote into the sharded `model` (and `optimizer`), on every rank."""
    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=str(folder))
        set_state_dict(model, (), model_state_dict=state["model"], optim_state_dict={})
        return
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def save_pretrained_from_sharded(model, folder: str | Path) -> None:
    """The whole weights of the sharded `model` gathered to rank 0 (on the CPU), loaded into an unsharded model of
    the same config and written by `save_pretrained`; every rank must call it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    if dist.get_rank() == 0:
        plain = next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))
        copy = plain(model.config)
        copy.load_state_dict(state, strict=False)
        copy.save_pretrained(folder)
    dist.barrier()


__all__ = ["load_sharded", "save_pretrained_from_sharded", "save_sharded", "shard_model", "share_embedding_module"]
