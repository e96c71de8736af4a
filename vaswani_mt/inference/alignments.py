"""Word alignments of translations, from the model's encoder-decoder attention (§3.2.3), as Marian's `--alignment`.

A translation found by any search (beam or greedy, n-best, constraints, prefixes, token budgets, an ensemble) goes
through the model once more, teacher-forced on (source ids, output ids), with `output_attentions=True` (the model is
switched to eager attention for that pass and back). Its cross-attention becomes a matrix over words:

- words are the whitespace-separated words of the source text and of the translation; a word's subword pieces are
  merged, the source pieces' weights summed (the mass on the word), the target pieces' rows averaged; the source's
  `</s>` is left out and each target word's row renormalised to sum to 1 (the soft alignment);
- `method` says which attention: "mean" (every layer and head), "layerK" (the heads of decoder layer K, from 0), and
  each with "shift-" in front (shift-att, Chen et al. 2020): target token i is read from the step whose decoder input
  is token i (the step that predicts i + 1) rather than from the step that predicts it. An ensemble averages its
  members' matrices.
- "supervised": the one head trained to align (Garg et al. 2019; `--alignment_supervision`, whose (layer, head) the
  model's `config.alignment_head` names); "default" (`DEFAULT_METHOD`): "mean" for every model (`default_method`:
  the supervised head measured below it).
- hard links (`rule`): "argmax", each target word to its likeliest source word (Marian's `--alignment hard`); a
  number t in (0, 1), every pair above t (Marian's `--alignment t`); "intersect", pairs that are the argmax of their
  row and of their column.

The default for a model trained without alignment labels, "mean", from benchmarks/alignments.py on the main job's
model: dictionary-anchored precision 80.9% (layer2 86.4, layer1 74.1, shift-att 29-36), silver AER 46.4 (layer1 45.0,
layer2 51.1); the mean does not depend on the model's depth.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence

import torch

from vaswani_mt.data.words import decoded_words, token_words
from vaswani_mt.model.pipeline_vaswani import single_line

DEFAULT_METHOD = "default"  # resolved per model by `default_method`: "supervised" or "mean"
KINDS = ("hard", "soft")
_WORD = re.compile(r"\S+")


class AlignedTranslation(str):
    """A translation (it is the text, a `str`) with its word alignment: `source_words` and `target_words` (whitespace
    split), `soft` (a target-words x source-words tensor, each row a distribution) and `links`, the hard alignment as
    (source word, target word) pairs, sorted by target word then source word. `kind` ("hard" or "soft") is what
    `format_alignment` prints by default. `attention` (layers x target tokens + 1 x source tokens, head means),
    `source_index` and `target_index` (each token's word, -1 for none) keep what `realign` needs for another method;
    `supervised` (target tokens + 1 x source tokens), the supervised head's weights where the model has one.
    `placed`: with constraints, per constraint the target words holding the tokens the search placed for it (None:
    unmet), from the search's report (`constraints_placed`), not from the alignment."""

    source_words: list[str]
    target_words: list[str]
    soft: torch.Tensor
    links: list[tuple[int, int]]
    kind: str
    attention: torch.Tensor | None = None
    supervised: torch.Tensor | None = None
    source_index: list[int] = []
    target_index: list[int] = []
    source_ids: list[int] = []  # the source's token ids (ending in </s>) and the translation's (no special tokens)
    target_ids: list[int] = []
    placed: list[list[int] | None] = []

    def __new__(cls, text: str, source_words=(), target_words=(), soft=None, links=(), kind: str = "hard"):
        self = super().__new__(cls, text)
        self.source_words, self.target_words = list(source_words), list(target_words)
        self.soft = soft if soft is not None else torch.zeros(len(self.target_words), len(self.source_words))
        self.links, self.kind = list(links), kind
        return self

    def __reduce__(self):
        names = ("attention", "supervised", "source_index", "target_index", "source_ids", "target_ids", "placed")
        state = {name: getattr(self, name) for name in names}
        return (AlignedTranslation, (str(self), self.source_words, self.target_words, self.soft, self.links,
                                     self.kind), state)  # fmt: skip

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)


def format_alignment(aligned: AlignedTranslation, kind: str | None = None) -> str:
    """Marian's alignment field: hard, `s-t s-t ...` (source word - target word, from 0); soft, per target word the
    comma-separated probabilities of the source words, target words separated by spaces."""
    kind = kind or aligned.kind
    if kind == "hard":
        return " ".join(f"{s}-{t}" for s, t in aligned.links)
    if kind == "soft":
        return " ".join(",".join(f"{p:.3f}" for p in row) for row in aligned.soft.tolist())
    raise ValueError(f"alignments must be one of {', '.join(KINDS)}, not {kind!r}")


