"""VaswaniTrainer with token-budget batches: a few optimizer steps that record the batches training really got.

Run as `python tests/ddp_budget_worker.py OUT ACCUMULATION` (one process) or with
`accelerate launch --multi_gpu --num_processes 2 tests/ddp_budget_worker.py OUT ACCUMULATION --use_cpu`
(2 processes). Every rank writes OUT/rank{R}.json: the row ids of each micro-batch `training_step` received (the
first source token of row i is 4 + i), its padded shapes and real token counts, and the Trainer's log history.
tests/training/test_trainer.py imports `budget_dataset`, `train_with_budget` and `BUDGET` from here.
"""

import json
import random
import sys
from pathlib import Path

from conftest import PaddingOnlyTokenizer, make_model, one_sgd_step_arguments
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq

from vaswani_mt.training.trainer import VaswaniTrainer

BUDGET = 40  # padded tokens per batch and side
PAIRS = 40  # with these lengths and the seed: 10 batches, an even count, so 2 ranks share the 1-process batch list


def budget_dataset(count: int = PAIRS, seed: int = 0) -> Dataset:
    """Pairs of 2-12 source and target tokens (ending in EOS) with their lengths; row i's first source token is
    4 + i, so a batch names its rows."""
    rng = random.Random(seed)
    rows = {"input_ids": [], "labels": [], "source_length": [], "target_length": []}
    for i in range(count):
        source, target = rng.randint(2, 12), rng.randint(2, 12)
        rows["input_ids"].append([4 + i, *(rng.randrange(4, 200) for _ in range(source - 2)), 2])
        rows["labels"].append([*(rng.randrange(4, 200) for _ in range(target - 1)), 2])
        rows["source_length"].append(source)
        rows["target_length"].append(target)
    return Dataset.from_dict(rows)


class RecordingTrainer(VaswaniTrainer):
    """Notes what each `training_step` receives: the micro-batches the training DataLoader delivered."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.micro_batches: list[dict] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.micro_batches.append(
            {
                "step": self.state.global_step + 1,  # the optimizer step this micro-batch belongs to
                "rows": (inputs["input_ids"][:, 0] - 4).tolist(),
                "source_shape": list(inputs["input_ids"].shape),
                "target_shape": list(inputs["labels"].shape),
                "source_tokens": int(inputs["attention_mask"].sum()),
                "target_tokens": int(inputs["labels"].ne(-100).sum()),
            }
        )
        return super().training_step(model, inputs, num_items_in_batch)


def train_with_budget(output_dir, accumulation: int, max_steps: int, use_cpu: bool = True) -> dict:
    """Trains the tiny model (no dropout: every process computes the same numbers) for `max_steps` optimizer steps
    on `budget_dataset()` under `BUDGET`; returns what this process saw and logged."""
    model = make_model(seed=0, dropout=0.0)
    # per device 1 is not used: the token budget makes the batches
    args = one_sgd_step_arguments(output_dir, 1, accumulation, use_cpu, max_steps=max_steps, learning_rate=0.1, seed=3)
    trainer = RecordingTrainer(
        model=model,
        args=args,
        train_dataset=budget_dataset(),
        data_collator=DataCollatorForSeq2Seq(PaddingOnlyTokenizer(), label_pad_token_id=-100),
        max_tokens_per_batch=BUDGET,
        lr_schedule="trainer",
    )
    trainer.train()
    result = {
        "world_size": args.world_size,
        "rank": args.process_index,
        "sampler_len": len(trainer.token_sampler),
        "micro_batches": trainer.micro_batches,
        "log_history": trainer.state.log_history,
    }
    trainer.leave_process_group()  # as run_training does on every rank, so that no rank aborts at exit
    return result


if __name__ == "__main__":
    out, accumulation = Path(sys.argv[1]), int(sys.argv[2])
    max_steps = int(sys.argv[3]) if len(sys.argv) > 3 and not sys.argv[3].startswith("--") else 6
    result = train_with_budget(out, accumulation, max_steps, use_cpu="--use_cpu" in sys.argv)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{result['rank']}.json").write_text(json.dumps(result))
