"""Format directives by their formats' grammars (markup.py takes them out of a line and puts each back exactly once).

The formats are gettext's, named by an entry's flag without "-format":

- `c`: `%[argnum$][flags][width][.precision][length]conversion`, widths and precisions `*` or `*argnum$`, the
  conversions `diouxXeEfFgGaAcspnm` (`%m`: glibc's) and gettext's `<PRIu64>`-style macros in their place
  (`%<PRId64>`); `%%` is a literal;
- `python`: printf's forms and `%(name)s` (conversions `r` and `a` too); `%%` is a literal;
- `python-brace`: `{}`, `{0}`, `{name}`, `{name.attr[0]!r:>10}`; `{{` and `}}` are literals (in plain text a
  template's `{{name}}` is a placeholder);
- `qt`: `%1` to `%99`, `%L1`; `sh`: `$VAR`, `${VAR}`.

A line with no flag is read by the grammars of `PLAIN` (C without the space flag, so that `50% done` is text, Python's
`%(name)s`, the brace forms), as markup.py always read `%s`, `{0}`. A `%` that starts no directive is text.

Directives without a number (`%s`, `%*d`, `{}`) take their arguments in order: they keep their source order in the
translation (`in_order`); numbered and named ones may move. A target word the model writes with a `%` (or, in a
flagged brace entry, a brace) that would read as a directive gets it doubled (`escape_word`), so the translation
holds the source's directives and no others.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

FORMATS = ("c", "python", "python-brace", "qt", "sh")
PLAIN = frozenset({"c", "python", "python-brace"})

_ARG = r"(?:[1-9]\d*\$)?"
_FLAGS = r"[-+#0'I]*"
_STAR = rf"(?:\*{_ARG}|\d+)"
_LENGTH = r"(?:hh|h|ll|l|L|q|j|z|Z|t)?"
_PRI = r"<PRI[diouxX](?:(?:LEAST|FAST)?(?:8|16|32|64)|MAX|PTR)>"
_C = rf"%{_ARG}{_FLAGS}{_STAR}?(?:\.{_STAR}?)?(?:{_LENGTH}[diouxXeEfFgGaAcspnm]|{_PRI})"
_C_SPACE = _C.replace("[-+#0'I]", "[-+ #0'I]")  # a flagged entry: the space flag (`% d`) too
_PYTHON = r"%\([^()\s]*\)[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa]"
_PYTHON_PLAIN = r"%[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa]"
_FIELD = r"(?:\d+|[A-Za-z_]\w*)?(?:\.[A-Za-z_]\w*|\[[^\]{}]*\])*"
_BRACE = rf"\{{{_FIELD}(?:![rsa])?(?::[^{{}}]*)?\}}"
_TEMPLATE = r"\{\{\s*[\w.]+\s*\}\}"  # a template's `{{name}}` (plain text only: Python reads it as a literal)
_QT = r"%L?[1-9]\d?"
_SH = r"\$\{[A-Za-z_]\w*\}|\$[A-Za-z_]\w*"


def formats_of(flags: Iterable[str]) -> frozenset[str]:
    """The formats of an entry with gettext `flags` (`c-format`, `no-c-format`, `fuzzy`, ...): those it names, else
    `PLAIN` less those it refuses."""
    flags = set(flags)
    named = {name for name in FORMATS if f"{name}-format" in flags}
    return frozenset(named) if named else PLAIN - {name for name in FORMATS if f"no-{name}-format" in flags}


class Formatted(str):
    """A line that says which formats its directives follow (a gettext entry's `formats_of(flags)`): the translator
    reads it with those, any other line with `PLAIN`."""

    formats: frozenset[str]

    def __new__(cls, text: str, formats: frozenset[str] = PLAIN):
        line = super().__new__(cls, text)
        line.formats = formats
        return line


@functools.lru_cache(maxsize=64)
def patterns(formats: frozenset[str] = PLAIN) -> tuple[str, str]:
    """(directive, literal) regular expressions of `formats` (no groups of their own)."""
    flagged = formats != PLAIN
    directive = []
    if "python" in formats:
        directive.append(_PYTHON)
    if "c" in formats:
        directive.append(_C_SPACE if flagged else _C)
    if "python" in formats and flagged:
        directive.append(_PYTHON_PLAIN)
    if "python-brace" in formats:
        directive += [_BRACE] if flagged else [_TEMPLATE, _BRACE]
    if "qt" in formats:
        directive.append(_QT)
    if "sh" in formats:
        directive.append(_SH)
    literal = []
    if formats & {"c", "python"}:
        literal.append("%%")
    if "python-brace" in formats:
        literal.append(r"\{\{|\}\}" if flagged else r"\{\{(?!\s*[\w.]+\s*\}\})|\}\}")
    never = "(?!)"
    return "|".join(directive) or never, "|".join(literal) or never


@functools.lru_cache(maxsize=64)
def _compiled(formats: frozenset[str]) -> re.Pattern:
    directive, literal = patterns(formats)
    return re.compile(f"(?P<literal>{literal})|(?P<directive>{directive})")


def directives(text: str, formats: frozenset[str] = PLAIN, literals: bool = True) -> list[str]:
    """The directives (and `literals`: the literals) of `text`, in order, as written."""
    return [match.group(0) for match in _compiled(formats).finditer(text) if literals or match["directive"]]


def in_order(text: str, formats: frozenset[str] = PLAIN) -> bool:
    """Whether a point's `text` holds a directive that takes its argument in order (no number, no name: `%s`, `%*d`,
    `{}`, `{:>3}`): such points keep their source order."""
    for match in _compiled(formats).finditer(text):
        found = match["directive"] or ""
        if "$" not in found and re.fullmatch(f"{_C_SPACE}|{_PYTHON_PLAIN}|\\{{(?:[:!][^{{}}]*)?\\}}", found):
            return True
    return False


class UnplacedDirectives(ValueError):
    """A line whose format directives could not all be placed: `output`, its translation with every point at the
    end, in source order (None where it has tag pairs: it is written as its source)."""

    def __init__(self, output: str | None):
        super().__init__("format directives could not all be placed")
        self.output = output


@dataclass
class Glued:
    """Placeholders and literals glued into one word with nothing but punctuation (`"%s.%s"`, `'%.250s'`, `(%d)`):
    one point, its text as written (the model never sees the bare punctuation)."""

    start: int
    end: int
    text: str

    def span(self) -> tuple[int, int]:
        return self.start, self.end

    def group(self, _: int = 0) -> str:
        return self.text


def glue(line: str, matches: Iterable[re.Match]) -> list:
    """markup.py's token `matches` of `line`, with each word (no spaces) of placeholders, literals and punctuation
    only as one `Glued`."""
    words: dict[tuple[int, int], list] = {word.span(): [] for word in re.finditer(r"\S+", line)}
    tokens: list = []
    for match in matches:
        word = next(((a, b) for a, b in words if a <= match.start() and match.end() <= b), None)
        if word is None:  # a token with spaces in it (a tag's attributes, a comment)
            tokens.append(match)
            continue
        if not words[word]:
            tokens.append(word)  # where the word's tokens go
        words[word].append(match)
    glued: list = []
    for token in tokens:
        if not isinstance(token, tuple):
            glued.append(token)
            continue
        (start, end), inside = token, words[token]
        rest = "".join(line[a:b] for a, b in zip([start] + [m.end() for m in inside],
                                                 [m.start() for m in inside] + [end], strict=True))  # fmt: skip
        if (all(m["placeholder"] or m["literal"] for m in inside) and (rest or len(inside) > 1)
                and not any(c.isalnum() or c in "<&" for c in rest)):  # fmt: skip
            glued.append(Glued(start, end, line[start:end]))
        else:
            glued += inside
    return glued


def escape_word(word: str, formats: frozenset[str] = PLAIN) -> str:
    """A target word with what would read as a directive made literal: in a flagged C or Python entry every `%`
    doubled, in a flagged brace entry every brace; in plain text each `%` that starts a directive by the grammar
    (braces are left: doubled, `{x}` would read as a template's `{{x}}`)."""
    flagged = formats != PLAIN
    if formats & {"c", "python"}:
        if flagged:
            word = word.replace("%", "%%")
        else:
            word = re.sub(f"(?={_PYTHON}|{_C})%", "%%", word)
    if "python-brace" in formats and flagged:
        word = word.replace("{", "{{").replace("}", "}}")
    return word


__all__ = ["FORMATS", "PLAIN", "Formatted", "Glued", "UnplacedDirectives", "directives", "escape_word", "formats_of",
           "glue", "in_order", "patterns"]  # fmt: skip
