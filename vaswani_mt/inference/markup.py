"""Inline markup carried through translation by word alignment (`translate(..., markup="xml")`, `--markup xml`).

A line is read as XML or HTML text with inline elements (docs/markup.md):

1. Taken out of the text: tags (`<b>`, `<a href="...">`, `<span ...>`; void tags: self-closing `<br/>`, and HTML's
   `<br>`, `<img ...>`, `<hr>`, `<wbr>`, `<input ...>` written without the slash), comments (`<!-- ... -->`) and
   CDATA sections, placeholders (`{0}`, `{name}`, `{{name}}`, `%s`, `%d`, `%1$s`) and the format strings' literals
   `%%`, `{{`, `}}`. Entities become their characters; space entities (`&nbsp;`, `&#160;`, `&thinsp;`, ...) become
   spaces. A void tag, comment or CDATA section separates the words around it. What is left, the plain text, is
   translated with hard word alignments (alignments.py; words are whitespace-separated). A `<` that starts no tag
   and a `&` that starts no entity are text.
2. Each tag pair goes back, its tag text unchanged (attributes and all), around the longest contiguous run of target
   words aligned to a source word its content touches (the target words whose hard link goes there, and for each
   such source word the target word that gives it the largest share of its attention: a forced term is often linked
   from one side only); a tie goes to the run with more of the content's attention. A pair inside another stays
   inside it; siblings never overlap. A pair with content is never empty: where its content aligns to nothing (or
   only to words its parent does not hold or an earlier sibling holds), it goes around the nearest free word (to the
   target words of the nearest source word that has a link, left first at equal distance).
3. Points (void tags, comments, CDATA, placeholders, literals): at the start or end of the line they stay there; one
   written right after punctuation goes after the target word that ends in the same mark (the k-th such word, as in
   the source, where source and target have as many); one written against the word before it (`100%%`) follows that
   word's first target word, one against the word after it (`{{x`) goes before that word's first target word; else
   a placeholder goes before the first target word of the source word after it, any other point after the first
   target word of the source word before it. Each comes out exactly once, written as in the source, with the spaces
   the source had around it.
4. A space entity between two words goes back, as written, in place of the space before the first target word of
   the word after it (at the edge of the line it is a point).
5. The output is the target words joined by spaces, `&`, `<` and `>` escaped, with the markup put back: well-formed
   XML with the same tags where the line uses XML's markup; where it uses HTML's (a void tag without the slash, a
   space entity XML does not know: `&nbsp;`, `&ensp;`, ...), well-formed HTML (`well_formed(text, html=True)`).

A line without tags, comments, entities, placeholders or literals is translated as usual. A line whose tags do not
nest (a tag closed that is not open, a tag left open) is translated as plain text, with a warning naming the line;
a stray `<` or `&` in a line with markup is read as text, with a warning naming the line; other lines are not
affected.
"""

from __future__ import annotations

import dataclasses
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
    r"(?P<comment><!--.*?-->|<!\[CDATA\[.*?\]\]>)"
    rf"|(?P<tag><(?P<close>/?)(?P<name>{_NAME})(?P<attrs>{_ATTRIBUTES})\s*(?P<empty>/?)>)"
    r"|(?P<entity>&(?:#\d+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);)"
    r"|(?P<literal>%%|\{\{(?!\s*[\w.]+\s*\}\})|\}\})"
    r"|(?P<placeholder>\{\{\s*[\w.]+\s*\}\}|\{[A-Za-z0-9_]*\}|%(?:\d+\$)?[sdif])"
    r"|(?P<stray>[<&])"
)
_VOID = {"br", "img", "hr", "wbr", "input"}  # HTML elements without content, written without `/>`
_XML_ENTITIES = {"amp", "lt", "gt", "quot", "apos"}
_PUNCTUATION = ".,;:!?"
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
    """Markup without content (a void tag, comment, CDATA, placeholder, literal, an edge's space entity) at a
    plain-text character offset, inside pair `parent`; `placeholder`: placed by the word after it; `before`, `after`:
    whether the source has a space (or the line's edge) there; `edge`: "start" or "end" of the line, or None."""

    text: str
    at: int
    parent: int | None
    placeholder: bool
    before: bool = True
    after: bool = True
    edge: str | None = None


@dataclass
class _Joint:
    """A space entity, as written, between two words of the plain text: the word after it starts at `at`."""

    text: str
    at: int


