"""Words of a text and the word each of its tokens belongs to: what word alignments (inference/alignments.py) and
alignment supervision (training/alignment_supervision.py) read, words being whitespace-separated."""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from vaswani_mt.model.constraints_vaswani import encode_with_offsets

_WORD = re.compile(r"\S+")


def token_words(tokenizer, text: str, ids: Sequence[int], target: bool = False) -> tuple[list[str], list[int]]:
    """The whitespace-separated words of `text` and, per token of `ids` (its source ids, or with `target` its target
    ids), the word it is part of (-1: none, e.g. `</s>`), by the tokenizer's character offsets; where the
    tokenizer's ids are not `ids` (a cut or mended source), by decoding."""
    spans = [m.span() for m in _WORD.finditer(text)]
    words = [text[a:b] for a, b in spans]
    try:
        encoding = encode_with_offsets(tokenizer, text, target=target)
    except (TypeError, ValueError):  # text the tokenizer cannot read (lone surrogates), mended by encode_source
        return decoded_words(tokenizer, ids)
    if list(encoding["input_ids"][: len(ids) - 1]) != list(ids[:-1]):
        return decoded_words(tokenizer, ids)
    starts = [a for a, _ in spans]
    specials = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}  # <unk> stands for characters of a word
    index = []
    for token, (a, b) in zip(ids, encoding["offset_mapping"], strict=False):
        index.append(_word_at(text, a, b, spans, starts) if token not in specials else -1)
    index += [-1] * (len(ids) - len(index))
    return words, index


def _word_at(text: str, a: int, b: int, spans, starts) -> int:
    """The word holding the first non-space character of `text[a:b]`; for spaces alone (a bare word-start piece,
    "▁"), the word after them; -1 for an empty span or spaces at the end."""
    if a >= b:
        return -1
    while a < b and text[a].isspace():
        a += 1
    if a >= b:
        word = bisect.bisect_left(starts, a)
        return word if word < len(starts) else -1
    word = bisect.bisect_right(starts, a) - 1
    return word if word >= 0 and spans[word][0] <= a < spans[word][1] else -1


def decoded_words(tokenizer, ids: Sequence[int]) -> tuple[list[str], list[int]]:
    """The words of `ids` decoded (special tokens skipped) and each token's word, from the lengths of the decoded
    prefixes."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    spans = [m.span() for m in _WORD.finditer(text)]
    starts = [a for a, _ in spans]
    index, end = [], 0
    for k in range(len(ids)):
        new_end = len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True))
        index.append(_word_at(text, end, new_end, spans, starts))
        end = max(end, new_end)
    return [text[a:b] for a, b in spans], index


__all__ = ["decoded_words", "token_words"]
