"""Line-level input checks of translate and evaluate (issue 45, item 2): a --target_prefix_file whose length differs
from an --input file's is refused in one line before anything is translated, and a constrained line without source
text (`\\tHaus`) is refused by evaluate as translate refuses it."""

import pytest
from conftest import ENGLISH, run_main

from vaswani_mt.cli import evaluate as evaluate_cli
from vaswani_mt.cli import translate as translate_cli


@pytest.mark.parametrize("prefixes", [1, 4])
def test_a_prefix_file_of_another_length_than_the_input_is_refused_before_translating(
    prefixes, fitted_folder, tmp_path, monkeypatch
):
    source, prefix_file = tmp_path / "in.en", tmp_path / "prefixes.de"
    source.write_text("".join(f"{line}\n" for line in ENGLISH[:3]))
    prefix_file.write_text("Die\n" * (prefixes - 1) + "Wie")  # the last line without its end counts too
    monkeypatch.setattr("vaswani_mt.inference.ensemble.load_ensemble", lambda *_: pytest.fail("the model loaded"))
    argv = ["--model", str(fitted_folder), "--input", str(source), "--target_prefix_file", str(prefix_file),
            "--chunk_size", "2"]  # fmt: skip
    out, code = run_main(translate_cli, argv, monkeypatch)
    assert out == ""
    assert code == (f"error: {prefix_file} has {prefixes} lines but {source} has 3: give one target prefix per input "
                    "line")  # fmt: skip


def test_a_prefix_file_as_long_as_the_input_file_is_taken(fitted_folder, tmp_path, monkeypatch):
    source, prefix_file = tmp_path / "in.en", tmp_path / "prefixes.de"
    source.write_text("".join(f"{line}\n" for line in ENGLISH[:3]))
    prefix_file.write_text("Das\n\nDie\n")
    argv = ["--model", str(fitted_folder), "--input", str(source), "--target_prefix_file", str(prefix_file),
            "--chunk_size", "2"]  # fmt: skip
    out, code = run_main(translate_cli, argv, monkeypatch)
    lines = out.splitlines()
    assert code is None and len(lines) == 3 and lines[0].startswith("Das") and lines[2].startswith("Die")


def test_evaluate_refuses_a_constrained_line_without_source_text_as_translate_does(fitted_folder, tmp_path,
                                                                                  monkeypatch):  # fmt: skip
    data = f"\tHaus\n{ENGLISH[1]}\tgeht\n"
    source, reference = tmp_path / "terms.tsv", tmp_path / "terms.de"
    source.write_text(data)
    reference.write_text("Das Haus.\nWie geht es Ihnen heute?\n")
    model = ["--model", str(fitted_folder), "--constraints", "unordered"]
    out, code = run_main(translate_cli, model, monkeypatch, data.encode())
    expected = "error: 1 of 2 lines not translated: bad constraints or target prefixes (first: line 1: constraints "
    assert isinstance(code, str) and code.startswith(expected) and "no source text" in code, code
    assert out.splitlines()[0] == ""
    files = ["--input", str(source), "--reference_file", str(reference), "--output", str(tmp_path / "out.de")]
    _, evaluate_code = run_main(evaluate_cli, [*model, *files], monkeypatch)
    assert evaluate_code == code
    written = (tmp_path / "out.de").read_text().splitlines()
    assert written[0] == "" and written[1] == out.splitlines()[1] and "geht" in written[1]


def test_constraints_on_input_without_a_tab_are_warned_alike_by_translate_and_evaluate(
    fitted_folder, tmp_path, monkeypatch, caplog
):
    data = f"{ENGLISH[0]}\n{ENGLISH[1]}\n"
    source, reference = tmp_path / "plain.en", tmp_path / "plain.de"
    source.write_text(data)
    reference.write_text("Das Mädchen hat einen Apfel gegessen.\nWie geht es Ihnen heute?\n")
    model = ["--model", str(fitted_folder), "--constraints", "unordered"]
    warning = "constraints: none of the 2 input lines has a tab (source<TAB>term<TAB>...): nothing was constrained"
    _, code = run_main(translate_cli, [*model, "--input", str(source)], monkeypatch)
    assert code is None and caplog.text.count(warning) == 1
    caplog.clear()
    _, code = run_main(evaluate_cli, [*model, "--input", str(source), "--reference_file", str(reference)], monkeypatch)
    assert code is None and caplog.text.count(warning) == 1
