"""Gettext catalogs translated as localizers have them: a .pot (or a .po) in, a .po out (`translate.py --input
app.pot --output de.po`, docs/markup.md). Read and written with polib, entry by entry, so that what a translation
does not touch comes back as it was: msgctxt, translator and extracted comments, references, flags, previous
msgids, obsolete entries, the order.

- Each empty msgstr is filled (with `retranslate`, each fuzzy one too); a msgstr already there is kept.
- Each msgid is translated with its format directives kept exactly (directives.py, by the entry's flags: `c-format`,
  `python-format`, `python-brace-format`, `qt-format`, `sh-format`; without one, by the plain grammars); a msgid of
  several lines line by line, each line's leading and trailing spaces kept, so that msgfmt's checks of `\\n` hold.
- `msgid_plural`: msgstr[0] is the msgid's translation, every other form the plural's, as many as the target
  language's `Plural-Forms` has (the header is set for it: `Language`, `Plural-Forms`, UTF-8).
- Machine translations are marked `fuzzy`, gettext's flag for text no one has reviewed yet.
- An entry whose directives or markup could not be put back is left empty (and reported, `ControlReport.unrestored`).

`translate_catalog` does it in memory. The command splits it in two around its lines: `catalog_work` reads what to
translate from the input alone, `fill_catalog` writes the translations back, and between them the lines are
translated as a text file's are (resumable, in shards on several processes: cli/translate.py).
"""

from __future__ import annotations

import datetime
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from vaswani_mt.inference.controls import ControlReport
from vaswani_mt.inference.directives import Formatted, formats_of
from vaswani_mt.inference.terms import phrase_spans
from vaswani_mt.system.signals import TranslationInterrupted, interruptible

logger = logging.getLogger(__name__)

# GNU gettext's Plural-Forms by language (the gettext manual, "Plural forms"; CLDR agrees on these).
_PLURALS = {
    "nplurals=1; plural=0;": "ja ko zh vi th id ms lo km my",
    "nplurals=2; plural=(n != 1);": "en de nl sv da no nb nn fo is es it pt bg el fi et hu he eo ca gl eu af sq tr "
    "az ka hi bn ta te ur fa sw",
    "nplurals=2; plural=(n > 1);": "fr oc pt_BR",
    "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);": "ru uk "
    "be sr hr bs",
    "nplurals=3; plural=(n==1 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);": "pl",
    "nplurals=3; plural=((n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2);": "cs sk",
    "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && (n%100<10 || n%100>=20) ? 1 : 2);": "lt",
    "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n != 0 ? 1 : 2);": "lv",
    "nplurals=3; plural=(n==1 ? 0 : (n==0 || (n%100 > 0 && n%100 < 20)) ? 1 : 2);": "ro",
    "nplurals=4; plural=(n%100==1 ? 0 : n%100==2 ? 1 : n%100==3 || n%100==4 ? 2 : 3);": "sl",
}
PLURAL_FORMS = {language: forms for forms, languages in _PLURALS.items() for language in languages.split()}
_NPLURALS = re.compile(r"nplurals\s*=\s*(\d+)")


def plural_forms(language: str, header: str | None = None) -> str:
    """The `Plural-Forms` header of `language` (`pt_BR`, `de_AT` and `de` alike): the catalog's own (`header`) where
    it has a real one, else gettext's; ValueError, one line, for a language this table lacks."""
    if header and _NPLURALS.search(header):
        return header
    for key in (language, language.split("_")[0].split("-")[0]):
        if key in PLURAL_FORMS:
            return PLURAL_FORMS[key]
    raise ValueError(f"no Plural-Forms known for language {language!r}: give the catalog a 'Plural-Forms:' header")


def nplurals(forms: str) -> int:
    return int(_NPLURALS.search(forms).group(1))


@dataclass
class CatalogRun:
    """What `translate_catalog` did: the entries `filled`, those `kept` (translated already), those `failed` (left
    empty: their markup or directives could not be put back), the lines translated."""

    filled: int = 0
    kept: int = 0
    failed: list[str] = field(default_factory=list)
    lines: int = 0


def _todo(entry, retranslate: bool) -> bool:
    if entry.obsolete or not entry.msgid:
        return False
    empty = not any(entry.msgstr_plural.values()) if entry.msgid_plural else not entry.msgstr
    return empty or (retranslate and entry.fuzzy)


