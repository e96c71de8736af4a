"""A forced term as users give it: its target text alone (fairseq's `source<TAB>term`), or with the source phrase it
translates, as a glossary pairs them (a `(source, target)` pair; in text, `source ||| target`).

The search forces the target side only; the source side tells the markup stage which tag holds the term (spans.py):
the pair whose content has the source phrase, found by string, not read from the alignment. `|||` is the field
separator of Moses phrase tables and Marian n-best lists; `=` or `:` would split real terms (`E=mc²`, `Typ:`).
"""

from __future__ import annotations

import re

SIDES = "|||"


def term_sides(term) -> tuple[str | None, str]:
    """(source phrase, target term) of `term`: a `(source, target)` pair (source None: none), `source ||| target`
    text (both sides stripped; a side left empty stays ""), or the target alone (source None, the text as given)."""
    if isinstance(term, str):
        if SIDES not in term:
            return None, term
        source, _, target = term.partition(SIDES)
        return source.strip(), target.strip()
    pair = isinstance(term, (tuple, list)) and len(term) == 2
    if not pair or not isinstance(term[1], str) or not isinstance(term[0], (str, type(None))):
        raise ValueError(f"a term is a string or a (source, target) pair of strings, not {term!r}")
    return term[0], term[1]


def phrase_spans(text: str, phrase: str) -> list[tuple[int, int]]:
    """The (start, end) character offsets of `phrase` in `text` as a whole word or phrase, any case (`file` is not
    in `files`; any run of spaces between its words)."""
    words = phrase.split()
    if not words:
        return []
    pattern = r"\s+".join(map(re.escape, words))
    return [m.span() for m in re.finditer(rf"(?<!\w){pattern}(?!\w)", text, re.IGNORECASE)]


__all__ = ["SIDES", "phrase_spans", "term_sides"]
