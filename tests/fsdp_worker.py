"""Two steps of the tiny model sharded with FSDP2 on 2 gloo ranks, a sharded checkpoint between them, a resume.

Run as `torchrun --nproc_per_node 2 tests/fsdp_worker.py OUT MODE,...` (tests/training/test_sharding.py), each MODE
in turn into OUT/MODE: `torch` shards with `vaswani_mt.training.sharding.shard_model` (every group resharded after
its forward), `resharded` the same with the shared matrix's group resharded after the decoder (the loss must gather
it), `bf16` the same with bf16 weights gathered for the step (float32 kept by the optimizer), `accelerate` with
accelerate's own FSDP2 layout (`fsdp2_prepare_model`, transformer layers wrapped, as `accelerate launch --use_fsdp
--fsdp_version 2` does on GPUs; accelerate refuses FSDP on CPU processes, so it is called here directly).
Rank r trains on pairs 2r, 2r+1 of `uneven_pairs()` (step 2: the pairs in reverse order), the loss scaled to the
global token mean as Trainer does. Rank 0 writes OUT/MODE/result.json (losses, whether the resumed step is
bit-exact), OUT/MODE/grads.safetensors (step 1's whole gradients) and OUT/MODE/pretrained
(`save_pretrained_from_sharded` after step 2).
"""

import json
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from conftest import PaddingOnlyTokenizer, make_model, uneven_pairs
from safetensors.torch import save_file
from transformers import DataCollatorForSeq2Seq

from vaswani_mt.training.sharding import (
    load_sharded,
    save_pretrained_from_sharded,
    save_sharded,
    shard_model,
    share_embedding_module,
)

root, modes = sys.argv[1], sys.argv[2].split(",")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
collate = DataCollatorForSeq2Seq(PaddingOnlyTokenizer(), label_pad_token_id=-100)


def sharded(seed: int, mode: str):
    model = make_model(seed=seed, dropout=0.0).train()
    if mode in ("torch", "resharded", "bf16"):
        model = shard_model(model, param_dtype=torch.bfloat16 if mode == "bf16" else None)
        if mode == "resharded":  # the shared matrix sharded again before the loss reads it (a torch 2.11 run's case)
            model.model.decoder.register_forward_hook(lambda *_: model.get_input_embeddings().reshard())
    else:
        from accelerate.utils import FullyShardedDataParallelPlugin
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP")
        share_embedding_module(model)  # what VaswaniTrainer does under FSDP, before accelerate prepares the model
        accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no",
                                      is_main_process=rank == 0, device=torch.device("cpu"))  # fmt: skip
        model = fsdp2_prepare_model(accelerator, model)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)


def step(model, optimizer, rows) -> float:
    mine = rows[2 * rank : 2 * rank + 2]
    tokens = sum(len(row["labels"]) for row in rows)  # the whole step's target tokens (every rank's)
    loss = model(**collate(mine), num_items_in_batch=tokens).loss * world  # FSDP averages the gradients
    loss.backward()
    total = loss.detach() / world
    dist.all_reduce(total)
    return float(total)


def run(out: str, mode: str) -> None:
    model, optimizer = sharded(0, mode)
    first = step(model, optimizer, rows)
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    optimizer.step()
    optimizer.zero_grad()
    save_sharded(f"{out}/checkpoint", model, optimizer)
    second = step(model, optimizer, rows[::-1])
    optimizer.step()
    after = {name: p.detach().to_local().clone() for name, p in model.named_parameters()}
    save_pretrained_from_sharded(model, f"{out}/pretrained")

    resumed, resumed_optimizer = sharded(1, mode)  # other weights: all of them must come from the checkpoint
    load_sharded(f"{out}/checkpoint", resumed, resumed_optimizer)
    again = step(resumed, resumed_optimizer, rows[::-1])
    resumed_optimizer.step()
    exact = all(torch.equal(p.detach().to_local(), after[name]) for name, p in resumed.named_parameters())
    flags = torch.tensor([int(exact)])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    if rank == 0:
        save_file({name: g.contiguous() for name, g in grads.items()}, f"{out}/grads.safetensors")
        with open(f"{out}/result.json", "w") as f:
            json.dump({"losses": [first, second], "resumed_loss": again, "bit_exact": bool(flags.item()),
                       "params": sorted(grads)}, f)  # fmt: skip


rows = uneven_pairs()
for mode in modes:
    run(f"{root}/{mode}", mode)
dist.barrier()
dist.destroy_process_group()
