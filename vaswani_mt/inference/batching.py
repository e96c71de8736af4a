"""Token-budget batches at inference (fairseq's `--max-tokens`, as fairseq-interactive applies it to a buffer of
lines): sentences sorted by length, packed so that a batch's padded size (rows x its longest source, in tokens)
stays within a budget. Short sentences then share large batches and long ones small batches, where fixed-size
batches spend the same number of rows on both.

Not training's `data.batching.TokenBudgetBatchSampler`, which shuffles, budgets both sides, refuses long pairs.
"""

from __future__ import annotations

from collections.abc import Sequence


def token_budget_batches(lengths: Sequence[int], max_tokens: int, max_sentences: int | None = None) -> list[list[int]]:
    """Batches of indices into `lengths` (source tokens per sentence), longest sentences first, each batch's padded
    size `rows * longest <= max_tokens` and at most `max_sentences` rows when that is given. A sentence longer than
    `max_tokens` forms a batch of its own (the caller says so; it is not dropped). Sentences of equal length keep
    their order, so the batches are a function of the lengths alone."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if max_sentences is not None and max_sentences < 1:
        raise ValueError(f"max_sentences must be at least 1, got {max_sentences}")
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True):
        batch = batches[-1] if batches else None
        # Sorted longest first: a batch's first sentence is its longest, so adding one costs `longest` tokens.
        if (
            batch is not None
            and (len(batch) + 1) * lengths[batch[0]] <= max_tokens
            and (max_sentences is None or len(batch) < max_sentences)
        ):
            batch.append(i)
        else:
            batches.append([i])
    return batches


__all__ = ["token_budget_batches"]
