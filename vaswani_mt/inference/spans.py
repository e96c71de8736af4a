"""Where a tag pair goes in the translation (markup.py's step 2): the target words its content became.

A pair's *aligned words* come from the content's source words by the span rule (`SPAN_RULES`); its span is the
longest contiguous run of them inside its parent and clear of its earlier siblings (a tie to the run with more of the
content's attention), never empty while it has content (the nearest free word then). A pair around every word of its
parent (of the line, at the top) goes around every word of its parent's span.

A pair that holds a forced term (`--constraints`, met by the search) wraps the term: the search reports which target
tokens it placed for each constraint (`AlignedTranslation.placed`), so the term's words need no alignment. The span is
the term's words plus the runs of aligned words that touch them; a pair around it keeps its rule's span, widened to
hold the term. Which pair holds a term: for a term given with its source phrase (terms.py: a glossary's pair,
`source ||| target`), the pairs whose content has that phrase (a whole word or phrase, any case; found in the line
but in no pair: none); else it is read from the alignment (`_claims`: a term word's hard link into the content, a
content word's most-attending target word in the term, or the content holding the source word that gives the term
the largest share of its attention). Of the pairs that hold it, the innermost, then the one whose content the term
attends most. A term the search could not place (unmet) is no pair's: the rule alone decides.

The rules, chosen on the dev part of the held-out markup set and measured on its test part (`benchmarks/alignments.py
--markup_heldout`; RESULTS.md, 2026-11-29 markup spans):
- "argmax": each content word's most-attending target word (its column's argmax in the soft alignment; a word
  without attention: its hard links);
- "mutual": the links that are both a target word's hard link and the content word's column argmax; where the content
  has none, "links";
- "links": the content's hard links (each target word to its likeliest source word) and each content word's column
  argmax (the rule of issue 51).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from vaswani_mt.inference.terms import phrase_spans

if TYPE_CHECKING:  # annotations only: taking markup out and checking it needs no torch
    import torch

SPAN_RULES = ("argmax", "mutual", "links")
SPAN_RULE = "argmax"  # the dev part's best (RESULTS.md, 2026-11-29 markup spans)
_WORD = re.compile(r"\S+")


def _nearest_targets(words: Sequence[int], targets: dict[int, list[int]], count: int) -> list[int]:
    """Target words of the source word nearest to `words` that has any (left first at each distance); [] if none."""
    if not words:
        return []
    low, high = min(words), max(words)
    for distance in range(1, count + 1):
        for k in (low - distance, high + distance):
            if 0 <= k < count and targets.get(k):
                return targets[k][:1]
    return []


def _runs(words: Sequence[int]) -> list[list[int]]:
    """Sorted `words` cut into runs of consecutive numbers."""
    runs: list[list[int]] = []
    for k in words:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


@dataclass
class Alignment:
    """A translation as `restore` reads it: the source's word `spans` (character offsets in the plain text), the
    target `words`, each source word's linked target words (`targets`, sorted), the soft alignment (`soft`, target
    words x source words, None where it does not fit the words), the target words of each constraint the search
    placed (`placed`, None: unmet) and each constraint's source phrase (`sources`, None or missing: not given)."""

    text: str
    spans: list[tuple[int, int]]
    words: list[str]
    targets: dict[int, list[int]]
    soft: torch.Tensor | None
    placed: list[list[int] | None]
    sources: Sequence[str | None] = ()

    @classmethod
    def of(cls, text: str, translation, sources: Sequence[str | None] = ()) -> Alignment:
        """The alignment of `translation`, an `AlignedTranslation` of `text` (or a plain string: no links), whose
        constraints had the source phrases `sources`."""
        spans = [m.span() for m in _WORD.finditer(text)]
        words = list(getattr(translation, "target_words", None) or str(translation).split())
        targets: dict[int, list[int]] = {}
        for s, t in getattr(translation, "links", []):
            targets.setdefault(s, []).append(t)
        for linked in targets.values():
            linked.sort()
        soft = getattr(translation, "soft", None)
        soft = soft if soft is not None and soft.numel() and soft.shape[0] == len(words) else None
        placed = [None if w is None else [t for t in w if t < len(words)] or None
                  for w in getattr(translation, "placed", None) or []]  # fmt: skip
        return cls(text, spans, words, targets, soft, placed, list(sources))

    def covered(self, start: int, end: int) -> list[int]:
        """The source words that characters `start` to `end` touch."""
        return [k for k, (a, b) in enumerate(self.spans) if a < end and b > start]

    def words_after(self, at: int) -> list[int]:
        """The source words that start at or after character `at`."""
        return [k for k, (a, b) in enumerate(self.spans) if a >= at]

    def words_before(self, at: int) -> list[int]:
        """The source words that end at or before character `at`."""
        return [k for k, (a, b) in enumerate(self.spans) if b <= at]

    def first_target(self, k: int) -> int | None:
        """The first target word of source word k, or of the nearest linked one."""
        linked = self.targets.get(k) or _nearest_targets([k], self.targets, len(self.spans))
        return linked[0] if linked else None

    def after_word(self, at: int) -> int:
        """After the first target word of the source word that ends before character `at`, or holds it (or of the
        nearest linked one); 0 where there is none."""
        before = [k for k, (a, b) in enumerate(self.spans) if a < at]
        t = self.first_target(before[-1]) if before else None
        return 0 if t is None else t + 1

    def column_argmax(self, content: Sequence[int]) -> set[int]:
        """Each content source word's most-attending target word (where the soft alignment has its column)."""
        soft = self.soft
        return {int(soft[:, k].argmax()) for k in content if soft is not None and k < soft.shape[1]
                and soft[:, k].max() > 0}  # fmt: skip

    def aligned(self, content: Sequence[int], rule: str) -> set[int]:
        """The target words that `rule` (module docstring) aligns to the `content` source words."""
        if rule not in SPAN_RULES:
            raise ValueError(f"span rule must be one of {', '.join(SPAN_RULES)}, not {rule!r}")
        links = {t for k in content for t in self.targets.get(k, [])}
        if rule == "argmax":  # a word without attention (a column of zeros, no soft alignment): its hard links
            return {t for k in content for t in self.column_argmax([k]) or self.targets.get(k, [])}
        argmax = self.column_argmax(content)
        mutual = {t for k in content for t in self.column_argmax([k]) if t in self.targets.get(k, [])}
        return mutual if rule == "mutual" and mutual else links | argmax

    def attention(self, rows: Sequence[int], columns: Sequence[int]) -> float:
        """The soft alignment's mass of target words `rows` on source words `columns` (0 without one)."""
        columns = [k for k in columns if self.soft is not None and k < self.soft.shape[1]]
        return float(self.soft[list(rows)][:, columns].sum()) if columns and rows else 0.0


