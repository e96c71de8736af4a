"""Inline markup carried through translation by word alignment (`translate(..., markup="xml")`, `--markup xml`).

A line is read as XML text with inline elements:

1. Tags (`<b>`, `<i>`, `<a href="...">`, `<span ...>`, self-closing `<br/>`; `<br>`, `<img ...>`, `<hr>` count as
   self-closing), entities (`&amp;`, `&#228;`, `&nbsp;`, ...) and placeholders (`{0}`, `{name}`, `%s`, `%d`, `%1$s`)
   are taken out; entities become their characters. What is left, the plain text, is translated with hard word
   alignments (alignments.py; words are whitespace-separated).
2. Each tag pair goes back, with its tag text unchanged (attributes and all), around the contiguous target span from
   the first to the last target word aligned to a source word its content touches: the target words whose hard link
   goes there, and for each such source word the target word that gives it the largest share of its attention (the
   column's argmax: a forced term is often linked from one side only). A pair inside another stays
   inside it; siblings never overlap (a later one keeps the longest run of its words that no earlier one holds, or
   comes out empty right after them).
3. A tag pair whose content aligns to nothing, and a self-closing tag, goes by the nearest source word that has a
   link: the nearest by position, looking left first at each distance (for a pair, around that word's first target
   word; a self-closing tag, and a pair with no words inside, right after the first target word of the source word
   before it). A placeholder goes
   before the first target word of the source word after it (the one before it where it ends the line), as a word
   of its own: placeholders are never translated and each comes out exactly once.
4. The output is the target words joined by spaces, `&`, `<` and `>` escaped, with the tags and placeholders put
   back: well-formed, with the same tags as the source.

A line without tags, entities or placeholders is translated as usual. A line whose markup is broken (a `<` that
starts no tag, a tag closed that is not open, a tag left open) is translated as plain text, with a warning naming the
line; the other lines are not affected.
"""

from __future__ import annotations

import html
import logging
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

_NAME = r"[A-Za-z_][\w:.-]*"
_ATTRIBUTES = r"""(?:\s+[^\s<>"'/=]+(?:\s*=\s*(?:"[^"<]*"|'[^'<]*'|[^\s"'<>=`]+))?)*"""
_TOKEN = re.compile(
    rf"(?P<tag><(?P<close>/?)(?P<name>{_NAME})(?P<attrs>{_ATTRIBUTES})\s*(?P<empty>/?)>)"
    r"|(?P<entity>&(?:#\d+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);)"
    r"|(?P<placeholder>\{[A-Za-z0-9_]*\}|%(?:\d+\$)?[sdif])"
    r"|(?P<stray><)"
)
_VOID = {"br", "img", "hr", "wbr", "input"}  # HTML elements without content, written without `/>`
_WORD = re.compile(r"\S+")


@dataclass
class _Pair:
    """A tag pair: its opening and closing tags as written, the plain-text characters of its content, its parent."""

    open: str
    name: str
    parent: int | None
    start: int
    end: int = -1
    close: str = ""


@dataclass
class _Point:
    """A self-closing tag or placeholder at a plain-text character offset, inside pair `parent`."""

    text: str
    at: int
    parent: int | None
    placeholder: bool


@dataclass
class MarkupPlan:
    """One line taken apart: `text`, what is translated; its pairs and points; `broken`: why the line is translated
    as plain text (None: it is not); `marked`: whether it has anything to put back."""

    line: str
    text: str
    pairs: list[_Pair] = field(default_factory=list)
    points: list[_Point] = field(default_factory=list)
    broken: str | None = None
    marked: bool = False


