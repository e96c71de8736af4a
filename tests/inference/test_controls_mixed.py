"""Every control in every mix (hypothesis): random batches of plain lines, ordered and unordered terms, prefixes,
blocked phrases, `disable_unk`, n-best lists, token budgets, ensembles and streams never raise, give each input
line exactly one output, and meet each line's constraints or report the line; a line whose controls contradict
each other is refused alone, in one line naming it."""

import io
import re

import pytest
from conftest import ENGLISH
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vaswani_mt.inference.controls import ControlReport
from vaswani_mt.inference.ensemble import ensemble
from vaswani_mt.inference.streams import translate_stream
from vaswani_mt.inference.translate import split_options, translate, translate_nbest
from vaswani_mt.inference.translator import Translator
from vaswani_mt.model.constraints_vaswani import ORDERS

pytestmark = pytest.mark.usefixtures("one_thread")

SHORT = {"max_len_b": 14}
TERMS = ["Buch", "Kaffee", "Apfel", "Straße", "heute"]
LONG_PREFIX = "Die Straße " * 10  # more tokens than a 14-token limit leaves
PREFIXES = ["", "", "Die", "Das Mädchen", "Wir", LONG_PREFIX]
BLOCKABLE = ["Buch", "Straße", "heute", "Die"]
# What a refused line is told (ControlReport.failed), one line each.
REFUSALS = re.compile(
    r"constraints or a target prefix but no source text"
    r"|constraint \d: '[^']+' holds the blocked phrase '[^']+'"
    r"|the target prefix '[^']+' holds the blocked phrase '[^']+'"
    r"|(a target prefix of \d+|constraints of \d+)( and constraints of \d+)? tokens, more than the \d+ its length "
    r"limit leaves before EOS"
    r"|no translation can start with its target prefix under these controls"
)

LINE = st.fixed_dictionaries({
    "source": st.sampled_from([*ENGLISH, ""]),
    "terms": st.lists(st.sampled_from(TERMS), max_size=2, unique=True),
    "prefix": st.sampled_from(PREFIXES),
})  # fmt: skip
MIX = st.fixed_dictionaries({
    "lines": st.lists(LINE, min_size=1, max_size=5),
    "terms": st.booleans(),
    "prefixes": st.booleans(),
    "order": st.sampled_from(ORDERS),
    "block": st.lists(st.sampled_from(BLOCKABLE), max_size=2, unique=True),
    "disable_unk": st.booleans(),
    "nbest": st.sampled_from([None, 1, 2]),
    "max_tokens": st.sampled_from([None, 24]),
    "ensemble": st.booleans(),
    "stream": st.booleans(),
})  # fmt: skip


def _run(model, tokenizer, mix: dict, report: ControlReport) -> list[list[str]]:
    """Each line's translations (one, or the n-best list's), through translate()/translate_nbest() or a stream."""
    lines = mix["lines"]
    options = {"block": mix["block"], "disable_unk": mix["disable_unk"], "report": report,
               "max_tokens": mix["max_tokens"], "batch_size": None if mix["max_tokens"] else 3, **SHORT}  # fmt: skip
    prefixes = [line["prefix"] for line in lines] if mix["prefixes"] else None
    if mix["stream"]:
        tsv = ["\t".join([line["source"], *line["terms"]]) if mix["terms"] else line["source"] for line in lines]
        sink = io.BytesIO()
        keywords = {k: v for k, v in options.items() if k != "report"}
        stream_options, _ = split_options(
            {"chunk_size": 2, "nbest": mix["nbest"], **keywords, "constraints": mix["order"] if mix["terms"] else None}
        )
        translator = Translator(model, tokenizer, stream_options)
        source = io.BytesIO("\n".join(tsv).encode())
        count = translate_stream(translator, source, sink, prefixes=prefixes, report=report)
        rows = sink.getvalue().decode().split("\n")[:-1]
        assert count == len(lines) and len(rows) == len(lines) * (mix["nbest"] or 1)
        if mix["nbest"]:
            return [[row.split(" ||| ")[1] for row in rows[k : k + mix["nbest"]]]
                    for k in range(0, len(rows), mix["nbest"])]  # fmt: skip
        return [[row] for row in rows]
    controls = {"constraints": [line["terms"] for line in lines] if mix["terms"] else None,
                "constraint_order": mix["order"], "target_prefixes": prefixes}  # fmt: skip
    sources = [line["source"] for line in lines]
    if mix["nbest"]:
        lists = translate_nbest(model, tokenizer, sources, mix["nbest"], **controls, **options)
        assert all(len(hypotheses) == mix["nbest"] for hypotheses in lists)
        return [[h.text for h in hypotheses] for hypotheses in lists]
    return [[text] for text in translate(model, tokenizer, sources, **controls, **options)]


def _expected_refusal(line: dict, mix: dict) -> str | None:
    """The refusal a line must get, where the mix makes it certain (in the order the lines' checks run)."""
    terms = line["terms"] if mix["terms"] else []
    prefix = line["prefix"] if mix["prefixes"] else ""
    if not line["source"].strip():
        return "constraints or a target prefix but no source text" if terms or prefix.strip() else None
    for number, term in enumerate(terms, 1):
        if term in mix["block"]:
            return f"constraint {number}: '{term}' holds the blocked phrase '{term}'"
    if prefix == LONG_PREFIX and not any(word in mix["block"] for word in prefix.split()):
        return "more than the"
    return None


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mix=MIX)
def test_every_mix_of_controls_gives_one_output_per_line_and_meets_or_reports_each_constraint(fitted, mix):
    model, tokenizer = fitted
    if mix["ensemble"]:
        model = ensemble([model, model])
    report = ControlReport()
    outputs = _run(model, tokenizer, mix, report)
    assert len(outputs) == len(mix["lines"])
    for number, (line, texts) in enumerate(zip(mix["lines"], outputs, strict=True), 1):
        expected = _expected_refusal(line, mix)
        if expected is not None:
            assert expected in report.failed.get(number, ""), (number, report.failed)
        if number in report.failed:
            assert REFUSALS.fullmatch(report.failed[number]), report.failed[number]
            assert all(text == "" for text in texts)
            # Refused only where the controls contradict each other (or there is nothing to translate).
            prefix = line["prefix"] if mix["prefixes"] else ""
            assert expected is not None or any(word in prefix.split() for word in mix["block"]), report.failed
            continue
        prefix = line["prefix"] if mix["prefixes"] else ""
        if line["source"].strip():
            assert all(text.startswith(prefix.strip()) for text in texts), (prefix, texts)
        terms = line["terms"] if mix["terms"] else []
        if terms and number not in report.unmet:
            assert all(term in text for term in terms for text in texts), (terms, texts)
