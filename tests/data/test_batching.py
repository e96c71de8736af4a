import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from ddp_budget_worker import BUDGET, budget_dataset, train_with_budget

from vaswani_mt.data.batching import TokenBudgetBatchSampler

ACCELERATE = str(Path(sys.executable).parent / "accelerate")


def _lengths(count=2000, seed=0):
    rng = random.Random(seed)
    return [rng.randint(2, 60) for _ in range(count)], [rng.randint(2, 60) for _ in range(count)]


def test_budget_respected_on_both_sides_with_padding():
    src, tgt = _lengths()
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=500)
    for batch in sampler:
        longest_src, longest_tgt = max(src[i] for i in batch), max(tgt[i] for i in batch)
        assert len(batch) * longest_src <= 500 and len(batch) * longest_tgt <= 500
    # and the batches are full: approximate-length grouping wastes little
    used = sum(max(sampler.batch_tokens(b)) for b in sampler)
    assert used > 0.85 * 500 * len(sampler)


def test_every_pair_used_exactly_once_per_epoch_and_order_changes_between_epochs():
    src, tgt = _lengths()
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=400, seed=1)
    first = list(sampler)
    assert sorted(i for b in first for i in b) == list(range(2000))
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(i for b in second for i in b) == list(range(2000))
    assert first != second and len(first) == len(second)
    sampler.set_epoch(0)
    assert list(sampler) == first  # the same epoch gives the same order (resume)


def test_similar_lengths_share_a_batch():
    src, tgt = _lengths()
    key = [max(s, t) for s, t in zip(src, tgt, strict=True)]  # what the padded size depends on
    spreads = [max(key[i] for i in b) - min(key[i] for i in b) for b in TokenBudgetBatchSampler(src, tgt, 800)]
    assert sum(spreads) / len(spreads) < 3  # vs about 45 for random batches of these lengths


@pytest.mark.parametrize("world", [2, 3, 8])
def test_ranks_get_distinct_batches_and_equal_counts(world):
    src, tgt = _lengths(1001)
    samplers = [TokenBudgetBatchSampler(src, tgt, 300, seed=5, num_replicas=world, rank=r) for r in range(world)]
    per_rank = [list(s) for s in samplers]
    assert len({len(batches) for batches in per_rank}) == 1
    assert all(len(s) == len(per_rank[0]) for s in samplers)
    indices = [i for batches in per_rank for b in batches for i in b]
    assert sorted(indices) == list(range(1001))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="max_tokens=10"):
        TokenBudgetBatchSampler([5, 20], [5, 5], max_tokens=10)
    with pytest.raises(ValueError, match="lengths"):
        TokenBudgetBatchSampler([5], [5, 5], max_tokens=10)
    with pytest.raises(ValueError, match="rank 2"):
        TokenBudgetBatchSampler([5, 5], [5, 5], max_tokens=10, num_replicas=2, rank=2)


# ---------------------------------------------------------------------------------------------------------------
# The sampler inside VaswaniTrainer: what training really receives, alone and under 2-process DDP
# (tests/ddp_budget_worker.py records every micro-batch `training_step` gets and the logged token counts).

ROOT = Path(__file__).resolve().parents[2]
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def test_two_cpu_ranks_get_distinct_whole_budget_batches_and_match_one_process_with_accumulation(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 ... --use_cpu` with the token budget: rank r trains on global
    batches r, r + 2, r + 4, ... of the sampler's order, each whole (accelerate does not shard them again), across
    an epoch boundary; the logged tokens per step are both ranks' real tokens; and one process with 2 accumulation
    steps over the same global batches logs the same tokens and the same loss at every step."""
    steps = 7  # 5 steps per epoch on each rank: 2 steps into the second epoch
    double = tmp_path / "double"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    launch = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--main_process_port", str(_free_port()), "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += [str(ROOT / "tests" / "ddp_budget_worker.py"), str(double), "1", str(steps), "--use_cpu"]
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