def parse_markup(line: str) -> MarkupPlan:
    """`line` taken apart (the module's docstring); a broken line's plan says why and translates the line whole."""
    plain: list[str] = []
    size = 0
    pairs: list[_Pair] = []
    points: list[_Point] = []
    stack: list[int] = []
    marked = False

    def add(text: str) -> None:
        nonlocal size
        if not plain or (plain[-1][-1:].isspace() and text[:1].isspace()):  # no double space where markup was
            text = text.lstrip()
        if text:
            plain.append(text)
            size += len(text)

    position = 0
    for match in _TOKEN.finditer(line):
        add(line[position : match.start()])
        position = match.end()
        parent = stack[-1] if stack else None
        if match["stray"]:
            return MarkupPlan(line, line, broken=f"a '<' that starts no tag at character {match.start() + 1}")
        marked = True
        if match["entity"]:
            add(html.unescape(match["entity"]))
        elif match["placeholder"]:
            points.append(_Point(match["placeholder"], size, parent, True))
        elif match["empty"] or (not match["close"] and match["name"].lower() in _VOID):
            points.append(_Point(match["tag"], size, parent, False))
        elif not match["close"]:
            stack.append(len(pairs))
            pairs.append(_Pair(match["tag"], match["name"], parent, size))
        elif not stack or pairs[stack[-1]].name != match["name"]:
            return MarkupPlan(line, line, broken=f"</{match['name']}> closes a tag that is not open")
        else:
            pairs[stack[-1]].end, pairs[stack[-1]].close = size, match["tag"]
            stack.pop()
    add(line[position:])
    if stack:
        return MarkupPlan(line, line, broken=f"<{pairs[stack[-1]].name}> is not closed")
    if not marked:  # translated exactly as without markup
        return MarkupPlan(line, line)
    return MarkupPlan(line, "".join(plain).rstrip(), pairs, points, None, marked)


def take_out_markup(lines: Sequence[str], first_line: int = 1) -> list[MarkupPlan]:
    """`parse_markup` of each line, a warning naming each broken one (lines numbered from `first_line`)."""
    plans = [parse_markup(line) for line in lines]
    for number, plan in enumerate(plans, first_line):
        if plan.broken:
            logger.warning("line %d: broken markup (%s): translated as plain text", number, plan.broken)
    return plans


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


def restore(plan: MarkupPlan, translation) -> str:
    """The translation of `plan.text` (an `AlignedTranslation` with hard links) with `plan`'s markup put back."""
    if plan.broken or not plan.marked:
        return str(translation)
    spans = [m.span() for m in _WORD.finditer(plan.text)]
    words = list(getattr(translation, "target_words", None) or str(translation).split())
    targets: dict[int, list[int]] = {}
    for s, t in getattr(translation, "links", []):
        targets.setdefault(s, []).append(t)
    for linked in targets.values():
        linked.sort()
    soft = getattr(translation, "soft", None)
    n = len(words)

    def covered(start: int, end: int) -> list[int]:
        return [k for k, (a, b) in enumerate(spans) if a < end and b > start]

    def after_word(at: int) -> int:
        """After the first target word of the source word that ends before character `at` (or of the nearest linked
        one); 0 where there is none."""
        before = [k for k, (a, b) in enumerate(spans) if b <= at]
        linked = (targets.get(before[-1]) or _nearest_targets(before[-1:], targets, len(spans))) if before else []
        return linked[0] + 1 if linked else 0

    # Target spans [first, last] (first = last + 1: empty, before word `first`), parents before children.
    span: dict[int | None, tuple[int, int]] = {None: (0, n - 1)}
    taken: dict[int | None, set[int]] = {}  # the target words of each pair's children so far
    for index, pair in enumerate(plan.pairs):
        low, high = span[pair.parent]
        content = covered(pair.start, pair.end)
        linked = {t for k in content for t in targets.get(k, [])}
        if soft is not None and soft.numel():
            # words past the soft matrix's columns were cut from a long source (max_source_tokens): no attention
            linked |= {int(soft[:, k].argmax()) for k in content if k < soft.shape[1] and soft[:, k].max() > 0}
        linked = sorted(linked)
        if content and not linked:
            linked = _nearest_targets(content, targets, len(spans))
        if linked:
            first, last = min(linked), max(linked)
        else:  # no words inside (or no links at all): empty, where a self-closing tag would go
            first = after_word(pair.start)
            last = first - 1
        first, last = max(first, low), min(last, high)
        siblings = taken.setdefault(pair.parent, set())
        free = [k for k in range(first, last + 1) if k not in siblings]
        if free:  # the longest run of its words that no earlier sibling holds
            runs = [[free[0]]]
            for k in free[1:]:
                runs[-1].append(k) if k == runs[-1][-1] + 1 else runs.append([k])
            run = max(runs, key=len)
            first, last = run[0], run[-1]
        else:  # no words inside, or all of them held by earlier siblings: empty, right after them
            first = min(max(first, last + 1), high + 1)
            last = first - 1
        span[index] = (first, last)
        siblings.update(range(first, last + 1))

    def boundary(point: _Point) -> int:
        """Where a point goes: before target word `boundary` (n: at the end)."""
        low, high = span[point.parent]
        after = [k for k, (a, b) in enumerate(spans) if a >= point.at]
        if point.placeholder and after:
            linked = targets.get(after[0]) or _nearest_targets(after[:1], targets, len(spans))
            place = linked[0] if linked else low
        else:
            place = after_word(point.at)
        return min(max(place, low), high + 1)

    children: dict[int | None, list] = {}
    for index, pair in enumerate(plan.pairs):
        children.setdefault(pair.parent, []).append((span[index][0], 1, index))
    for point in plan.points:
        place = boundary(point)
        for index, pair in enumerate(plan.pairs):  # a point that would fall inside a sibling pair goes after it
            first, last = span[index]
            if pair.parent == point.parent and first < place <= last:
                place = last + 1
        children.setdefault(point.parent, []).append((place, 0, point))
    return _render(plan, words, span, children)


