"""Terminology constraints, target prefixes, blocked phrases and <unk> through translate(), streams and the scripts."""

import io
import re

import pytest
from conftest import ENGLISH, run_main
from test_decoding_options import _nbest_rows

from vaswani_mt.cli import evaluate as evaluate_cli
from vaswani_mt.cli import translate as translate_cli
from vaswani_mt.inference.controls import ControlReport
from vaswani_mt.inference.ensemble import ensemble
from vaswani_mt.inference.streams import translate_stream
from vaswani_mt.inference.translate import translate, translate_nbest
from vaswani_mt.inference.translator import Translator

pytestmark = pytest.mark.usefixtures("one_thread")

SHORT = {"max_len_b": 14}


@pytest.fixture(scope="module")
def plain(fitted):
    model, tokenizer = fitted
    return translate(model, tokenizer, ENGLISH, **SHORT)


def _terms(plain: list[str]) -> list[list[str]]:
    """Line 0 and 2 get a word their plain translation lacks (2: two, ordered as given); the others none."""
    words = ["Buch", "Kaffee", "Apfel", "Straße", "heute"]
    missing = [[w for w in words if w not in text] for text in plain]
    return [[missing[0][0]], [], missing[2][:2], [], [], []]


def test_constrained_lines_contain_their_terms_and_the_others_are_unchanged(fitted, plain):
    model, tokenizer = fitted
    terms = _terms(plain)
    report = ControlReport()
    for order in ("unordered", "ordered"):
        out = translate(model, tokenizer, ENGLISH, constraints=terms, constraint_order=order, report=report, **SHORT)
        for line, (text, wanted) in enumerate(zip(out, terms, strict=True)):
            assert all(term in text for term in wanted), (text, wanted)
            if not wanted:
                assert text == plain[line]
        if order == "ordered":
            assert out[2].index(terms[2][0]) < out[2].index(terms[2][1])
    assert report.unmet == {} and report.failed == {}
    budget = translate(model, tokenizer, ENGLISH, constraints=terms, max_tokens=30, batch_size=None, **SHORT)
    assert budget == translate(model, tokenizer, ENGLISH, constraints=terms, batch_size=2, **SHORT)


def test_every_nbest_hypothesis_and_an_ensemble_meet_the_constraints(fitted, plain):
    model, tokenizer = fitted
    terms = _terms(plain)
    for hypotheses, wanted in zip(translate_nbest(model, tokenizer, ENGLISH, 4, constraints=terms, **SHORT), terms,
                                  strict=True):  # fmt: skip
        assert all(term in h.text for h in hypotheses for term in wanted)
    pair = ensemble([model, model])
    for text, wanted in zip(translate(pair, tokenizer, ENGLISH, constraints=terms, **SHORT), terms, strict=True):
        assert all(term in text for term in wanted)


def test_bad_lines_get_one_error_and_the_others_are_translated(fitted, plain, caplog):
    model, tokenizer = fitted
    terms = [["Buch"], ["Ka漢ffee"], [""], ["Straße " * 20], [], ["heute"]]
    report = ControlReport()
    out = translate(model, tokenizer, ENGLISH, constraints=terms, report=report, **SHORT)
    assert out[1] == out[2] == out[3] == ""
    assert "Buch" in out[0] and "heute" in out[5] and out[4] == plain[4]
    assert report.failed == {
        2: "constraint 1: 'Ka漢ffee' has a character outside the vocabulary: '漢'",
        3: "constraint 1: an empty constraint",
        4: report.failed[4],
    }
    assert "constraints of 40 tokens, more than the" in report.failed[4]
    assert "line 2: constraint 1: 'Ka漢ffee' has a character outside the vocabulary" in caplog.text
    prefixes = ["", "Die Straße " * 10, "", "", "", ""]
    report = ControlReport()
    out = translate(model, tokenizer, ENGLISH, target_prefixes=prefixes, report=report, **SHORT)
    assert out[1] == "" and out[0] == plain[0] and list(report.failed) == [2]
    assert re.fullmatch(
        r"a target prefix of \d+ tokens, more than the \d+ its length limit leaves before EOS", report.failed[2]
    )


def test_a_constraint_that_cannot_be_met_is_reported_and_warned(fitted, caplog):
    model, tokenizer = fitted
    report = ControlReport()
    # No token may repeat (no_repeat_ngram_size=1), so "Buch Buch" can never appear: the search ends at the limit
    # with the best it has.
    out = translate(model, tokenizer, ENGLISH[:2], constraints=[["Buch Buch"], []], no_repeat_ngram_size=1,
                    report=report, **SHORT)  # fmt: skip
    assert "Buch Buch" not in out[0] and out[0]
    assert report.unmet == {1: ["Buch Buch"]}
    assert "line 1: 'Buch Buch' not met within the length limit" in caplog.text


