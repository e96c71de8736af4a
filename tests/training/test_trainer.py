"""The Trainer of the recipe (`vaswani_mt.training.trainer`): Eq. (3) and the paper's Adam, the loss and the update
under 2-process DDP, and the token-budget batches training really receives (tests/ddp_worker.py and
tests/ddp_budget_worker.py run it, in this process or under `accelerate launch`)."""

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
from conftest import accelerate_launch, make_model, one_torch_thread, rng_kept
from ddp_budget_worker import BUDGET, budget_dataset, train_with_budget
from safetensors.torch import load_file

from vaswani_mt.data.batching import TokenBudgetBatchSampler
from vaswani_mt.training.arguments import parse_args
from vaswani_mt.training.trainer import VaswaniTrainer, paper_learning_rate

pytestmark = pytest.mark.transformers_internals

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


# ---------------------------------------------------------------------------------------------------------------
# Eq. (3) and Adam


def test_learning_rate_at_step_1_warmup_and_100000():
    d, w = 512, 4000
    assert paper_learning_rate(1, d, w) == pytest.approx(512**-0.5 * 4000**-1.5)  # not zero on the first update
    assert paper_learning_rate(4000, d, w) == pytest.approx((512 * 4000) ** -0.5)  # the peak, 6.99e-4
    assert paper_learning_rate(4000, d, w) == pytest.approx(6.9877e-4, rel=1e-4)
    assert paper_learning_rate(100_000, d, w) == pytest.approx(512**-0.5 * 100_000**-0.5)
    assert paper_learning_rate(4001, d, w) < paper_learning_rate(4000, d, w) > paper_learning_rate(3999, d, w)
    assert paper_learning_rate(10, d, w, scale=2.0) == pytest.approx(2 * paper_learning_rate(10, d, w))


def test_trainer_uses_the_papers_schedule_and_adam(tmp_path, restore_rng):
    model = make_model(d_model=512, num_heads=8)  # Eq. (3) reads d_model from the config
    args_tuple = parse_args(["--output_dir", str(tmp_path), "--report_to", "none"])
    training_args = args_tuple[3]
    trainer = VaswaniTrainer(model=model, args=training_args, lr_schedule="paper")
    trainer.create_optimizer_and_scheduler(num_training_steps=200_000)
    optimizer, scheduler = trainer.optimizer, trainer.lr_scheduler
    group = optimizer.param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.98), 1e-9, 0.0)
    assert group["lr"] == pytest.approx(paper_learning_rate(1, 512, 4000))  # the lr the first update uses
    for step in (4000, 100_000):  # lr used by update `step` = after step - 1 scheduler steps
        assert scheduler.lr_lambdas[0](step - 1) == pytest.approx(paper_learning_rate(step, 512, 4000))
    # --lr_scale multiplies Eq. (3); the Trainer's --learning_rate (its default 5e-5 here) plays no part in it
    scaled = VaswaniTrainer(model=model, args=training_args, lr_schedule="paper", lr_scale=2.0)
    scaled.create_optimizer_and_scheduler(num_training_steps=200_000)
    assert scaled.optimizer.param_groups[0]["lr"] == pytest.approx(2 * paper_learning_rate(1, 512, 4000))
    with pytest.raises(ValueError, match="above 0"):
        VaswaniTrainer(model=model, args=training_args, lr_scale=0.0)


# ---------------------------------------------------------------------------------------------------------------
# The loss under DDP


def test_two_process_ddp_gives_the_same_loss_and_update_as_one_process(tmp_path):
    """Micro-batches of unequal token counts: the global mean must not become a mean of per-rank means."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    worker = str(ROOT / "tests" / "ddp_worker.py")
    single, double = tmp_path / "single", tmp_path / "double"
    with rng_kept(), one_torch_thread(), patch.object(sys, "argv", [worker, str(single), "4", "--use_cpu"]):
        runpy.run_path(worker, run_name="__main__")  # one process: this one
    launch = accelerate_launch(worker, str(double), "2", "--use_cpu")
    result = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = (json.loads((d / "result.json").read_text()) for d in (single, double))
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert two["group_left"]  # leave_process_group closed the group (an open one made 1 exit in 4 abort)
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    a, b = load_file(single / "weights.safetensors"), load_file(double / "weights.safetensors")
    start = make_model(dropout=0.0).state_dict()  # the workers' model before its step
    assert a.keys() == b.keys() and a.keys() <= start.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=1e-5, msg=key)
    moved = [key for key in a if not torch.allclose(a[key], start[key])]
    assert "model.decoder.layers.0.ffn.fc1.weight" in moved  # the step changed the weights: an update to compare


# ---------------------------------------------------------------------------------------------------------------
# The token-budget sampler inside VaswaniTrainer: what training really receives, alone and under 2-process DDP
# (tests/ddp_budget_worker.py records every micro-batch `training_step` gets and the logged token counts).

SEED = 3  # the worker's --seed, which the sampler takes (no --data_seed)


def _global_order(num_replicas: int = 1, epochs: int = 2) -> list[list[int]]:
    """The sampler's global batch order over `epochs` epochs, for the worker's data."""
    data = budget_dataset()
    sampler = TokenBudgetBatchSampler(data["source_length"], data["target_length"], BUDGET, seed=SEED,
                                      num_replicas=num_replicas)  # fmt: skip
    order = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order += sampler.global_batches()
    return order


def _logged(history: list[dict]) -> list[dict]:
    return [row for row in history if "loss" in row]


def _check_micro_batch(micro: dict, batch: list[int]) -> None:
    """A delivered micro-batch is the sampler's batch, whole and in order, padded to its own longest pair."""
    data = budget_dataset()
    assert micro["rows"] == batch
    sources = [data[i]["source_length"] for i in batch]
    targets = [data[i]["target_length"] for i in batch]
    assert micro["source_shape"] == [len(batch), max(sources)] and micro["target_shape"] == [len(batch), max(targets)]
    assert len(batch) * max(sources) <= BUDGET and len(batch) * max(targets) <= BUDGET  # the budget, padded
    assert (micro["source_tokens"], micro["target_tokens"]) == (sum(sources), sum(targets))  # real tokens


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory) -> dict:
    """One process, 3 micro-batches per optimizer step, 6 steps on the worker's 10 budget batches per epoch."""
    with rng_kept():  # the Trainer seeds this process's RNGs
        return train_with_budget(tmp_path_factory.mktemp("accumulated"), accumulation=3, max_steps=6)


