"""§5.1 batching: "sentence pairs were batched together by approximate sequence length", each batch holding about
a fixed number of source and target tokens, instead of a fixed number of sentences.

Nothing in transformers does this (its samplers fix the number of sentences), so `TokenBudgetBatchSampler` is
a `torch.utils.data.Sampler` of index lists that the Trainer's DataLoader takes as its `batch_sampler`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler


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
        self.source_lengths = torch.as_tensor(source_lengths, dtype=torch.long)
        self.target_lengths = torch.as_tensor(target_lengths, dtype=torch.long)
        longest = torch.maximum(self.source_lengths, self.target_lengths)
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
        self._batches = self._make_batches()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _make_batches(self) -> list[list[int]]:
        """The batches, fixed for the whole run so that every epoch has the same number of steps."""
        generator = torch.Generator().manual_seed(self.seed)
        count = len(self.source_lengths)
        order = torch.randperm(count, generator=generator) if self.shuffle else torch.arange(count)
        key = torch.maximum(self.source_lengths, self.target_lengths)[order]
        order = order[torch.sort(key, stable=True).indices].tolist()

        batches, current, longest_source, longest_target = [], [], 0, 0
        for index in order:
            source, target = int(self.source_lengths[index]), int(self.target_lengths[index])
            new_source, new_target = max(longest_source, source), max(longest_target, target)
            if current and (len(current) + 1) * max(new_source, new_target) > self.max_tokens:
                batches.append(current)
                current, new_source, new_target = [], source, target
            current.append(index)
            longest_source, longest_target = new_source, new_target
        batches.append(current)

        while len(batches) % self.num_replicas:  # equal steps on every rank, no pair repeated or dropped
            largest = max(range(len(batches)), key=lambda i: len(batches[i]))
            half = len(batches[largest]) // 2
            batches[largest : largest + 1] = [batches[largest][:half], batches[largest][half:]]
        return batches

    def global_batches(self) -> list[list[int]]:
        """All ranks' batches of the current epoch, in the order they are consumed (shuffled per epoch)."""
        if not self.shuffle:
            return self._batches
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch + 1)
        return [self._batches[i] for i in torch.randperm(len(self._batches), generator=generator).tolist()]

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.global_batches()[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        return len(self._batches) // self.num_replicas

    def batch_tokens(self, batch: Sequence[int]) -> tuple[int, int]:
        """Padded (source, target) token counts of a batch."""
        index = torch.as_tensor(batch)
        size = len(batch)
        return size * int(self.source_lengths[index].max()), size * int(self.target_lengths[index].max())


__all__ = ["TokenBudgetBatchSampler"]
