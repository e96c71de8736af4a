"""Putting markup back never takes a run down (issue 67, item 2): the lines that once raised (punctuation between two
points, a point at both ends, points only, a point inside a word) come out with every point exactly once, and a line
whose restore raises anyway is that line's failure: written as its source, reported by number, the run exits 1."""

from collections import Counter

import pytest
from conftest import ENGLISH, run_main

from vaswani_mt.inference.alignments import AlignedTranslation
from vaswani_mt.inference.controls import ControlReport
from vaswani_mt.inference.markup import parse_markup, placeholders, restore
from vaswani_mt.inference.translate import translate

pytestmark = pytest.mark.usefixtures("one_thread")


def diagonal(line: str, text: str | None = None) -> str:
    """`restore` of `line` with `text` (default: its own plain text) as the translation, word k linked to word k."""
    plan = parse_markup(line)
    source = plan.text.split()
    words = (plan.text if text is None else text).split()
    links = [(min(k, len(source) - 1), k) for k in range(len(words))] if source else []
    return restore(plan, AlignedTranslation(" ".join(words), source, words, links=links))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('while reindexing partitioned table "%s.%s"', 'while reindexing partitioned table "%s.%s"'),  # the IndexError
        ("%s.%s", "%s.%s"),  # points only, punctuation between them
        ("%s", "%s"),
        ("%s, %s", "%s, %s"),
        ("%s text %d", "%s text %d"),  # a point at both ends
        ("<br/>", "<br/>"),
        ("x %s.%s.%s y", "x %s.%s.%s y"),  # glued with punctuation only: one point, as written
        ("a.%s.b now", "a..b%s now"),  # inside a word: after its translation, never glued to the next word
        ("Done.%s", "Done.%s"),
        ("unable to open output file '%s': %s", "unable to open output file '%s': %s"),
    ],
)
def test_points_between_punctuation_at_both_ends_or_alone_come_out_once(line, expected):
    out = diagonal(line)
    assert out == expected
    assert Counter(placeholders(out)) == Counter(placeholders(line))


def test_punctuation_inside_a_word_is_not_the_kth_mark():
    # "a.%s.b": the "." before %s ends no word: the after-punctuation rule does not apply (it raised IndexError)
    plan = parse_markup("see a.%s.b. Now.")
    out = restore(plan, AlignedTranslation("siehe a..b. Jetzt.", plan.text.split(), "siehe a..b. Jetzt.".split(),
                                           links=[(0, 0), (1, 1), (2, 2)]))  # fmt: skip
    assert out.count("%s") == 1 and out.endswith("Jetzt.")


def raising_on(marker: str, monkeypatch) -> None:
    """`restore` as the markup stage calls it (`put_back`), raising for the lines that contain `marker`."""
    import vaswani_mt.inference.markup as markup

    def restore_or_raise(plan, translation, *rule):
        if marker in plan.line:
            raise IndexError("list index out of range")
        return restore(plan, translation, *rule)

    monkeypatch.setattr(markup, "restore", restore_or_raise)


def test_a_line_whose_restore_raises_is_written_as_its_source_and_reported(fitted, monkeypatch, caplog):
    model, tokenizer = fitted
    lines = [ENGLISH[0], "BOOM <b>here</b> %s", "The <b>girl</b> is here.", ENGLISH[2]]
    raising_on("BOOM", monkeypatch)
    report = ControlReport()
    with caplog.at_level("ERROR", logger="vaswani_mt.inference.translator"):
        outputs = translate(model, tokenizer, lines, markup="xml", report=report)
    assert outputs[1] == lines[1]
    assert report.unrestored == {2: "IndexError: list index out of range"}
    assert "line 2: markup not put back (IndexError: list index out of range): written as its source" in caplog.text
    assert outputs[0] == translate(model, tokenizer, lines[:1])[0]  # the others as without the failure
    assert outputs[2] == translate(model, tokenizer, lines[2:3], markup="xml")[0]


def test_the_command_writes_every_line_then_exits_1_naming_the_line(fitted_folder, tmp_path, monkeypatch, capsys):
    from vaswani_mt.cli import translate as translate_cli

    lines = [ENGLISH[0], "BOOM <b>here</b> %s", ENGLISH[1], "Delete %s files.", ENGLISH[2]]
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    raising_on("BOOM", monkeypatch)
    argv = ["--model", str(fitted_folder), "--input", str(source), "--output", str(target), "--markup", "xml"]
    _, code = run_main(translate_cli, argv, monkeypatch)
    assert code == 1
    written = target.read_text(encoding="utf-8").splitlines()
    assert len(written) == 5 and written[1] == lines[1] and written[3].count("%s") == 1
    err = capsys.readouterr().err
    assert "error: 1 of 5 lines written as their source: their markup could not be put back (first: line 2: " \
           "IndexError: list index out of range)" in err  # fmt: skip


def test_a_line_whose_directives_cannot_be_placed_is_written_with_them_at_the_end_and_named(fitted, monkeypatch,
                                                                                            caplog):  # fmt: skip
    import vaswani_mt.inference.markup as markup
    from vaswani_mt.inference.markup import UnplacedDirectives

    def unplaced(plan, translation, *rule):
        if "%u" in plan.line:
            raise UnplacedDirectives(f"{translation} %u %s")
        return restore(plan, translation, *rule)

    monkeypatch.setattr(markup, "restore", unplaced)
    model, tokenizer = fitted
    report = ControlReport()
    with caplog.at_level("WARNING", logger="vaswani_mt.inference.translator"):
        outputs = translate(model, tokenizer, [ENGLISH[0], "Copied %u of %s"], markup="xml", report=report)
    assert outputs[1].endswith(" %u %s") and report.unrestored == {}  # written, named, not a failure
    assert "line 2: format directives could not all be placed: put at the end, in source order" in caplog.text


def test_a_point_never_goes_between_the_words_of_a_forced_term():
    plan = parse_markup("You have new %s messages")
    words = "Du hast neue Nachrichten".split()
    translation = AlignedTranslation(" ".join(words), plan.text.split(), words, links=[(k, k) for k in range(4)])
    assert restore(plan, translation) == "Du hast neue %s Nachrichten"  # before the word after it
    plan.terms = ["neue Nachrichten"]  # forced: the point goes after the term
    assert restore(plan, translation) == "Du hast neue Nachrichten %s"
