"""The token-budget batch sampler (§5.1, `vaswani_mt.data.batching`): the budget on both sides, every pair once an
epoch, similar lengths together, distinct batches per rank. What VaswaniTrainer delivers from it, alone and under
DDP: tests/training/test_trainer.py."""

import random

import pytest

from vaswani_mt.data.batching import TokenBudgetBatchSampler


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