def _claims(alignment: Alignment, content: list[int], term: list[int]) -> bool:
    """Whether the `content` source words hold the forced `term` (its target words): a term word's hard link goes
    into the content, a content word's most-attending target word is in the term, or the source word whose attention
    goes most to the term (the term's share of each source word's column) is in the content."""
    linked = {t for k in content for t in alignment.targets.get(k, [])}
    if (linked | alignment.column_argmax(content)) & set(term):
        return True
    soft = alignment.soft
    if soft is None or not soft.shape[1]:
        return False
    share = soft[list(term)].sum(0) / soft.sum(0).clamp(min=1e-12)
    return int(share.argmax()) in content


def _term_holders(pairs: Sequence, alignment: Alignment) -> tuple[dict[int, set[int]], set[int]]:
    """The target words each pair must wrap (its forced terms' and those of the pairs inside it), and the pairs that
    hold a term themselves (module docstring)."""
    contents = [alignment.covered(pair.start, pair.end) for pair in pairs]
    forced: dict[int, set[int]] = {}
    holders = set()
    for number, term in enumerate(alignment.placed):
        if term is None:
            continue
        source = alignment.sources[number] if number < len(alignment.sources) else None
        claimants = _source_holders(pairs, alignment.text, source) if source else None
        if claimants is None:  # no source side, or not in the line: the alignment says
            claimants = [i for i, content in enumerate(contents) if content and _claims(alignment, content, term)]
        inner = [i for i in claimants if not any(_inside(j, i, pairs) for j in claimants if j != i)]
        if not inner:
            continue
        holder = max(inner, key=lambda i: (alignment.attention(term, contents[i]), i))
        holders.add(holder)
        while holder is not None:  # the pairs around it wrap the term too
            forced.setdefault(holder, set()).update(term)
            holder = pairs[holder].parent
    return forced, holders


def _source_holders(pairs: Sequence, text: str, source: str) -> list[int] | None:
    """The pairs whose content has the `source` phrase (whole words, any case) somewhere in the plain `text`; None
    where the line does not have it."""
    found = phrase_spans(text, source)
    if not found:
        return None
    return [i for i, pair in enumerate(pairs) if any(pair.start <= a and b <= pair.end for a, b in found)]


def _inside(inner: int, outer: int, pairs: Sequence) -> bool:
    """Whether pair `inner` is nested (at any depth) in pair `outer`."""
    parent = pairs[inner].parent
    while parent is not None:
        if parent == outer:
            return True
        parent = pairs[parent].parent
    return False


