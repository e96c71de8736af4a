"""Inline markup carried through translation by word alignment (`translate(..., markup="xml")`, `--markup xml`).

A line is read as XML or HTML text with inline elements (docs/markup.md):

1. Taken out of the text: tags (`<b>`, `<a href="...">`, `<span ...>`; void tags: self-closing `<br/>`, and HTML's
   `<br>`, `<img ...>`, `<hr>`, `<wbr>`, `<input ...>` written without the slash), comments (`<!-- ... -->`) and
   CDATA sections, placeholders (format directives by their grammars, directives.py: `%s`, `%.250s`, `%1$lu`,
   `%(name)s`, `{0}`, `{name!r:>10}`, `{{name}}`, and with a gettext flag Qt's `%1`, shell's `$VAR`) and literals
   `%%`, `{{`, `}}`; a word of placeholders and literals with punctuation only (`"%s.%s"`, `'%s'`, `(%d)`) is one
   point, as written. Entities become their characters; space entities (`&nbsp;`, `&#160;`, `&thinsp;`, ...) become
   spaces. A void tag, comment or CDATA section separates the words around it. What is left, the plain text, is
   translated with hard word alignments (alignments.py; words are whitespace-separated). A `<` that starts no tag
   and a `&` that starts no entity are text.
2. Each tag pair goes back, its tag text unchanged (attributes and all), around the longest contiguous run of target
   words that the span rule (spans.py: each content word's most-attending target word) aligns to the source words
   its content touches; a tie goes to the run with more of the content's attention. A pair that holds a forced term
   wraps the words the search placed for that term and the aligned runs next to them (an unmet term: the rule
   alone). A pair inside another stays inside it; siblings never overlap. A pair with content is never empty: where
   its content aligns to nothing (or only to words its parent does not hold or an earlier sibling holds), it goes
   around the nearest free word (to the target words of the nearest source word that has a link, left first at
   equal distance).
3. Points (void tags, comments, CDATA, placeholders, literals): at the start or end of the line they stay there; one
   written right after punctuation goes after the target word that ends in the same mark (the k-th such word, as in
   the source, where source and target have as many); one written against the word before it (`100%%`) follows that
   word's first target word, one against the word after it (`{{x`) goes before that word's first target word; else
   a placeholder goes before the first target word of the source word after it, any other point after the first
   target word of the source word before (or holding) it. Each comes out exactly once, written as in the source,
   with the spaces the source had around it; directives without a number (`%s`, `{}`) in their source order.
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
import functools
import html
import logging
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass, field

from vaswani_mt.inference.directives import PLAIN, UnplacedDirectives, directives, escape_word, glue, in_order, patterns
from vaswani_mt.inference.spans import SPAN_RULE, Alignment, pair_spans

logger = logging.getLogger(__name__)

_NAME = r"[A-Za-z_][\w:.-]*"
_ATTRIBUTES = r"""(?:\s+[^\s<>"'/=]+(?:\s*=\s*(?:"[^"<]*"|'[^'<]*'|[^\s"'<>=`]+))?)*"""


@functools.lru_cache(maxsize=64)
def _token(formats: frozenset[str] = PLAIN, xml: bool = True) -> re.Pattern:
    """The tokens of a line: tags, comments, entities and stray `<`, `&` (with `xml`), the literals and directives of
    `formats` (directives.py)."""
    directive, literal = patterns(formats)
    markup = (r"(?P<comment><!--.*?-->|<!\[CDATA\[.*?\]\]>)"
              rf"|(?P<tag><(?P<close>/?)(?P<name>{_NAME})(?P<attrs>{_ATTRIBUTES})\s*(?P<empty>/?)>)"
              r"|(?P<entity>&(?:#\d+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);)")  # fmt: skip
    if not xml:
        markup = "(?P<comment>(?!))|(?P<tag>(?!)(?P<close>)(?P<name>)(?P<attrs>)(?P<empty>))|(?P<entity>(?!))"
    stray = "[<&]" if xml else "(?!)"
    return re.compile(f"{markup}|(?P<literal>{literal})|(?P<placeholder>{directive})|(?P<stray>{stray})")


_TOKEN = _token()
_VOID = {"br", "img", "hr", "wbr", "input"}  # HTML elements without content, written without `/>`
_XML_ENTITIES = {"amp", "lt", "gt", "quot", "apos"}
_PUNCTUATION = ".,;:!?"


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
    formats: frozenset[str] = PLAIN
    xml: bool = True
    terms: list[str] = field(default_factory=list)  # forced into its translation: no point goes between their words
    sources: list[str | None] = field(default_factory=list)  # each term's source phrase (None: not given)


@dataclass
class _Reader:
    """One line read left to right: the plain text so far (`plain`, `size` characters), the markup found in it, the
    pairs still open (`stack`); `separate`: a void tag, comment or CDATA was just read, so the next word is apart."""

    line: str
    plain: list[str] = field(default_factory=list)
    size: int = 0
    pairs: list[_Pair] = field(default_factory=list)
    points: list[_Point] = field(default_factory=list)
    order: list[int] = field(default_factory=list)  # the points' offsets in the line
    joints: list[tuple[_Joint, int | None, int]] = field(default_factory=list)  # with its parent and line offset
    stack: list[int] = field(default_factory=list)
    strays: list[str] = field(default_factory=list)
    marked: bool = False
    html: bool = False
    separate: bool = False

    def add_text(self, text: str) -> None:
        """`text` appended to the plain text, spaced as the markup taken out of it asks."""
        if self.separate and self.plain and text and not self.plain[-1][-1:].isspace() and not text[:1].isspace():
            text = " " + text  # a void tag, comment or CDATA between two words separates them
        if not self.plain or (self.plain[-1][-1:].isspace() and text[:1].isspace()):  # no double space where markup was
            text = text.lstrip()
        if text:
            self.plain.append(text)
            self.size += len(text)
            self.separate = False

    def add_point(self, match: re.Match, placeholder: bool) -> None:
        """The markup `match` as a point at the end of the plain text so far."""
        start, end = match.span()
        before, after = self._spaces_around(start, end)
        edge = "start" if not self.size else None
        self.points.append(_Point(match.group(0), self.size, self._parent(), placeholder, before, after, edge))
        self.order.append(start)
        self.separate = self.separate or not placeholder

    def read(self, match: re.Match) -> str | None:
        """One token of `_TOKEN` read into the plan; why the line is broken, or None."""
        entity = match["entity"]
        if entity and html.unescape(entity) == entity:  # `&name;` that no HTML entity has: text
            entity = None
        if match["stray"] or (match["entity"] and not entity):
            self.strays.append(f"a {match.group(0)[0]!r} that starts no {'tag' if match['stray'] == '<' else 'entity'} "
                               f"at character {match.start() + 1}")  # fmt: skip
            self.add_text(match.group(0))
            return None
        self.marked = True
        if entity:
            self._read_entity(entity, match.start())
        elif match["placeholder"] or match["literal"]:
            self.add_point(match, True)
        elif match["comment"]:
            self.add_point(match, False)
        elif match["empty"] or (not match["close"] and match["name"].lower() in _VOID):
            self.html |= not match["empty"]
            self.add_point(match, False)
        else:
            return self._read_tag(match)
        return None

    def _parent(self) -> int | None:
        return self.stack[-1] if self.stack else None

    def _spaces_around(self, start: int, end: int) -> tuple[bool, bool]:
        """Whether the line has a space (or its edge) before character `start` and at character `end`."""
        return start == 0 or self.line[start - 1].isspace(), end == len(self.line) or self.line[end].isspace()

    def _read_entity(self, entity: str, start: int) -> None:
        """Its character into the plain text; a space entity as a space, kept as a joint to write back."""
        character = html.unescape(entity)
        if character.isspace():
            self.html |= entity[1:-1] not in _XML_ENTITIES and not entity.startswith("&#")
            self.add_text(" ")
            self.joints.append((_Joint(entity, self.size), self._parent(), start))
        else:
            self.add_text(character)

    def _read_tag(self, match: re.Match) -> str | None:
        """An opening tag opens a pair, a closing tag closes the innermost; why the line is broken, or None."""
        if not match["close"]:
            self.pairs.append(_Pair(match["tag"], match["name"], self._parent(), self.size))
            self.stack.append(len(self.pairs) - 1)
        elif not self.stack or self.pairs[self.stack[-1]].name != match["name"]:
            return f"</{match['name']}> closes a tag that is not open"
        else:
            self.pairs[self.stack[-1]].end, self.pairs[self.stack[-1]].close = self.size, match["tag"]
            self.stack.pop()
        return None

    def joints_between_words(self, text: str) -> list[_Joint]:
        """The space entities between two words of `text`; one at the line's edge has no words to go between, so it
        becomes a point there."""
        between = []
        for joint, parent, start in self.joints:
            if 0 < joint.at < len(text):
                between.append(joint)
                continue
            before, after = self._spaces_around(start, start + len(joint.text))
            edge = "start" if not joint.at else "end"
            self.points.append(_Point(joint.text, joint.at, parent, False, before, after, edge))
            self.order.append(start)
        return between


def parse_markup(line: str, formats: frozenset[str] = PLAIN, xml: bool | str = True) -> MarkupPlan:
    """`line` taken apart (the module's docstring); a broken line's plan says why and translates the line whole.
    `formats`: the format directives it may hold (directives.py); `xml=False`: directives only, no tags or entities
    (a gettext entry without `--markup xml`); "tagged": XML only where it has tags, comments or entities."""
    reader = _Reader(line, marked=formats != PLAIN)  # a gettext flag: what the model writes is escaped
    if xml == "tagged":
        xml = any(m["tag"] or m["comment"] or m["entity"] for m in _token(frozenset()).finditer(line))
    position = 0
    for match in glue(line, _token(formats, xml).finditer(line)):
        start, end = match.span()
        reader.add_text(line[position:start])
        position = end
        if not isinstance(match, re.Match):  # a `Glued` word: one point
            reader.marked = True
            reader.add_point(match, True)
        elif broken := reader.read(match):
            return MarkupPlan(line, line, broken=broken)
    reader.add_text(line[position:])
    if reader.stack:
        return MarkupPlan(line, line, broken=f"<{reader.pairs[reader.stack[-1]].name}> is not closed")
    if not reader.marked:  # translated exactly as without markup
        return MarkupPlan(line, line)
    text = "".join(reader.plain).rstrip()
    for item in reader.points:  # after the last word: at the line's end
        if item.at >= len(text) and item.edge is None:
            item.edge = "end"
    between = reader.joints_between_words(text)
    points = [item for _, item in sorted(zip(reader.order, reader.points, strict=True), key=lambda pair: pair[0])]
    return MarkupPlan(line, text, reader.pairs, points, None, reader.marked, between, reader.html, reader.strays,
                      formats, xml)  # fmt: skip


def take_out_markup(lines: Sequence[str], first_line: int = 1, formats: Sequence | None = None,
                    xml: bool = True) -> list[MarkupPlan]:  # fmt: skip
    """`parse_markup` of each line (with its `formats`, a frozenset per line, None: `PLAIN`, text), a warning naming
    each broken one, and each stray `<` or `&` of a line with markup (lines numbered from `first_line`). A line with
    formats of its own (a gettext entry) is XML only where it has tags, comments or entities."""
    formats = formats if formats is not None else [None] * len(lines)
    plans = [parse_markup(line, kinds or PLAIN, xml and ("tagged" if kinds is not None else True))
             for line, kinds in zip(lines, formats, strict=True)]  # fmt: skip
    for number, plan in enumerate(plans, first_line):
        if plan.broken:
            logger.warning("line %d: broken markup (%s): translated as plain text", number, plan.broken)
        elif plan.marked:
            for stray in plan.strays:
                logger.warning("line %d: %s: read as text, the markup kept", number, stray)
    return plans


def _after_punctuation(item: _Point, alignment: Alignment, low: int, high: int) -> int | None:
    """After the target word that ends in the mark the point follows (the k-th, as in the source), if any."""
    text, spans = alignment.text, alignment.spans
    if item.before or not item.at or text[item.at - 1] not in _PUNCTUATION:
        return None
    if not any(b == item.at for a, b in spans):  # the mark is inside a word (`a.%s.b`), not at its end
        return None
    mark = text[item.at - 1]
    count = sum(text[b - 1] == mark for a, b in spans if b <= item.at)
    ending = [t for t, word in enumerate(alignment.words) if word.endswith(mark)]
    if len(ending) != sum(text[b - 1] == mark for a, b in spans) or not 0 < count <= len(ending):
        return None
    place = ending[count - 1] + 1
    return place if low <= place <= high + 1 else None


def _point_place(item: _Point, alignment: Alignment, low: int, high: int) -> int:
    """Where a point goes in its parent's [low, high]: before target word `_point_place` (high + 1: at the end)."""
    if item.edge == "start":
        return low
    if item.edge == "end":
        return high + 1
    place = _after_punctuation(item, alignment, low, high)
    if place is None:
        after = alignment.words_after(item.at)
        if item.before and (item.placeholder or not item.after) and after:  # before the word after it
            t = alignment.first_target(after[0])
            place = low if t is None else t
        else:
            place = alignment.after_word(item.at)
    return min(max(place, low), high + 1)


def _spaced(item: _Point, place: int, alignment: Alignment) -> _Point:
    """`item`, with a space where the source glued it to a word whose translation starts or ends otherwise."""
    text, spans, words = alignment.text, alignment.spans, alignment.words
    if any(a < item.at < b for a, b in spans):  # inside a word (`file%sname`): after its translation, spaced
        item = dataclasses.replace(item, after=True)
    after = [a for a, b in spans if a >= item.at] if not item.after else []
    before = [b for a, b in spans if b <= item.at] if not item.before else []
    if after and place < len(words) and words[place][:1] != text[after[0]]:
        item = dataclasses.replace(item, after=True)
    if before and 0 < place and words[place - 1][-1:] != text[before[-1] - 1]:
        item = dataclasses.replace(item, before=True)
    return item


def _placed_children(plan: MarkupPlan, alignment: Alignment, span: dict) -> dict[int | None, list]:
    """Each pair's children (pairs and points) as (target word it goes before, order among equals, child)."""
    children: dict[int | None, list] = {}
    for index, pair in enumerate(plan.pairs):
        children.setdefault(pair.parent, []).append((span[index][0], 1, index))
    for item in plan.points:
        place = _point_place(item, alignment, *span[item.parent])
        item = _spaced(item, place, alignment)
        for index, pair in enumerate(plan.pairs):  # a point that would fall inside a sibling pair goes after it
            first, last = span[index]
            if pair.parent == item.parent and first < place <= last:
                place = last + 1
        place = _past_terms(place, alignment, plan.terms, span[item.parent][1] + 1)
        children.setdefault(item.parent, []).append((place, 2 if item.edge == "end" else 0, item))  # the end: last
    return children


def _past_terms(place: int, alignment: Alignment, terms: Sequence[str], end: int) -> int:
    """`place`, or the end of a forced term whose words it would split (where that is at most `end`): the words the
    search placed for it, or where it did not say, the term's words found in the translation."""
    for placed in alignment.placed:
        if placed is not None and placed[0] < place <= placed[-1] < end:
            return placed[-1] + 1
    words = alignment.words
    for term in map(str.split, terms):
        for start in range(max(0, place - len(term) + 1), place):
            if words[start : start + len(term)] == term and place < start + len(term) <= end:
                return start + len(term)
    return place


def _placed_joints(plan: MarkupPlan, alignment: Alignment) -> dict[int, str]:
    """The space entities by the target word they go before (instead of its space): the first target word of the
    source word after each, else after the first target word of the source word before it."""
    joints: dict[int, str] = {}
    for joint in plan.joints:
        after = alignment.words_after(joint.at)
        t = alignment.first_target(after[0]) if after else None
        if t is None or t == 0:
            before = alignment.words_before(joint.at)
            t = (alignment.first_target(before[-1]) or 0) + 1 if before else None
        if t is not None and 0 < t < len(alignment.words):
            joints[t] = joints.get(t, "") + joint.text
    return joints


def restore(plan: MarkupPlan, translation, rule: str = SPAN_RULE) -> str:
    """The translation of `plan.text` (an `AlignedTranslation` with hard links, and where terms were forced the
    words the search placed for them; `plan.sources`, their source phrases) with `plan`'s markup put back; `rule`:
    the span rule (spans.py)."""
    if plan.broken or not plan.marked:
        return str(translation)
    alignment = Alignment.of(plan.text, translation, plan.sources)
    span = pair_spans(plan.pairs, alignment, rule)
    children = _placed_children(plan, alignment, span)
    output = _render(plan, alignment.words, span, children, _placed_joints(plan, alignment))
    if sorted(directives(output, plan.formats, False)) != sorted(directives(plan.line, plan.formats, False)):
        words = [_escaped(plan, word) for word in alignment.words]
        raise UnplacedDirectives(" ".join([*words, *(item.text for item in plan.points)]) if not plan.pairs else None)
    return output


def put_back(plan: MarkupPlan, translation, rule: str = SPAN_RULE) -> tuple[str, str | None]:
    """The markup stage of one line, the same for the translator and the demo: (`restore`'s output, None); where the
    format directives could not all be placed, (the words with them at the end, "directives"); where putting the
    markup back fails otherwise, (the line as its source, why in one line): one line's failure stays that line's."""
    try:
        return restore(plan, translation, rule), None
    except UnplacedDirectives as unplaced:
        if unplaced.output is not None:
            return unplaced.output, "directives"
        error: Exception = unplaced
    except Exception as failed:  # any bug in putting one line's markup back
        error = failed
    return plan.line, f"{type(error).__name__}: {error}"


def _escaped(plan: MarkupPlan, word: str) -> str:
    """A target word as written: `&`, `<`, `>` escaped (XML), what would read as a directive made literal."""
    return escape_word(html.escape(word, quote=False) if plan.xml else word, plan.formats)


def _render(plan: MarkupPlan, words: list[str], span: dict, children: dict, joints: dict[int, str]) -> str:
    """The target `words` with `plan`'s pairs around their `span`s and the `children` (pairs and points, by the
    target word they go before) in place, nested as in the source; `joints`: the space entity written before a
    target word instead of its space."""
    pieces: list[tuple[str, str, object]] = []  # (kind: word, open, close, point; text; the word's index or point)

    def emit_words(start: int, stop: int) -> None:
        for k in range(start, stop):
            pieces.append(("word", _escaped(plan, words[k]), k))

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
    # Directives without a number take their arguments in order: they keep their source order, inside a tag or not
    # (each place keeps its spacing).
    slots = [i for i, (kind, _, item) in enumerate(pieces) if kind == "point" and in_order(item.text, plan.formats)]
    ordered = [item.text for item in plan.points if in_order(item.text, plan.formats)]  # the points: source order
    for i, text in zip(slots, ordered, strict=True):
        pieces[i] = ("point", text, pieces[i][2])
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


__all__ = ["MarkupPlan", "UnplacedDirectives", "comments", "parse_markup", "placeholders", "put_back", "restore",
           "restore_markup", "tags", "take_out_markup", "well_formed"]  # fmt: skip