def test_controls_that_contradict_the_blocked_phrases_are_refused_for_their_line(fitted, plain):
    """A term that is (or holds) a blocked phrase, or a prefix that holds one, can never be honoured: the line is
    refused in one line naming it (a prefix holding one gave an empty line and no word), the others translated."""
    model, tokenizer = fitted
    report = ControlReport()
    out = translate(model, tokenizer, ENGLISH[:3], constraints=[["Buch"], [], []],
                    target_prefixes=["", "Die Straße ist", ""], block=["Buch", "Straße"], report=report,
                    **SHORT)  # fmt: skip
    alone = translate(model, tokenizer, ENGLISH[2:3], block=["Buch", "Straße"], **SHORT)
    assert out[0] == "" and out[1] == "" and out[2] == alone[0]
    assert report.failed == {1: "constraint 1: 'Buch' holds the blocked phrase 'Buch'",
                             2: "the target prefix 'Die Straße ist' holds the blocked phrase 'Straße'"}  # fmt: skip
    unk = translate(model, tokenizer, ENGLISH[:1], target_prefixes=["Die"], block=["Die"], report=report, **SHORT)
    assert unk == [""] and "holds the blocked phrase 'Die'" in report.failed[1]


def test_target_prefixes_start_the_translation_and_an_empty_one_changes_nothing(fitted, plain):
    model, tokenizer = fitted
    prefixes = ["Die Straße", "", "Ich", "", "Wir", ""]
    out = translate(model, tokenizer, ENGLISH, target_prefixes=prefixes, **SHORT)
    for line, (text, prefix) in enumerate(zip(out, prefixes, strict=True)):
        assert text.startswith(prefix)
        if not prefix:
            assert text == plain[line]
    scores = translate_nbest(model, tokenizer, ENGLISH[:1], 4, target_prefixes=["Die Straße"], **SHORT)[0]
    assert len({h.text for h in scores}) == 4 and all(h.text.startswith("Die Straße") for h in scores)


def test_blocked_phrases_and_unk_never_appear(fitted, plain):
    model, tokenizer = fitted
    word = next(w for w in ("Apfel", "Kaffee", "Buch") if any(w in text for text in plain))
    out = translate(model, tokenizer, ENGLISH, block=[word], disable_unk=True, **SHORT)
    assert not any(word in text for text in out)
    assert [a for a, b in zip(out, plain, strict=True) if word not in b] == [b for b in plain if word not in b]
    with pytest.raises(ValueError, match="blocked phrase 1: an empty constraint"):
        translate(model, tokenizer, ENGLISH, block=[" "])


def test_controls_refuse_greedy_search_and_sampling(fitted):
    model, tokenizer = fitted
    with pytest.raises(ValueError, match="constraints need beam search"):
        translate(model, tokenizer, ENGLISH, constraints=[["Buch"]] * 6, num_beams=1)
    with pytest.raises(ValueError, match="2 terms for 6 lines"):
        translate(model, tokenizer, ENGLISH, constraints=[["Buch"]] * 2)


def test_a_stream_of_tab_lines_is_translated_as_the_lists_are(fitted, plain):
    import io

    model, tokenizer = fitted
    terms = _terms(plain)
    lines = ["\t".join([source, *wanted]) for source, wanted in zip(ENGLISH, terms, strict=True)]
    sink = io.BytesIO()
    translate_stream(
        Translator(model, tokenizer, chunk_size=4, constraints="unordered", generate_kwargs=SHORT),
        io.BytesIO("\n".join(lines).encode()),
        sink,
        prefixes=iter(["", "", "", "Wie", "", ""]),
    )
    expected = translate(model, tokenizer, ENGLISH, constraints=terms, target_prefixes=["", "", "", "Wie", "", ""],
                         **SHORT)  # fmt: skip
    assert sink.getvalue().decode().splitlines() == expected


def test_the_scripts_take_tab_lines_prefix_and_block_files(fitted_folder, fitted, plain, tmp_path, monkeypatch):
    terms = _terms(plain)
    data = "".join("\t".join([s, *t]) + "\n" for s, t in zip(ENGLISH, terms, strict=True)).encode()
    model = ["--model", str(fitted_folder), "--constraints", "unordered"]
    out, code = run_main(translate_cli, model, monkeypatch, data)
    assert code is None and out.splitlines() == translate(*fitted, ENGLISH, constraints=terms)
    nbest, _ = run_main(translate_cli, [*model, "--nbest", "2", "--max_tokens", "40"], monkeypatch, data)
    assert [row[1] for row in _nbest_rows(nbest)[::2]] == out.splitlines()
    prefix_file, block_file = tmp_path / "prefixes", tmp_path / "block"
    prefix_file.write_text("Die\n\n")
    block_file.write_text("Buch\n")
    extra = ["--target_prefix_file", str(prefix_file), "--block_file", str(block_file), "--disable_unk"]
    two = "\n".join(ENGLISH[:2]).encode()
    out, code = run_main(translate_cli, ["--model", str(fitted_folder), *extra], monkeypatch, two)
    assert code is None and out.splitlines() == translate(*fitted, ENGLISH[:2], target_prefixes=["Die", ""],
                                                          block=["Buch"], disable_unk=True)  # fmt: skip
    _, code = run_main(translate_cli, ["--model", str(fitted_folder), *extra], monkeypatch, data)
    assert code == f"error: {prefix_file}: the target prefixes end before input line 3"
    refusals = {"--sampling": "error: constraints need beam search, not sampling",
                "--num_beams": "error: constraints need beam search (num_beams > 1), not greedy search"}  # fmt: skip
    for option, message in refusals.items():
        argv = [*model, option, *(["1"] if option == "--num_beams" else [])]
        assert run_main(translate_cli, argv, monkeypatch, data) == ("", message)
    _, code = run_main(translate_cli, model, monkeypatch, "How are you?\tKa漢ffee\nHow are you?\n".encode())
    assert code.startswith("error: 1 of 2 lines not translated") and "'漢'" in code and "\n" not in code
    source, reference = tmp_path / "test.tsv", tmp_path / "test.de"
    source.write_bytes(data)
    reference.write_text("Das Mädchen hat einen Apfel gegessen.\n" * len(ENGLISH))
    files = ["--source_file", str(source), "--reference_file", str(reference), "--output", str(tmp_path / "out")]
    _, code = run_main(evaluate_cli, [*model, *files], monkeypatch)
    assert code is None and (tmp_path / "out").read_text().splitlines() == translate(*fitted, ENGLISH,
                                                                                     constraints=terms)  # fmt: skip