# transformers makes ceil(10 / 3) = 4 optimizer steps per epoch, the last of 10 - 9 = 1 micro-batch; then the next
# epoch starts with the sampler's order for epoch 1.
MICRO_PER_STEP = [3, 3, 3, 1, 3, 3]


def test_budget_batches_with_gradient_accumulation_in_one_process(accumulated):
    order = _global_order()
    assert accumulated["sampler_len"] == len(order) // 2 == 10
    micro = accumulated["micro_batches"]
    assert [m["step"] for m in micro] == [step for step, n in enumerate(MICRO_PER_STEP, 1) for _ in range(n)]
    for m, batch in zip(micro, order[: sum(MICRO_PER_STEP)], strict=True):
        _check_micro_batch(m, batch)
    logged = _logged(accumulated["log_history"])
    assert [row["step"] for row in logged] == [1, 2, 3, 4, 5, 6]
    assert logged[3]["epoch"] == 1.0  # step 4 ends epoch 0
    for row in logged:
        if MICRO_PER_STEP[row["step"] - 1] == 3:  # whole steps; the short step 4: the test below
            step_micro = [m for m in micro if m["step"] == row["step"]]
            assert row["source_tokens_per_step"] == sum(m["source_tokens"] for m in step_micro)
            assert row["target_tokens_per_step"] == sum(m["target_tokens"] for m in step_micro)


def test_a_short_last_accumulation_step_logs_its_own_tokens(accumulated):
    short = _logged(accumulated["log_history"])[3]
    (only,) = [m for m in accumulated["micro_batches"] if m["step"] == 4]
    assert (short["source_tokens_per_step"], short["target_tokens_per_step"]) == (
        only["source_tokens"],
        only["target_tokens"],
    )


def test_two_cpu_ranks_get_distinct_whole_budget_batches_and_match_one_process_with_accumulation(tmp_path, restore_rng):
    """`accelerate launch --multi_gpu --num_processes 2 ... --use_cpu` with the token budget: rank r trains on global
    batches r, r + 2, r + 4, ... of the sampler's order, each whole (accelerate does not shard them again), across
    an epoch boundary; the logged tokens per step are both ranks' real tokens; and one process with 2 accumulation
    steps over the same global batches logs the same tokens and the same loss at every step."""
    steps = 7  # 5 steps per epoch on each rank: 2 steps into the second epoch
    double = tmp_path / "double"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    launch = accelerate_launch(str(ROOT / "tests" / "ddp_budget_worker.py"), str(double), "1", str(steps), "--use_cpu")
    result = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((double / f"rank{rank}.json").read_text()) for rank in (0, 1)]

    order = _global_order()
    # 10 batches, an even count: with 2 replicas the sampler halves none, so 1 process sees the same global list
    assert _global_order(num_replicas=2) == order
    for rank, seen in enumerate(ranks):
        assert (seen["world_size"], seen["rank"], seen["sampler_len"]) == (2, rank, 5)
        assert [m["step"] for m in seen["micro_batches"]] == list(range(1, steps + 1))
        for m, batch in zip(seen["micro_batches"], order[rank : 2 * steps : 2], strict=True):
            _check_micro_batch(m, batch)
    first_epoch = [{i for m in seen["micro_batches"][:5] for i in m["rows"]} for seen in ranks]
    assert not first_epoch[0] & first_epoch[1] and first_epoch[0] | first_epoch[1] == set(range(40))

    logged = [_logged(seen["log_history"]) for seen in ranks]
    reduced = ("step", "epoch", "loss", "learning_rate", "source_tokens_per_step", "target_tokens_per_step")
    numbers = [[{key: row[key] for key in reduced} for row in rows] for rows in logged]
    assert numbers[0] == numbers[1]  # every rank logs the same reduced numbers (wall-clock ones differ)
    for row, (a, b) in zip(logged[0], zip(*(seen["micro_batches"] for seen in ranks), strict=True), strict=True):
        assert row["source_tokens_per_step"] == a["source_tokens"] + b["source_tokens"]
        assert row["target_tokens_per_step"] == a["target_tokens"] + b["target_tokens"]

    single = train_with_budget(tmp_path / "single", accumulation=2, max_steps=steps)
    assert single["sampler_len"] == 10
    for m, batch in zip(single["micro_batches"], order[: 2 * steps], strict=True):
        _check_micro_batch(m, batch)
    alone = _logged(single["log_history"])
    assert [row["step"] for row in alone] == list(range(1, steps + 1))
    for one, two in zip(alone, logged[0], strict=True):
        assert one["source_tokens_per_step"] == two["source_tokens_per_step"]
        assert one["target_tokens_per_step"] == two["target_tokens_per_step"]
        assert one["loss"] == pytest.approx(two["loss"], rel=1e-5)