def format_aligned_line(aligned: AlignedTranslation, kind: str | None = None) -> str:
    """`translation ||| alignment`, Marian's output line with `--alignment` (no line end)."""
    return f"{aligned} ||| {format_alignment(aligned, kind)}"


def parse_alignment(field: str) -> list[tuple[int, int]] | list[list[float]]:
    """The alignment field of a Marian line back: hard links as (source, target) pairs, or soft rows."""
    items = field.split()
    if all("-" in item for item in items):
        return [(int(s), int(t)) for s, t in (item.split("-") for item in items)]
    return [[float(p) for p in item.split(",")] for item in items]


def hard_links(soft: torch.Tensor, rule: str | float = "argmax") -> list[tuple[int, int]]:
    """(source, target) links of a target x source matrix by `rule` (module docstring), sorted by target word."""
    if soft.numel() == 0:
        return []
    if rule == "argmax":
        best = soft.argmax(1).tolist()
        return [(s, t) for t, s in enumerate(best)]
    if rule == "intersect":
        rows, columns = soft.argmax(1), soft.argmax(0)
        return [(int(s), t) for t, s in enumerate(rows.tolist()) if int(columns[s]) == t]
    threshold = float(rule)
    return [(s, t) for t, s in (soft > threshold).nonzero().tolist()]


def check_method(method: str) -> tuple[bool, int | None]:
    """(shift-att?, layer or None for the mean of all) of a method name; ValueError for a name that is none.
    "default" and "supervised": (False, None)."""
    if method in ("default", "supervised"):
        return False, None
    shift = method.startswith("shift-")
    name = method.removeprefix("shift-")
    if name == "mean":
        return shift, None
    if name.startswith("layer") and name[5:].isdigit():
        return shift, int(name[5:])
    raise ValueError(f"alignment method must be default, supervised, mean, layerK, shift-mean or shift-layerK, not "
                     f"{method!r}")  # fmt: skip


def supervised_head(config) -> tuple[int, int] | None:
    """The (decoder layer, head) trained to align (`config.alignment_head`), or None."""
    head = getattr(config, "alignment_head", None)
    return (int(head[0]), int(head[1])) if head else None


def default_method(model) -> str:
    """The default alignment method: "mean" for every model, one trained with a supervised head too. That head
    measured below the mean on the measures it was not trained on (RESULTS.md, 2026-11-26 alignments, the main job
    trained with it: dictionary-anchored precision 79.9% against 80.4%, markup 72.9% against 77.0%); "supervised"
    asks for it."""
    return "mean"


@contextlib.contextmanager
def _eager(model) -> Iterator[None]:
    """The model on eager attention (the one that returns weights) inside the block, as it was after."""
    before = model.config._attn_implementation
    if before != "eager":
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if before != "eager":
            model.set_attn_implementation(before)