def _pieces(text: str) -> list[tuple[str, str, str]]:
    """A msgid as (leading space, text, trailing space) per line."""
    pieces = []
    for line in text.split("\n"):
        core = line.strip()
        lead = line[: len(line) - len(line.lstrip())]
        pieces.append((lead, core, line[len(lead) + len(core) :]))
    return pieces


@dataclass
class CatalogWork:
    """What a catalog asks to translate, read from it alone (so every process and every rerun reads the same): the
    entries `todo`, their `lines` (`Formatted`, one per msgid line with text) with each line's glossary `terms` (None:
    no glossary), `places` (entry, which text, leading and trailing space, line index or None), the target's plural
    `forms`, and how many entries are `kept`."""

    todo: list
    lines: list
    terms: list | None
    places: list
    forms: str
    kept: int


def catalog_work(catalog, language: str, *, retranslate: bool = False,
                 glossary: Sequence[tuple[str, str]] = ()) -> CatalogWork:  # fmt: skip
    """The `CatalogWork` of `catalog` (a `polib.POFile`) for target `language` (ValueError, one line, where its
    Plural-Forms are unknown)."""
    forms = plural_forms(language, catalog.metadata.get("Plural-Forms"))
    todo = [entry for entry in catalog if _todo(entry, retranslate)]
    kept = sum(1 for entry in catalog if entry.msgid and not entry.obsolete) - len(todo)
    lines, places = [], []  # places: (entry, which text, piece), which: None for msgid, "plural" for msgid_plural
    for entry in todo:
        formats = formats_of(entry.flags)
        for which, text in ((None, entry.msgid), ("plural", entry.msgid_plural)):
            if which == "plural" and not entry.msgid_plural:
                continue
            for lead, core, trail in _pieces(text):  # an empty line (a msgid's end "\n") is not translated
                places.append((entry, which, lead, trail, len(lines) if core else None))
                lines += [Formatted(core, formats)] if core else []
    terms = [glossary_terms(line, glossary) for line in lines] if glossary else None
    return CatalogWork(todo, lines, terms, places, forms, kept)


def fill_catalog(catalog, work: CatalogWork, language: str, outputs: Sequence, failed_lines: set[int]) -> CatalogRun:
    """`catalog` filled in place from the translations of `work.lines` (`outputs`, in order; those of the entries
    finished, where fewer), but the entries with a line in `failed_lines` (from 1), and its header set for
    `language`."""
    run = CatalogRun(kept=work.kept, lines=len(work.lines))
    _fill(run, work.todo, work.places, list(outputs), failed_lines, nplurals(work.forms))
    _set_header(catalog, language, work.forms)
    return run


def translate_catalog(translator, catalog, language: str, *, retranslate: bool = False,
                      report: ControlReport | None = None, progress: bool = False,
                      glossary: Sequence[tuple[str, str]] = ()) -> CatalogRun:  # fmt: skip
    """Fills `catalog` (a `polib.POFile`) in place with `translator`'s translations (the module's docstring), for
    target `language`. The translator's `markup` must be set ("directives", or "xml" for entries with tags).
    `glossary`: (source term, target term) pairs; each line that has a source term (a whole word or phrase, any case)
    gets its target term as a constraint (docs/constraints.md), as a tabbed line of `--constraints` would, with its
    source term, so that a tag around the source term wraps the target term."""
    work = catalog_work(catalog, language, retranslate=retranslate, glossary=glossary)
    report = report if report is not None else ControlReport()
    before = set(report.unrestored)
    outputs: list = []
    try:
        _translate(translator, work.lines, outputs, report, progress, work.terms)
    except TranslationInterrupted as stop:  # the entries whose lines are all done are filled: a rerun continues
        stop.run = fill_catalog(catalog, work, language, outputs + list(stop.done), set(report.unrestored) - before)
        raise
    return fill_catalog(catalog, work, language, outputs, set(report.unrestored) - before)