def _touching(term: set[int], free: list[int]) -> set[int]:
    """The forced `term` words and the runs of aligned `free` words next to them (or next to such a run)."""
    first, last = min(term), max(term)
    grown = True
    while grown:
        grown = False
        for run in _runs(free):
            if run[0] <= last + 1 and run[-1] >= first - 1 and (run[0] < first or run[-1] > last):
                first, last, grown = min(first, run[0]), max(last, run[-1]), True
    return set(range(first, last + 1))


def _covering(words: set[int], term: set[int], held: set[int]) -> tuple[int, int]:
    """From the first to the last of `words`, cut where an earlier sibling `held` a word: the piece with the most of
    the `term` words (then the longest)."""
    pieces = _runs([t for t in range(min(words), max(words) + 1) if t not in held])
    piece = max(pieces, key=lambda run: (len(term.intersection(run)), len(run)))
    return piece[0], piece[-1]


def _rule_span(pair, alignment: Alignment, bounds: tuple[int, int], held: set[int], free: list[int], linked: set[int],
               content: list[int], reserved: set[int]) -> tuple[int, int]:  # fmt: skip
    """The span rule's span of `pair` (module docstring) inside `bounds`: its `free` aligned words' longest run, else
    the nearest free word, else empty where a self-closing tag would go."""
    low, high = bounds
    if free:  # the longest run of its aligned words; a tie to the one with more of its content's attention
        run = max(_runs(free), key=lambda run: (len(run), alignment.attention(run, content)))
        return run[0], run[-1]
    if content and (anchor := min(linked) if linked else alignment.first_target(content[0])) is not None:
        # never empty: the free word nearest to its aligned (or its nearest source word's) target word
        options = [t for t in range(low, high + 1) if t not in held and t not in reserved]
        if not options:
            return high + 1, high
        nearest = min(options, key=lambda t: (abs(t - anchor), t))
        return nearest, nearest
    # no words inside (or no links at all): empty, where a self-closing tag would go
    first = min(max(alignment.after_word(pair.start), low), high + 1)
    while first in held:
        first += 1
    return first, first - 1


class _Terms(NamedTuple):
    """What a pair has to do with the forced terms: the words it wraps (`forced`), whether a term is its own
    (`holds`; else only pairs inside it hold them), the other pairs' forced words (`reserved`, left to them)."""

    forced: set[int]
    holds: bool
    reserved: set[int]


def _pair_span(pair, alignment: Alignment, bounds: tuple[int, int], held: set[int], rule: str, terms: _Terms,
               outer: list[int]) -> tuple[int, int]:  # fmt: skip
    """The target span [first, last] of `pair` inside its parent's `bounds` [low, high], clear of the words its
    earlier siblings `held` (first = last + 1: empty, before word `first`); a pair whose content is every source word
    of its parent's (`outer`; the line's) takes the parent's whole span; `terms`: the forced terms it wraps."""
    (low, high), reserved = bounds, terms.reserved
    content = alignment.covered(pair.start, pair.end)
    if content and not held and set(content) >= set(outer):  # all of its parent's words (the line's): all of its
        return low, high
    linked = alignment.aligned(content, rule)
    free = [t for t in sorted(linked) if low <= t <= high and t not in held and t not in reserved]
    forced = {t for t in terms.forced if low <= t <= high and t not in held}
    if forced and terms.holds:  # the term, and what the rule adds next to it
        return _covering(_touching(forced, free), forced, held)
    first, last = _rule_span(pair, alignment, bounds, held, free, linked, content, reserved)
    if forced:  # around a pair inside it that holds a term: wide enough to hold that term too
        return _covering(forced.union(range(first, last + 1)), forced, held)
    return first, last


def pair_spans(pairs: Sequence, alignment: Alignment, rule: str = SPAN_RULE) -> dict[int | None, tuple[int, int]]:
    """Each pair's target span (None: the whole line), parents before children, siblings apart."""
    span: dict[int | None, tuple[int, int]] = {None: (0, len(alignment.words) - 1)}
    taken: dict[int | None, set[int]] = {}  # the target words of each pair's children so far
    forced, holders = _term_holders(pairs, alignment)
    every = set().union(*forced.values()) if forced else set()
    for index, pair in enumerate(pairs):
        held = taken.setdefault(pair.parent, set())
        words = forced.get(index, set())
        parent = pairs[pair.parent] if pair.parent is not None else None
        outer = alignment.covered(parent.start, parent.end) if parent else list(range(len(alignment.spans)))
        terms = _Terms(words, index in holders, every - words)
        span[index] = _pair_span(pair, alignment, span[pair.parent], held, rule, terms, outer)
        held.update(range(span[index][0], span[index][1] + 1))
    return span


__all__ = ["SPAN_RULE", "SPAN_RULES", "Alignment", "pair_spans"]