@torch.no_grad()
def cross_attention(model, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
                    encoded: tuple[torch.Tensor, torch.Tensor] | None = None, *,
                    with_head: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Encoder-decoder attention of the teacher-forced pass on `sources` (ids ending in `</s>`) and `targets` (output
    ids without the decoder start, `</s>` or padding), averaged over heads: float32 (layers, batch, rows, columns),
    row i the step whose decoder input is `<s>` followed by `targets[:i]`, rows `len(target) + 1`. An ensemble gives
    its members' mean (members of different depths: their layers' means, as one layer). `encoded`: a single model's
    encoder states and mask of `sources`, a row each, from the search (the encoder then does not run again).
    `with_head`: also the supervised head's weights, (batch, rows, columns), the members' mean, or None where a
    member names no supervised head (`supervised_head`)."""
    members = list(getattr(model, "members", [model]))
    config = members[0].config
    pad, start = config.pad_token_id, config.decoder_start_token_id
    width, length = max(map(len, sources)), max(map(len, targets)) + 1
    ids = torch.full((len(sources), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    decoder = torch.full((len(targets), length), pad, dtype=torch.long)
    for row, (source, target) in enumerate(zip(sources, targets, strict=True)):
        ids[row, : len(source)] = torch.tensor(source)
        mask[row, : len(source)] = 1
        decoder[row, : len(target) + 1] = torch.tensor([start, *target])
    weights, heads = [], []
    for member in members:
        device = member.device
        inputs = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
        if encoded is not None and len(members) == 1:
            inputs = {"encoder_outputs": (encoded[0],), "attention_mask": encoded[1]}
        with _eager(member):
            out = member(**inputs, decoder_input_ids=decoder.to(device), output_attentions=True, use_cache=False)
        weights.append(torch.stack(out.cross_attentions).float().mean(2)[..., :width].cpu())
        head = supervised_head(member.config)
        if head is not None:
            heads.append(out.cross_attentions[head[0]][:, head[1], :, :width].float().cpu())
    if len({w.shape[0] for w in weights}) > 1:
        weights = [w.mean(0, keepdim=True) for w in weights]
    means = torch.stack(weights).mean(0)
    if not with_head:
        return means
    return means, (torch.stack(heads).mean(0) if len(heads) == len(members) else None)


def word_matrix(attention: torch.Tensor, source_index: Sequence[int], target_index: Sequence[int],
                source_words: int, target_words: int, merge: str = "sum") -> torch.Tensor:  # fmt: skip
    """Token attention (target rows x source columns) as a target-words x source-words matrix, rows summing to 1:
    source pieces summed (`merge="mean"`: averaged), target pieces averaged."""
    matrix = torch.zeros(target_words, source_words)
    if not source_words or not target_words:
        return matrix
    columns = torch.tensor([i if i >= 0 else source_words for i in source_index])
    by_source = torch.zeros(attention.shape[0], source_words + 1).index_add_(1, columns, attention[:, : len(columns)])
    by_source = by_source[:, :source_words]
    if merge == "mean":
        by_source = by_source / torch.bincount(columns, minlength=source_words + 1)[:source_words].clamp(min=1)
    rows = torch.tensor([i if i >= 0 else target_words for i in target_index], dtype=torch.long)
    summed = torch.zeros(target_words + 1, source_words).index_add_(0, rows, by_source[: len(rows)])[:target_words]
    summed = summed / torch.bincount(rows, minlength=target_words + 1)[:target_words].clamp(min=1).unsqueeze(1)
    return summed / summed.sum(1, keepdim=True).clamp(min=1e-12)


def select(attention: torch.Tensor, method: str, length: int, supervised: torch.Tensor | None = None) -> torch.Tensor:
    """The (target tokens x source tokens) rows of one sentence's (layers, rows, columns) attention for `method`:
    row i for token i, or row i + 1 with shift-att; `length` target tokens. `supervised`: the supervised head's
    (rows, columns), for "supervised" and "default"."""
    if method == "default":
        method = "mean"  # `default_method`: the supervised head measured below the mean
    if method == "supervised":
        if supervised is None:
            raise ValueError("alignment method 'supervised' needs a model trained with --alignment_supervision")
        return supervised[:length]
    shift, layer = check_method(method)
    if layer is not None and layer >= attention.shape[0]:
        raise ValueError(f"alignment method {method!r}: the attention has {attention.shape[0]} decoder layers "
                         f"(layer0 to layer{attention.shape[0] - 1})")  # fmt: skip
    weights = attention.mean(0) if layer is None else attention[layer]
    return weights[1 : length + 1] if shift else weights[:length]


def align_outputs(model, tokenizer, sources: Sequence[str], source_ids: Sequence[Sequence[int]],
                  sequences: torch.Tensor, kind: str = "hard", method: str = DEFAULT_METHOD,
                  encoded=None) -> list[AlignedTranslation]:  # fmt: skip
    """`AlignedTranslation`s of `generate()`'s output `sequences` (a row per translation, starting with the decoder
    start) of the texts `sources` (row i of `sequences` translates `sources[i * len(sources) // rows]`: n-best rows
    follow each other), tokenized as `source_ids`; `encoded`: (encoder states, mask) of `sources`, a row each, if the
    search's are at hand."""
    if kind not in KINDS:
        raise ValueError(f"alignments must be one of {', '.join(KINDS)}, not {kind!r}")
    check_method(method)
    if method == "supervised" and not all(supervised_head(m.config) for m in getattr(model, "members", [model])):
        raise ValueError("alignment method 'supervised' needs a model trained with --alignment_supervision")
    rows = sequences.shape[0]
    per = rows // len(sources)
    specials = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}
    outputs = [[t for t in row[1:].tolist() if t not in specials] for row in sequences]
    keep = [i for i, out in enumerate(outputs) if out]
    aligned: list[AlignedTranslation | None] = [None] * rows
    if keep:
        rows_of = torch.tensor([i // per for i in keep])
        encoded = None if encoded is None else (encoded[0][rows_of.to(encoded[0].device)],
                                                encoded[1][rows_of.to(encoded[1].device)])  # fmt: skip
        attention, head = cross_attention(model, [source_ids[i // per] for i in keep], [outputs[i] for i in keep],
                                          encoded, with_head=True)  # fmt: skip
        for k, i in enumerate(keep):
            aligned[i] = _aligned(tokenizer, sources[i // per], source_ids[i // per], outputs[i], attention[:, k],
                                  None if head is None else head[k], kind, method)  # fmt: skip
    for i in range(rows):
        if aligned[i] is None:
            words = _WORD.findall(sources[i // per])
            aligned[i] = AlignedTranslation(single_line(tokenizer.decode(outputs[i], skip_special_tokens=True)),
                                            words, [], torch.zeros(0, len(words)), [], kind)  # fmt: skip
            aligned[i].source_ids = list(source_ids[i // per])
    return aligned


def with_placed(aligned: Sequence[AlignedTranslation], tokenizer, sequences: torch.Tensor,
                placed: Sequence) -> Sequence[AlignedTranslation]:  # fmt: skip
    """`aligned` (`align_outputs` of `sequences`) with the words the search placed for each constraint (`placed`: per
    row, `constraints_placed`' token positions) as `AlignedTranslation.placed`."""
    specials = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}
    for i, spans in enumerate(placed):
        aligned[i].placed = _placed_words(spans, sequences[i, 1:].tolist(), specials, aligned[i].target_index)
    return aligned


def _placed_words(spans, generated: list[int], specials: set, index: list[int]) -> list[list[int] | None]:
    """The search's (first, last) token positions of each constraint among the `generated` tokens as the target
    words that hold those tokens (`index`: each output token's word; special tokens are not output tokens)."""
    position, out = [], 0  # each generated token's place among the output tokens
    for token in generated:
        position.append(out if token not in specials else -1)
        out += token not in specials
    words = []
    for span in spans:
        tokens = [position[k] for k in range(span[0], min(span[1] + 1, len(position)))] if span is not None else []
        words.append(sorted({index[t] for t in tokens if 0 <= t < len(index) and index[t] >= 0}) or None)
    return words


def _aligned(tokenizer, source: str, source_ids, output, attention, head, kind, method) -> AlignedTranslation:
    """One translation's `AlignedTranslation`, hard links by argmax (`realign` gives the other rules)."""
    source_words, source_index = token_words(tokenizer, source, source_ids)
    target_words, target_index = decoded_words(tokenizer, output)
    aligned = AlignedTranslation(single_line(tokenizer.decode(output, skip_special_tokens=True)), source_words,
                                 target_words, kind=kind)  # fmt: skip
    # Copies of its own rows and columns: a view would keep the whole batch's attention alive.
    aligned.attention = attention[:, : len(output) + 1, : len(source_ids)].clone()
    aligned.supervised = None if head is None else head[: len(output) + 1, : len(source_ids)].clone()
    aligned.source_index, aligned.target_index = source_index, target_index
    aligned.source_ids, aligned.target_ids = list(source_ids), list(output)
    return realign(aligned, method, into=aligned)


def realign(aligned: AlignedTranslation, method: str = DEFAULT_METHOD, rule: str | float = "argmax",
            merge: str = "sum", into: AlignedTranslation | None = None) -> AlignedTranslation:  # fmt: skip
    """`aligned` aligned again by another `method`, hard `rule` or source-piece `merge` ("sum" or "mean"), from the
    attention it keeps (no translation, no model). `into`: the object to fill (default: a copy)."""
    if into is None:
        into = AlignedTranslation(str(aligned), aligned.source_words, aligned.target_words, kind=aligned.kind)
        for name in ("attention", "supervised", "source_index", "target_index", "source_ids", "target_ids", "placed"):
            setattr(into, name, getattr(aligned, name))
    if aligned.attention is None or not aligned.target_index:
        return into
    weights = select(aligned.attention, method, len(aligned.target_index), aligned.supervised)
    into.soft = word_matrix(weights, aligned.source_index, aligned.target_index, len(aligned.source_words),
                            len(aligned.target_words), merge)  # fmt: skip
    into.links = hard_links(into.soft, rule)
    return into


def empty_aligned(source: str, kind: str = "hard") -> AlignedTranslation:
    """The empty translation of an empty or untranslated line, with no links."""
    words = _WORD.findall(source)
    return AlignedTranslation("", words, [], torch.zeros(0, len(words)), [], kind)


__all__ = [
    "DEFAULT_METHOD",
    "KINDS",
    "AlignedTranslation",
    "align_outputs",
    "check_method",
    "cross_attention",
    "default_method",
    "empty_aligned",
    "format_aligned_line",
    "format_alignment",
    "hard_links",
    "parse_alignment",
    "realign",
    "supervised_head",
    "with_placed",
    "word_matrix",
]