@dataclass
class MarkupPlan:
    """One line taken apart: `text`, what is translated; its pairs, points and space entities (`joints`); `broken`:
    why the line is translated as plain text (None: it is not); `marked`: whether it has anything to put back;
    `html`: whether it uses HTML's markup (the output is then well-formed HTML, not XML); `strays`: the `<` and `&`
    read as text, for the warning."""

    line: str
    text: str
    pairs: list[_Pair] = field(default_factory=list)
    points: list[_Point] = field(default_factory=list)
    broken: str | None = None
    marked: bool = False
    joints: list[_Joint] = field(default_factory=list)
    html: bool = False
    strays: list[str] = field(default_factory=list)


def parse_markup(line: str) -> MarkupPlan:
    """`line` taken apart (the module's docstring); a broken line's plan says why and translates the line whole."""
    plain: list[str] = []
    size = 0
    pairs: list[_Pair] = []
    points: list[_Point] = []
    joints: list[tuple[_Joint, int | None, int]] = []
    stack: list[int] = []
    marked = uses_html = separate = False
    strays: list[str] = []
    order: list[int] = []  # the points' offsets in the line

    def add(text: str) -> None:
        nonlocal size, separate
        if separate and plain and text and not plain[-1][-1:].isspace() and not text[:1].isspace():
            text = " " + text  # a void tag, comment or CDATA between two words separates them
        if not plain or (plain[-1][-1:].isspace() and text[:1].isspace()):  # no double space where markup was
            text = text.lstrip()
        if text:
            plain.append(text)
            size += len(text)
            separate = False

    def point(match: re.Match, placeholder: bool) -> None:
        nonlocal separate
        start, end = match.span()
        before = start == 0 or line[start - 1].isspace()
        after = end == len(line) or line[end].isspace()
        points.append(_Point(match.group(0), size, parent, placeholder, before, after, "start" if not size else None))
        order.append(start)
        separate = separate or not placeholder

    position = 0
    for match in _TOKEN.finditer(line):
        add(line[position : match.start()])
        position = match.end()
        parent = stack[-1] if stack else None
        entity = match["entity"]
        if entity and html.unescape(entity) == entity:  # `&name;` that no HTML entity has: text
            entity = None
        if match["stray"] or (match["entity"] and not entity):
            strays.append(f"a {match.group(0)[0]!r} that starts no {'tag' if match['stray'] == '<' else 'entity'} "
                          f"at character {match.start() + 1}")  # fmt: skip
            add(match.group(0))
            continue
        marked = True
        if entity:
            character = html.unescape(entity)
            if character.isspace():
                uses_html |= entity[1:-1] not in _XML_ENTITIES and not entity.startswith("&#")
                add(" ")
                joints.append((_Joint(entity, size), parent, match.start()))
            else:
                add(character)
        elif match["placeholder"] or match["literal"]:
            point(match, True)
        elif match["comment"]:
            point(match, False)
        elif match["empty"] or (not match["close"] and match["name"].lower() in _VOID):
            uses_html |= not match["empty"]
            point(match, False)
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
    text = "".join(plain).rstrip()
    for item in points:
        if item.at >= len(text) and item.edge is None:
            item.edge = "end"
    between = []
    for joint, parent, start in joints:  # a space entity at the line's edge has no words to go between: a point
        if 0 < joint.at < len(text):
            between.append(joint)
            continue
        end = start + len(joint.text)
        before, after = start == 0 or line[start - 1].isspace(), end == len(line) or line[end].isspace()
        points.append(_Point(joint.text, joint.at, parent, False, before, after, "start" if not joint.at else "end"))
        order.append(start)
    points = [item for _, item in sorted(zip(order, points, strict=True), key=lambda pair: pair[0])]
    return MarkupPlan(line, text, pairs, points, None, marked, between, uses_html, strays)


def take_out_markup(lines: Sequence[str], first_line: int = 1) -> list[MarkupPlan]:
    """`parse_markup` of each line, a warning naming each broken one, and each stray `<` or `&` of a line with markup
    (lines numbered from `first_line`)."""
    plans = [parse_markup(line) for line in lines]
    for number, plan in enumerate(plans, first_line):
        if plan.broken:
            logger.warning("line %d: broken markup (%s): translated as plain text", number, plan.broken)
        elif plan.marked:
            for stray in plan.strays:
                logger.warning("line %d: %s: read as text, the markup kept", number, stray)
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