def glossary_terms(line: str, glossary: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The `glossary` entries, (source term, target term), whose source term `line` has (a whole word or phrase, any
    case): terms with their source side (terms.py), so a tag around the source term wraps the target term."""
    return [(source, target) for source, target in glossary if phrase_spans(line, source)]


def read_glossary(path: str) -> list[tuple[str, str]]:
    """`source term<TAB>target term` per line of a UTF-8 file (blank lines and `#` comments skipped); ValueError,
    one line, naming the first line that is not."""
    try:
        with open(path, encoding="utf-8") as f:
            rows = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read the glossary {path}: {error}") from error
    pairs = []
    for number, row in enumerate(rows, 1):
        if not row.strip() or row.startswith("#"):
            continue
        parts = [part.strip() for part in row.split("\t")]
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{path}:{number}: a glossary line is 'source term<TAB>target term', got {row!r}")
        pairs.append((parts[0], parts[1]))
    return pairs


def _translate(translator, lines: list, outputs: list, report: ControlReport, progress: bool, terms) -> None:
    """The translations of `lines` (with their `terms`, or None) appended to `outputs` as they come; a stop (SIGINT,
    SIGTERM) raises `TranslationInterrupted` with `done`, the finished lines after them, up to the first unfinished
    one."""
    stream = translator.translate_iterable(lines, terms=terms, report=report, progress=progress)
    try:
        while True:
            with interruptible():
                output = next(stream, _END)
            if output is _END:
                return
            outputs.append(output)
    except TranslationInterrupted as stop:
        if stream.gi_frame is not None:  # stopped between lines: the translator gives the rest of its chunk
            try:
                stream.throw(stop)
            except TranslationInterrupted:
                pass
        raise


_END = object()


def _fill(run: CatalogRun, todo: list, places: list, outputs: list, failed_lines: set[int], count: int) -> None:
    """Each entry of `todo` whose lines are all among `outputs` filled and marked fuzzy, but those with a line that
    `failed_lines` has (numbered from 1): those stay empty."""
    texts: dict[tuple[int, str | None], list[str]] = {}
    missing, failed = set(), set()
    for entry, which, lead, trail, k in places:
        if k is not None and k >= len(outputs):
            missing.add(id(entry))
            continue
        # a line reported as failed (markup not put back, or refused by its terms: empty) leaves its entry empty
        failed |= {id(entry)} if k is not None and (k + 1 in failed_lines or not str(outputs[k])) else set()
        texts.setdefault((id(entry), which), []).append(lead + ("" if k is None else str(outputs[k])) + trail)
    for entry in todo:
        if id(entry) in missing:
            continue
        if id(entry) in failed:
            run.failed.append(entry.msgid)
            continue
        singular = "\n".join(texts[(id(entry), None)])
        if entry.msgid_plural:
            plural = "\n".join(texts[(id(entry), "plural")])
            entry.msgstr_plural = {k: singular if k == 0 and count > 1 else plural for k in range(count)}
        else:
            entry.msgstr = singular
        if "fuzzy" not in entry.flags:
            entry.flags.append("fuzzy")
        run.filled += 1


def _set_header(catalog, language: str, forms: str) -> None:
    """The header for the target language: Language, Plural-Forms, UTF-8, the revision date; a template's `fuzzy`
    header flag dropped (msgfmt would ignore the header, charset and all)."""
    metadata = catalog.metadata
    metadata["Language"] = language
    metadata["Plural-Forms"] = forms
    metadata["Content-Type"] = "text/plain; charset=UTF-8"
    metadata["Content-Transfer-Encoding"] = "8bit"
    # SOURCE_DATE_EPOCH (reproducible-builds.org), where set: a run's bytes then depend on its input alone.
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch else datetime.datetime.now(
        datetime.timezone.utc)  # fmt: skip
    metadata["PO-Revision-Date"] = now.strftime("%Y-%m-%d %H:%M+0000")
    metadata.setdefault("MIME-Version", "1.0")
    metadata["X-Generator"] = "vaswani_mt (machine translation: every entry it filled is fuzzy)"
    catalog.metadata_is_fuzzy = False
    catalog.encoding = "utf-8"


def read_catalog(path: str):
    """The catalog at `path` (a .po or .pot), read by polib; ValueError, one line, where it cannot be."""
    try:
        import polib
    except ImportError as error:
        raise ValueError('a gettext catalog needs polib: pip install polib (or pip install -e ".[gettext]")') from error

    try:
        return polib.pofile(path, wrapwidth=78)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read the gettext catalog {path}: {error}") from error


def catalog_language(catalog, given: str | None, fallback: Sequence[str] = ()) -> str:
    """The target language: `given` (--language), else the catalog's `Language` header, else the first of `fallback`
    (the model card's); ValueError, one line, where none is known."""
    for language in (given, catalog.metadata.get("Language"), *fallback):
        if language and language.strip() and language.strip() != "LANGUAGE":
            return language.strip()
    raise ValueError("the target language of the catalog is unknown: give --language (e.g. --language de)")


__all__ = ["PLURAL_FORMS", "CatalogRun", "CatalogWork", "catalog_language", "catalog_work", "fill_catalog",
           "glossary_terms", "nplurals", "plural_forms", "read_catalog", "read_glossary",
           "translate_catalog"]  # fmt: skip
