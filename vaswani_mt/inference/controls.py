"""What a translation must contain, start with, or never contain: terminology constraints, forced target prefixes,
blocked phrases, as text, turned into the token ids `generate()` takes (model/constraints_vaswani.py).

Constraints are fairseq's `--constraints` (`source<TAB>term<TAB>term`; a term may carry the source phrase it
translates, `source ||| target`, for the markup stage: terms.py); one that cannot be met within the length
limit leaves the best translation, reported in the `ControlReport` and warned. Blocked phrases and `<unk>` go to
`bad_words_ids` and `suppress_tokens`. A line whose control is bad gets an empty translation and one error line
naming it; every other line is translated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from vaswani_mt.inference.terms import SIDES, term_sides
from vaswani_mt.model.constraints_vaswani import ORDERS, phrase_forms
from vaswani_mt.model.pipeline_vaswani import unusual_pieces

logger = logging.getLogger(__name__)


@dataclass
class ControlReport:
    """What happened to the controls, by input line (from 1): `unmet` the terms a translation could not contain
    within the length limit; `failed` why a line was not translated (its translation is empty); `unrestored` why a
    line's markup or format directives could not be put back (it is written as its source)."""

    unmet: dict[int, list[str]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    unrestored: dict[int, str] = field(default_factory=dict)

    def outcome(self, line: int) -> dict | None:
        """Line `line`'s outcome as JSON (`restore` takes it back), None where its controls were honoured and its
        markup put back."""
        found = {"failed": self.failed[line]} if line in self.failed else {}
        found.update({"unmet": self.unmet[line]} if line in self.unmet and not found else {})
        found.update({"unrestored": self.unrestored[line]} if line in self.unrestored else {})
        return found or None

    def restore(self, line: int, outcome: dict) -> None:
        """A line kept from a stopped run: its outcome reported again, as when it was translated."""
        if "failed" in outcome:
            fail(self, line, outcome["failed"])
        elif "unmet" in outcome:
            warn_unmet(self, line, outcome["unmet"])
        if "unrestored" in outcome:
            logger.error("line %d: markup not put back (%s): written as its source", line, outcome["unrestored"])
            self.unrestored[line] = outcome["unrestored"]


def fail(report: ControlReport | None, line: int, message: str) -> None:
    """Line `line` is not translated (its controls are bad): one error line, and the report's record."""
    logger.error("line %d: %s: not translated", line, message)
    if report is not None:
        report.failed[line] = message


def warn_unmet(report: ControlReport | None, line: int, missing: list[str]) -> None:
    """Line `line`'s translation misses the terms `missing`: one warning line, and the report's record."""
    logger.warning("line %d: %s not met within the length limit: the best translation is given without %s", line,
                   ", ".join(repr(t) for t in missing), "it" if len(missing) == 1 else "them")  # fmt: skip
    if report is not None:
        report.unmet[line] = missing


def split_constrained_line(line: str) -> tuple[str, list[str]]:
    """fairseq's constrained input: `source<TAB>term<TAB>term...` as (source, terms); a line without a tab has none."""
    source, *terms = line.split("\t")
    return source, terms


def warn_no_tabs(lines: int) -> None:
    """The warning for constrained input of `lines` lines none of which has a tab: nothing was constrained (the
    same in every command; `--constraints` given to plain text is a mistake worth a word, not an error)."""
    if lines:
        logger.warning(
            "constraints: none of the %d input lines has a tab (source<TAB>term<TAB>...): nothing was constrained",
            lines,
        )


def blocked_ids(tokenizer, block: Sequence[str] = (), disable_unk: bool = False,
                model_bans: Sequence[Sequence[int]] | None = None) -> tuple[tuple, int | None]:  # fmt: skip
    """The token-id forms of `block`'s phrases (each as tokenized at the start and inside a sentence) and, with
    `disable_unk`, `<unk>`'s id: what no translation contains (`Search.blocked`, `Search.unk`). ValueError naming the
    phrase for one that is empty or has characters outside the vocabulary. `model_bans`, the model's own
    `bad_words_ids` (an imported OPUS-MT model's `<pad>`, its decoder start), come first: a call's bans would
    otherwise replace them."""
    forms = [list(form) for form in model_bans or []]
    for number, phrase in enumerate(block, 1):
        try:
            forms += phrase_forms(tokenizer, phrase)
        except ValueError as error:
            raise ValueError(f"blocked phrase {number}: {error}") from None
    return tuple(map(tuple, forms)), tokenizer.unk_token_id if disable_unk else None


@dataclass
class LineControls:
    """The constraints and prefixes of the lines `_translate_batches` translates (aligned with them; None: not used):
    each line's target `terms` and their `sources` (terms.py: the source phrase of each, None where not given)."""

    terms: Sequence[Sequence[str]] | None = None
    prefixes: Sequence[str] | None = None
    order: str = "unordered"
    report: ControlReport | None = None
    tabbed: int = 0  # lines of constrained input read with a tab (none: `warn_no_tabs`)
    sources: Sequence[Sequence[str | None]] | None = None

    def read_terms(self, lines: Sequence[Sequence]) -> None:
        """Each line's terms as given (`terms.term_sides`: text, `source ||| target`, or pairs) into `terms` and
        `sources`."""
        sides = [[term_sides(term) for term in line] for line in lines]
        self.sources = [[source for source, _ in line] for line in sides]
        self.terms = [[target for _, target in line] for line in sides]

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"constraint order must be one of {', '.join(ORDERS)}, not {self.order!r}")

    def refuse_blank(self, blank: Sequence[int], first_line: int) -> None:
        """Reports the empty lines (indices `blank`) that come with constraints or a prefix: no source to translate."""
        for i in blank:
            if (self.terms is not None and self.terms[i]) or (self.prefixes is not None and self.prefixes[i].strip()):
                fail(self.report, first_line + i, "constraints or a target prefix but no source text")

    def prepare(self, model, tokenizer, encoded: dict[int, list[int]], first_line: int, search) -> dict:
        """Token ids of each line's constraints and prefix, `{i: (forms, prefix_ids)}` for the lines in `encoded`
        (source ids by index) that have any; a line whose controls are bad or contradict the blocked phrases and
        `<unk>` of `search` (`backends.Search`) is dropped from `encoded`, reported and logged as an error."""
        prepared = {}
        banned = [list(form) for form in search.blocked] + ([[search.unk]] if search.unk is not None else [])
        for i in list(encoded):
            terms = self.terms[i] if self.terms is not None else []
            prefix = self.prefixes[i] if self.prefixes is not None else ""
            if not terms and not prefix:
                continue
            try:
                room = search.limits(model.generation_config, [len(encoded[i])])[0] - 1  # tokens before </s>
                _check_sources(terms, self.sources[i] if self.sources is not None else [])
                prepared[i] = self._line(tokenizer, terms, prefix, room, banned)
            except ValueError as error:
                fail(self.report, first_line + i, str(error))
                del encoded[i]
                continue
            for number, term in enumerate(terms, 1):
                note = unusual_pieces(tokenizer, term)
                if note is not None:
                    logger.warning("line %d: constraint %d: %s", first_line + i, number, note)
        return prepared

    @staticmethod
    def _line(tokenizer, terms: Sequence[str], prefix: str, room: int, banned: list[list[int]]) -> tuple[list, list]:
        """A line's term forms and prefix ids, or ValueError naming what is wrong: a term or prefix that cannot be
        tokenized, is (or holds) a blocked phrase, or does not fit the length limit."""
        forms = []
        for number, term in enumerate(terms, 1):
            try:
                alternatives = phrase_forms(tokenizer, term)
            except ValueError as error:
                raise ValueError(f"constraint {number}: {error}") from None
            blocked = [_banned_in(form, banned) for form in alternatives]
            if all(blocked):  # every form of the term holds a banned phrase: the search can never meet it
                raise ValueError(f"constraint {number}: {term!r} holds the blocked phrase "
                                 f"{tokenizer.decode(blocked[0]).strip()!r}")  # fmt: skip
            forms.append(alternatives)
        prefix_ids: list[int] = []
        if prefix.strip():  # tokenized as a sentence's start: the first of its forms
            try:
                prefix_ids = phrase_forms(tokenizer, prefix)[0]
            except ValueError as error:
                raise ValueError(f"the target prefix: {error}") from None
            blocked_in_prefix = _banned_in(prefix_ids, banned)
            if blocked_in_prefix:  # forced tokens the search may not take: nothing could be translated
                raise ValueError(f"the target prefix {prefix.strip()!r} holds the blocked phrase "
                                 f"{tokenizer.decode(blocked_in_prefix).strip()!r}")  # fmt: skip
        need = len(prefix_ids) + sum(min(len(f) for f in alternatives) for alternatives in forms)
        if need > room:
            what = [f"a target prefix of {len(prefix_ids)}"] if prefix_ids else []
            what += [f"constraints of {need - len(prefix_ids)}"] if forms else []
            raise ValueError(f"{' and '.join(what)} tokens, more than the {room} its length limit leaves before EOS")
        return forms, prefix_ids

    def batch_controls(self, chunk: Sequence[int], prepared: dict) -> dict:
        """The `Search` fields of a batch of lines (indices `chunk`): `terms`, `order`, `prefixes`; empty where none
        of them has controls."""
        if not any(i in prepared for i in chunk):
            return {}
        fields = {}
        if self.terms is not None:
            fields.update(terms=[prepared[i][0] if i in prepared else [] for i in chunk], order=self.order)
        if self.prefixes is not None:
            fields["prefixes"] = [prepared[i][1] if i in prepared else [] for i in chunk]
        return fields

    def record(self, chunk: Sequence[int], met, first_line: int, results: Sequence) -> None:
        """Reports and warns the lines of `chunk` whose translation misses a constraint (`met`: the search's
        `constraints_met`, a row per line), and reports as failed a line with a prefix whose translation (in
        `results`, by index: a text or an n-best list) came out empty: no hypothesis could take its controls."""
        for i in chunk:
            text = results[i] if isinstance(results[i], str) else results[i][0].text
            if self.prefixes is not None and self.prefixes[i].strip() and not text:
                message = "no translation can start with its target prefix under these controls"
                fail(self.report, first_line + i, message)
        if met is None or self.terms is None:
            return
        for row, i in enumerate(chunk):
            if first_line + i in (self.report.failed if self.report is not None else {}):
                continue
            missing = [term for term, ok in zip(self.terms[i], met[row].tolist(), strict=False) if not ok]
            if missing:
                warn_unmet(self.report, first_line + i, missing)


def _check_sources(terms: Sequence[str], sources: Sequence[str | None]) -> None:
    """ValueError naming the first term given with an empty source side (`||| target`)."""
    for number, (term, source) in enumerate(zip(terms, sources, strict=False), 1):
        if source is not None and not source.strip():
            raise ValueError(f"constraint {number}: an empty source side before {SIDES!r} (of {term!r})")


def _banned_in(ids: Sequence[int], banned: list[list[int]]) -> list[int] | None:
    """The first banned token sequence (`bad_words_ids` form or suppressed token) that `ids` holds, else None."""
    for form in banned:
        width = len(form)
        if any(list(ids[start : start + width]) == form for start in range(len(ids) - width + 1)):
            return form
    return None


__all__ = ["ControlReport", "LineControls", "blocked_ids", "fail", "split_constrained_line", "warn_no_tabs",
           "warn_unmet"]  # fmt: skip