def _runs(words: Sequence[int]) -> list[list[int]]:
    """Sorted `words` cut into runs of consecutive numbers."""
    runs: list[list[int]] = []
    for k in words:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


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
    soft = soft if soft is not None and soft.numel() and soft.shape[0] == len(words) else None
    n = len(words)

    def covered(start: int, end: int) -> list[int]:
        return [k for k, (a, b) in enumerate(spans) if a < end and b > start]

    def first_target(k: int) -> int | None:
        """The first target word of source word k, or of the nearest linked one."""
        linked = targets.get(k) or _nearest_targets([k], targets, len(spans))
        return linked[0] if linked else None

    def after_word(at: int) -> int:
        """After the first target word of the source word that ends before character `at` (or of the nearest linked
        one); 0 where there is none."""
        before = [k for k, (a, b) in enumerate(spans) if b <= at]
        t = first_target(before[-1]) if before else None
        return 0 if t is None else t + 1

    # Target spans [first, last] (first = last + 1: empty, before word `first`), parents before children.
    span: dict[int | None, tuple[int, int]] = {None: (0, n - 1)}
    taken: dict[int | None, set[int]] = {}  # the target words of each pair's children so far
    for index, pair in enumerate(plan.pairs):
        low, high = span[pair.parent]
        held = taken.setdefault(pair.parent, set())
        content = covered(pair.start, pair.end)
        linked = {t for k in content for t in targets.get(k, [])}
        columns = [k for k in content if soft is not None and k < soft.shape[1]]  # past them: cut from the source
        linked |= {int(soft[:, k].argmax()) for k in columns if soft[:, k].max() > 0}
        free = [t for t in sorted(linked) if low <= t <= high and t not in held]
        if free:  # the longest run of its aligned words; a tie to the one with more of its content's attention
            run = max(_runs(free), key=lambda run, c=columns: (len(run), float(soft[run][:, c].sum()) if c else 0.0))
            first, last = run[0], run[-1]
        elif content and (anchor := min(linked) if linked else first_target(content[0])) is not None:
            # never empty: the free word nearest to its aligned (or its nearest source word's) target word
            options = [t for t in range(low, high + 1) if t not in held]
            first = last = min(options, key=lambda t: (abs(t - anchor), t)) if options else high + 1
            if not options:
                last = first - 1
        else:  # no words inside (or no links at all): empty, where a self-closing tag would go
            first = min(max(after_word(pair.start), low), high + 1)
            while first in held:
                first += 1
            last = first - 1
        span[index] = (first, last)
        held.update(range(first, last + 1))

    def punctuated(item: _Point, low: int, high: int) -> int | None:
        """After the target word that ends in the mark the point follows (the k-th, as in the source), if any."""
        if item.before or not item.at or plan.text[item.at - 1] not in _PUNCTUATION:
            return None
        mark = plan.text[item.at - 1]
        count = sum(plan.text[b - 1] == mark for a, b in spans if b <= item.at)
        ending = [t for t, word in enumerate(words) if word.endswith(mark)]
        if len(ending) != sum(plan.text[b - 1] == mark for a, b in spans) or count > len(ending):
            return None
        place = ending[count - 1] + 1
        return place if low <= place <= high + 1 else None

    def boundary(item: _Point) -> int:
        """Where a point goes: before target word `boundary` (n: at the end)."""
        low, high = span[item.parent]
        if item.edge == "start":
            return low
        if item.edge == "end":
            return high + 1
        place = punctuated(item, low, high)
        if place is None:
            after = [k for k, (a, b) in enumerate(spans) if a >= item.at]
            if item.before and (item.placeholder or not item.after) and after:  # before the word after it
                t = first_target(after[0])
                place = low if t is None else t
            else:
                place = after_word(item.at)
        return min(max(place, low), high + 1)

    def spaced(item: _Point, place: int) -> _Point:
        """`item`, with a space where the source glued it to a word whose translation starts or ends otherwise."""
        after = [a for a, b in spans if a >= item.at] if not item.after else []
        before = [b for a, b in spans if b <= item.at] if not item.before else []
        if after and place < n and words[place][:1] != plan.text[after[0]]:
            item = dataclasses.replace(item, after=True)
        if before and 0 < place and words[place - 1][-1:] != plan.text[before[-1] - 1]:
            item = dataclasses.replace(item, before=True)
        return item

    children: dict[int | None, list] = {}
    for index, pair in enumerate(plan.pairs):
        children.setdefault(pair.parent, []).append((span[index][0], 1, index))
    for item in plan.points:
        place = boundary(item)
        item = spaced(item, place)
        for index, pair in enumerate(plan.pairs):  # a point that would fall inside a sibling pair goes after it
            first, last = span[index]
            if pair.parent == item.parent and first < place <= last:
                place = last + 1
        children.setdefault(item.parent, []).append((place, 2 if item.edge == "end" else 0, item))  # the end: last
    joints: dict[int, str] = {}
    for joint in plan.joints:
        after = [k for k, (a, b) in enumerate(spans) if a >= joint.at]
        t = first_target(after[0]) if after else None
        if t is None or t == 0:
            before = [k for k, (a, b) in enumerate(spans) if b <= joint.at]
            t = (first_target(before[-1]) or 0) + 1 if before else None
        if t is not None and 0 < t < n:
            joints[t] = joints.get(t, "") + joint.text
    return _render(plan, words, span, children, joints)