def _render(plan: MarkupPlan, words: list[str], span: dict, children: dict) -> str:
    """The target `words` with `plan`'s pairs around their `span`s and the `children` (pairs and points, by the
    target word they go before) in place, nested as in the source."""
    pieces: list[tuple[str, bool]] = []  # (text, a space before it)

    def emit_words(start: int, stop: int) -> None:
        for k in range(start, stop):
            pieces.append((html.escape(words[k], quote=False), True))

    def render(node: int | None) -> None:
        first, last = span[node]
        cursor = first
        for place, _, item in sorted(children.get(node, []), key=lambda c: (c[0], c[1])):
            emit_words(cursor, max(cursor, place))
            cursor = max(cursor, place)
            if isinstance(item, _Point):
                pieces.append((item.text, item.placeholder))
                continue
            pair = plan.pairs[item]
            pieces.append((pair.open, True))
            render(item)
            pieces.append((pair.close, False))
            cursor = max(cursor, span[item][1] + 1)
        emit_words(cursor, last + 1)

    render(None)
    out, glue = [], True
    for text, space in pieces:
        out.append((" " if space and not glue else "") + text)
        glue = text.startswith("<") and not text.startswith("</") and not text.endswith("/>") and space
    return "".join(out).strip()


def restore_markup(plans: Sequence[MarkupPlan], translations: Sequence) -> list[str]:
    """`restore` of each line."""
    return [restore(plan, translation) for plan, translation in zip(plans, translations, strict=True)]


def tags(text: str) -> list[str]:
    """The tags of a line, in order, as written."""
    return [match["tag"] for match in _TOKEN.finditer(text) if match["tag"]]


def well_formed(text: str) -> bool:
    """Whether `text` is well-formed XML content (elements balanced, `&` only in entities XML knows)."""
    try:
        ElementTree.fromstring(f"<line>{text}</line>")
    except ElementTree.ParseError:
        return False
    return True


__all__ = [
    "MarkupPlan",
    "parse_markup",
    "restore",
    "restore_markup",
    "tags",
    "take_out_markup",
    "well_formed",
]
