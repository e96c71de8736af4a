"""§5.1 batching: "sentence pairs were batched together by approximate sequence length", each batch holding about
a fixed number of source and target tokens, instead of a fixed number of sentences.

Nothing in transformers does this (its samplers fix the number of sentences), so `TokenBudgetBatchSampler` is
a `torch.utils.data.Sampler` of index lists that the Trainer's DataLoader takes as its `batch_sampler`.

At WMT scale (4.5M pairs) it holds two arrays, not Python lists: the pairs in batch order and where each batch
starts; `length_array` reads a length column of a `datasets.Dataset` as one array (through Arrow, not row by row).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler


def length_array(dataset, column: str) -> np.ndarray:
    """`dataset[column]` as a numpy array, read through Arrow: milliseconds for millions of rows, where the
    row-by-row `Column` of `datasets` takes a minute (and 20 s once a filter has left an indices mapping)."""
    table_column = dataset.data.column(column)
    indices = getattr(dataset, "_indices", None)  # the mapping `select`/`filter` leave; None when there is none
    if indices is not None:
        table_column = table_column.take(indices.column(0))
    return table_column.to_numpy()


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of pairs of similar length whose padded size stays within `max_tokens` on each side.

    A batch of `n` pairs costs `n * longest source` source tokens and `n * longest target` target tokens (with
    padding, which is what the hardware computes); both must be `<= max_tokens`, as fairseq's `--max-tokens`.

    Pairs are shuffled once with `seed`, stably sorted by length and cut greedily into batches under the budget;
    the batches stay the same for the whole run (as in fairseq), so every epoch has the same number of steps and a
    resumed run knows where it is. Each epoch shuffles the order of the batches. Every pair is used exactly once
    per epoch. With `num_replicas > 1` (DDP) every rank computes the same global batch list from `seed` and `epoch`
    and takes every `num_replicas`-th batch, so ranks see distinct batches; the list is first made a multiple of
    `num_replicas` long by halving the largest batches, so every rank runs the same number of steps.
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        if len(source_lengths) != len(target_lengths):
            raise ValueError(f"{len(source_lengths)} source lengths but {len(target_lengths)} target lengths")
        if len(source_lengths) == 0:
            raise ValueError("no pairs to batch")
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside [0, num_replicas={num_replicas})")
        self.source_lengths = np.asarray(source_lengths, dtype=np.int64)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int64)
        longest = np.maximum(self.source_lengths, self.target_lengths)
        too_long = int(longest.argmax())
        if longest[too_long] > max_tokens:
            raise ValueError(
                f"pair {too_long} has {int(longest[too_long])} tokens on one side, more than max_tokens={max_tokens}: "
                "raise the budget or filter long pairs"
            )
        if len(source_lengths) < num_replicas:
            raise ValueError(f"{len(source_lengths)} pairs cannot give every one of {num_replicas} ranks a batch")
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._order, self._starts = self._make_batches(longest)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _make_batches(self, longest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The batches, fixed for the whole run so that every epoch has the same number of steps: the pairs in
        batch order, and the `len + 1` offsets where the batches start and the last one ends."""
        generator = torch.Generator().manual_seed(self.seed)
        count = len(longest)
        order = torch.randperm(count, generator=generator) if self.shuffle else torch.arange(count)
        key = torch.from_numpy(longest)[order]
        order = order[torch.sort(key, stable=True).indices].numpy()
        key = longest[order]  # ascending: a batch's widest pair is its last, so its padded size is len x key[last]

        # Greedy, as fairseq: a batch takes pairs while (pairs + 1) x the new widest pair's length fits the budget.
        # (n - start + 1) x key[n] grows with n, so where each batch ends is a binary search.
        starts = [0]
        while starts[-1] < count:
            start = starts[-1]
            end = bisect.bisect_right(range(start, count), self.max_tokens, key=lambda n: (n - start + 1) * key[n])
            starts.append(start + max(end, 1))

        while (len(starts) - 1) % self.num_replicas:  # equal steps on every rank, no pair repeated or dropped
            sizes = np.diff(starts)
            largest = int(sizes.argmax())  # the first of the largest, as max() picks
            starts.insert(largest + 1, starts[largest] + int(sizes[largest]) // 2)
        return order, np.asarray(starts, dtype=np.int64)

    def _batch(self, index: int) -> list[int]:
        return self._order[self._starts[index] : self._starts[index + 1]].tolist()

    def batch_order(self) -> np.ndarray:
        """The indices of all ranks' batches in the order the current epoch consumes them (shuffled per epoch)."""
        count = len(self._starts) - 1
        if not self.shuffle:
            return np.arange(count)
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch + 1)
        return torch.randperm(count, generator=generator).numpy()

    def global_batches(self) -> list[list[int]]:
        """All ranks' batches of the current epoch, in the order they are consumed (shuffled per epoch)."""
        return [self._batch(b) for b in self.batch_order()]

    def __iter__(self) -> Iterator[list[int]]:
        for b in self.batch_order()[self.rank :: self.num_replicas]:
            yield self._batch(int(b))

    def __len__(self) -> int:
        return (len(self._starts) - 1) // self.num_replicas

    def batch_tokens(self, batch: Sequence[int]) -> tuple[int, int]:
        """Padded (source, target) token counts of a batch."""
        index = np.asarray(batch, dtype=np.int64)
        size = len(batch)
        return size * int(self.source_lengths[index].max()), size * int(self.target_lengths[index].max())


__all__ = ["TokenBudgetBatchSampler", "length_array"]