def _render(plan: MarkupPlan, words: list[str], span: dict, children: dict, joints: dict[int, str]) -> str:
    """The target `words` with `plan`'s pairs around their `span`s and the `children` (pairs and points, by the
    target word they go before) in place, nested as in the source; `joints`: the space entity written before a
    target word instead of its space."""
    pieces: list[tuple[str, str, object]] = []  # (kind: word, open, close, point; text; the word's index or point)

    def emit_words(start: int, stop: int) -> None:
        for k in range(start, stop):
            pieces.append(("word", html.escape(words[k], quote=False), k))

    def render(node: int | None) -> None:
        first, last = span[node]
        cursor = first
        for place, _, item in sorted(children.get(node, []), key=lambda c: (c[0], c[1])):
            emit_words(cursor, max(cursor, place))
            cursor = max(cursor, place)
            if isinstance(item, _Point):
                pieces.append(("point", item.text, item))
                continue
            pair = plan.pairs[item]
            pieces.append(("open", pair.open, None))
            render(item)
            pieces.append(("close", pair.close, None))
            cursor = max(cursor, span[item][1] + 1)
        emit_words(cursor, last + 1)

    render(None)
    separators = []
    for i, (kind, _, item) in enumerate(pieces):
        previous = pieces[i - 1] if i else None
        if previous is None or kind == "close" or previous[0] == "open":
            separators.append("")
        elif previous[0] == "point":
            separators.append(" " if previous[2].after else "")
        elif kind == "point":
            separators.append(" " if item.before else "")
        else:
            separators.append(" ")
    for i, (kind, _, item) in enumerate(pieces):
        if kind == "word" and item in joints:  # in place of the space before the word (before its opening tags)
            j = i
            while j > 0 and not separators[j] and pieces[j - 1][0] == "open":
                j -= 1
            separators[j] = joints[item]
    return "".join(separator + text for separator, (_, text, _) in zip(separators, pieces, strict=True)).strip()


def restore_markup(plans: Sequence[MarkupPlan], translations: Sequence) -> list[str]:
    """`restore` of each line."""
    return [restore(plan, translation) for plan, translation in zip(plans, translations, strict=True)]


def tags(text: str) -> list[str]:
    """The tags of a line, in order, as written."""
    return [match["tag"] for match in _TOKEN.finditer(text) if match["tag"]]


def placeholders(text: str) -> list[str]:
    """The placeholders and format literals (`%%`, `{{`, `}}`) of a line, in order, as written."""
    return [match.group(0) for match in _TOKEN.finditer(text) if match["placeholder"] or match["literal"]]


def comments(text: str) -> list[str]:
    """The comments and CDATA sections of a line, in order, as written."""
    return [match["comment"] for match in _TOKEN.finditer(text) if match["comment"]]


def _as_xml(text: str) -> str:
    """HTML's void tags closed (`<br>` -> `<br/>`) and its named entities as character references."""

    def xml(match: re.Match) -> str:
        if match["tag"] and not match["close"] and not match["empty"] and match["name"].lower() in _VOID:
            return match["tag"][:-1].rstrip() + "/>"
        entity = match["entity"]
        if entity and not entity.startswith("&#") and entity[1:-1] not in _XML_ENTITIES:
            character = html.unescape(entity)
            return "".join(f"&#{ord(c)};" for c in character) if character != entity else entity
        return match.group(0)

    return _TOKEN.sub(xml, text)


def well_formed(text: str, html: bool = False) -> bool:
    """Whether `text` is well-formed XML content (elements balanced, `&` only in entities XML knows); `html=True`:
    well-formed HTML, as XML but HTML's void tags may go without the slash and its named entities are known."""
    try:
        ElementTree.fromstring(f"<line>{_as_xml(text) if html else text}</line>")
    except ElementTree.ParseError:
        return False
    return True


__all__ = [
    "MarkupPlan",
    "comments",
    "parse_markup",
    "placeholders",
    "restore",
    "restore_markup",
    "tags",
    "take_out_markup",
    "well_formed",
]
