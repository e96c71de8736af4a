"""One SGD step of VaswaniTrainer on a fixed global batch of 4 pairs with unequal token counts.

Run as `python tests/ddp_worker.py OUT 4` (one process, batch 4) or with
`accelerate launch --multi_gpu --num_processes 2 tests/ddp_worker.py OUT 2 --use_cpu` (2 processes x batch 2).
Rank 0 writes the logged loss and the updated weights to OUT.
"""

import json
import sys

import torch
from conftest import PaddingOnlyTokenizer, make_model, one_sgd_step_arguments, uneven_pairs
from safetensors.torch import save_file
from transformers import DataCollatorForSeq2Seq

from vaswani_mt.training.trainer import VaswaniTrainer

out, per_device = sys.argv[1], int(sys.argv[2])
rows = uneven_pairs()
model = make_model(seed=0, dropout=0.0)  # tests/training/test_trainer.py checks the step moved it from there
args = one_sgd_step_arguments(out, per_device, use_cpu="--use_cpu" in sys.argv)


trainer = VaswaniTrainer(
    model=model,
    args=args,
    train_dataset=rows,
    data_collator=DataCollatorForSeq2Seq(PaddingOnlyTokenizer(), label_pad_token_id=-100),
    max_tokens_per_batch=None,
    lr_schedule="trainer",
)
trainer.train()
trainer.leave_process_group()  # what run_training does on every rank; without it 1 exit in 4 aborted
if trainer.is_world_process_zero():
    loss = next(row["loss"] for row in trainer.state.log_history if "loss" in row)
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items() if "embed_tokens" not in k}
    weights.pop("lm_head.weight")
    save_file(weights, f"{out}/weights.safetensors")
    with open(f"{out}/result.json", "w") as f:
        left = not torch.distributed.is_initialized()
        json.dump({"loss": loss, "world_size": args.world_size, "group_left": left}, f)
