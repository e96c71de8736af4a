"""A supervised alignment head (Garg et al. 2019, "Jointly Learning to Align and Translate", §4.2), as fairseq's
`transformer_align`: one head of the penultimate decoder layer's encoder-decoder attention learns word-alignment
labels (vaswani_mt/data/alignment_labels.py) while the model learns to translate,

    L = L_mt + lambda * mean over linked target tokens i of KL(p_i || a_i),

p_i uniform over the source tokens aligned to target token i, a_i that head's attention at the step that predicts
token i. Garg et al. write the cross-entropy -sum_j p_ij log a_ij; the KL divergence differs from it by the labels'
entropy, a constant, so the gradients are the same and the term is 0 where the head already matches the labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from vaswani_mt.data.alignment_labels import symmetrized_links, token_links
from vaswani_mt.data.corpus import cache_dir
from vaswani_mt.data.words import token_words

ALIGNMENT_LAMBDA = 0.05  # Garg et al.'s lambda


def penultimate_head(num_decoder_layers: int) -> tuple[int, int]:
    """(layer, head) that Garg et al. supervise: head 0 of the penultimate decoder layer (layer 0 of a 1-layer
    decoder)."""
    return max(num_decoder_layers - 2, 0), 0


def alignment_targets(pairs: Sequence[Sequence[int]], target_length: int, source_length: int,
                      source_offsets: Sequence[int] | None = None) -> torch.Tensor:  # fmt: skip
    """(batch, target_length, source_length) label distributions from each example's flat (target token, source
    token) positions `[t0, s0, t1, s1, ...]`: row t uniform over its source tokens, all zero without a link.
    `source_offsets`: each example's left padding of the source (0 for right padding)."""
    targets = torch.zeros(len(pairs), target_length, source_length)
    for row, flat in enumerate(pairs):
        if not flat:
            continue
        links = torch.tensor(list(flat), dtype=torch.long).view(-1, 2)
        offset = source_offsets[row] if source_offsets is not None else 0
        keep = (links[:, 0] < target_length) & (links[:, 1] + offset < source_length)
        targets[row, links[keep, 0], links[keep, 1] + offset] = 1.0
    return targets / targets.sum(-1, keepdim=True).clamp(min=1.0)


def alignment_loss(attention: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over target tokens with a link of KL(targets || attention), both (batch, target, source); 0 (with a
    gradient graph) where no token has a link."""
    attention = attention.float()
    linked = targets.sum(-1) > 0
    terms = torch.where(targets > 0, targets * (targets.clamp(min=1e-12).log() - attention.clamp(min=1e-9).log()), 0)
    per_token = terms.sum(-1)
    return (per_token * linked).sum() / linked.sum().clamp(min=1)


def add_alignment_labels(dataset, tokenizer, cache: Path | None = None):
    """`dataset` (tokenized pairs: `input_ids`, `labels`) with an `alignment` column: flat (target token, source
    token) positions, `[t0, s0, t1, s1, ...]`. The texts are the decoded ids (what the model sees); their words are
    aligned by eflomal, symmetrized (`symmetrized_links`) and cached in `cache` (default: next to the dataset's cache
    files; for one held in memory, as the built-in corpus, vaswani_mt's cache folder), and each token is given its
    word by the tokenizer's offsets (`token_words`)."""
    if cache is None and getattr(dataset, "cache_files", None):
        cache = Path(dataset.cache_files[0]["filename"]).parent
    elif cache is None:  # the links are keyed by a hash of the pairs: a resumed run finds its own
        cache = cache_dir() / "alignments"
    source_ids, label_ids = [list(ids) for ids in dataset["input_ids"]], [list(ids) for ids in dataset["labels"]]
    sources = tokenizer.batch_decode(source_ids, skip_special_tokens=True)
    targets = tokenizer.batch_decode(label_ids, skip_special_tokens=True)
    links = symmetrized_links([(s.split(), t.split()) for s, t in zip(sources, targets, strict=True)], cache)
    column = []
    for source, target, ids, labels, row in zip(sources, targets, source_ids, label_ids, links, strict=True):
        source_index = token_words(tokenizer, source, ids)[1]
        target_index = token_words(tokenizer, target, labels, target=True)[1]
        column.append([k for pair in token_links(source_index, target_index, row) for k in pair])
    return dataset.add_column("alignment", column)


class AlignmentCollator:
    """The run's collator (`base`, e.g. DataCollatorForSeq2Seq) with the examples' `alignment` labels turned into
    `alignment_targets` (`alignment_targets`); the length columns of token-budget batching are dropped."""

    def __init__(self, base, padding_side: str = "right"):
        self.base, self.padding_side = base, padding_side

    def __call__(self, features: list[dict]) -> dict:
        drop = ("alignment", "source_length", "target_length")
        pairs = [feature.get("alignment") for feature in features]
        batch = self.base([{k: v for k, v in feature.items() if k not in drop} for feature in features])
        if any(p is not None for p in pairs):
            width = batch["input_ids"].shape[1]
            offsets = ([width - len(f["input_ids"]) for f in features] if self.padding_side == "left"
                       else None)  # fmt: skip
            batch["alignment_targets"] = alignment_targets([p or [] for p in pairs], batch["labels"].shape[1], width,
                                                           offsets)  # fmt: skip
        return batch


__all__ = [
    "ALIGNMENT_LAMBDA",
    "AlignmentCollator",
    "add_alignment_labels",
    "alignment_loss",
    "alignment_targets",
    "penultimate_head",
]