def test_prefixes_without_terms_under_constraints_are_translated_and_every_line_is_met(fitted, plain):
    """A batch whose lines carry prefixes but no terms ran the search without constraints, which then set no
    `constraints_met`: translate() raised AttributeError. Lines without terms count as met (vacuously)."""
    model, tokenizer = fitted
    prefixes = [plain[0].split()[0], "", "", "", "", ""]
    report = ControlReport()
    out = translate(model, tokenizer, ENGLISH, constraints=[[]] * len(ENGLISH), constraint_order="ordered",
                    target_prefixes=prefixes, report=report, **SHORT)  # fmt: skip
    assert out == translate(model, tokenizer, ENGLISH, target_prefixes=prefixes, **SHORT)
    assert report.unmet == {} and report.failed == {}
    terms = [["Buch"], [], [], [], [], []]
    batch = tokenizer(ENGLISH, return_tensors="pt", padding=True)
    output = model.generate(**batch, constraints=[[tokenizer(t, add_special_tokens=False)["input_ids"] for t in row]
                                                  for row in terms], return_dict_in_generate=True, **SHORT)  # fmt: skip
    assert output.constraints_met[1:].all()  # the sentences without a constraint: met, vacuously


def test_misuse_is_named_a_tab_without_constraints_no_tab_with_them_and_a_term_in_many_pieces(fitted, caplog):
    """Each gets a warning naming the line and the translation goes on: a tab in a line translated without
    constraints (a TSV given without --constraints; it warned about an <unk> for '\\t'), constrained input without a
    tab anywhere (nothing constrained), a term whose word splits into many short pieces where a word one letter away
    takes fewer (a typo: "gegesen")."""
    model, tokenizer = fitted
    out = translate(model, tokenizer, [ENGLISH[0] + "\tApfel"], **SHORT)
    assert out[0] and "line 1: a tab in the source text: terms after a tab are constraints only with --constraints" in (
        caplog.text
    )  # fmt: skip
    assert "'\\t'" not in caplog.text  # not reported as a character outside the vocabulary
    caplog.clear()
    sink = io.BytesIO()
    translate_stream(
        Translator(model, tokenizer, constraints="unordered", generate_kwargs=SHORT),
        io.BytesIO("\n".join(ENGLISH[:3]).encode()),
        sink,
    )
    assert sink.getvalue().decode().count("\n") == 3
    assert "constraints: none of the 3 input lines has a tab (source<TAB>term<TAB>...): nothing was constrained" in (
        caplog.text
    )  # fmt: skip
    caplog.clear()
    out = translate(model, tokenizer, ENGLISH[:2], constraints=[["gegesen"], ["Buch"]], **SHORT)
    assert "gegesen" in out[0] and "Buch" in out[1]
    assert "line 1: constraint 1: 'gegesen' splits into 4 short pieces" in caplog.text and "'Buch'" not in caplog.text


def test_the_constrained_lines_alpha_is_an_option_of_the_commands(fitted, fitted_folder, monkeypatch):
    """--constrained_length_penalty A scores the lines with terms as translate(..., constrained_length_penalty=A)
    does; the lines without terms keep the model's own alpha."""
    model, tokenizer = fitted
    data = f"{ENGLISH[0]}\tKaffee\n{ENGLISH[1]}\n".encode()
    for alpha in ("0.0", "3.0"):
        out, code = run_main(translate_cli, ["--model", str(fitted_folder), "--constraints", "unordered",
                                         "--constrained_length_penalty", alpha], monkeypatch, data)  # fmt: skip
        expected = translate(model, tokenizer, ENGLISH[:2], constraints=[["Kaffee"], []],
                             constrained_length_penalty=float(alpha))  # fmt: skip
        assert code is None and out.splitlines() == expected
    assert expected[1] == translate(model, tokenizer, ENGLISH[1:2])[0]
