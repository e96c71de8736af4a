"""translate and evaluate with a CTranslate2 export as --model (issue 44, item 5): translations through
CTranslate2 ranked as ours (export/ctranslate2.py; tests/export/test_ctranslate2_backend.py), target prefixes
honoured, n-best lists in Marian's format, and what only our search can do (--constraints) refused in one line."""

import pytest
from conftest import ENGLISH

pytestmark = pytest.mark.transformers_internals

pytest.importorskip("ctranslate2")

SOURCES = [*ENGLISH, "The girl reads a book in the café."]


@pytest.fixture(scope="module")
def folders(fitted_folder, tmp_path_factory):
    """The fitted model and its CTranslate2 export, as `vaswani-mt-export --format ctranslate2` writes it."""
    from vaswani_mt.export.marian import export_model

    return fitted_folder, export_model(fitted_folder, "ctranslate2", tmp_path_factory.mktemp("ct2") / "ct2")


def test_the_commands_take_a_ctranslate2_folder_with_prefixes_and_refuse_constraints(folders, tmp_path, capfd,
                                                                                      restore_threads):  # fmt: skip
    from vaswani_mt.cli import evaluate as evaluate_cli
    from vaswani_mt.cli import translate as translate_cli

    folder = str(folders[1])
    (tmp_path / "in.en").write_text("\n".join([*SOURCES[:3], "", SOURCES[3]]) + "\n")
    (tmp_path / "prefix.de").write_text("Das\n\nDie Straße\n\n\n")
    translate_cli.main(["--model", folder, "--input", str(tmp_path / "in.en"), "--target_prefix_file",
                        str(tmp_path / "prefix.de")])  # fmt: skip
    lines = capfd.readouterr().out.split("\n")
    assert len(lines) == 6 and lines[3] == "" and lines[5] == "" and all(lines[:3]) and lines[4]
    assert lines[0].startswith("Das") and lines[2].startswith("Die Straße")
    translate_cli.main(["--model", folder, "--input", str(tmp_path / "in.en"), "--nbest", "2"])
    nbest = capfd.readouterr().out.splitlines()
    assert len(nbest) == 10 and nbest[0].startswith("0 ||| ") and " ||| F0= " in nbest[0]
    (tmp_path / "ref.de").write_text("\n".join(SOURCES) + "\n")
    (tmp_path / "all.en").write_text("\n".join(SOURCES) + "\n")
    evaluate_cli.main(["--model", folder, "--input", str(tmp_path / "all.en"), "--reference_file",
                       str(tmp_path / "ref.de"), "--output", str(tmp_path / "out.de")])  # fmt: skip
    assert "sacreBLEU = " in capfd.readouterr().out
    translate_cli.main(["--model", folder, "--input", str(tmp_path / "all.en")])
    assert (tmp_path / "out.de").read_text() == capfd.readouterr().out  # evaluate translates as translate does

    (tmp_path / "terms.tsv").write_text("The girl ate an apple.\tMädchen\n")
    for module, argv in ((translate_cli, []), (evaluate_cli, ["--reference_file", str(tmp_path / "terms.tsv")])):
        terms = ["--input", str(tmp_path / "terms.tsv"), "--constraints", "unordered"]
        with pytest.raises(SystemExit) as stop:
            module.main(["--model", folder, *terms, *argv])
        message = stop.value.code  # as the commands' other refusals: `error: ...`, one line, exit status 1
        expected = (
            f"error: constraints (--constraints) need vaswani_mt's own search: the CTranslate2 folder {folder} takes"
        )
        assert message.startswith(expected) and "\n" not in message
    assert "Traceback" not in capfd.readouterr().err


def test_a_stopped_run_on_a_ctranslate2_folder_resumes_to_the_bytes_of_one_run_and_of_a_call_per_sentence(
    folders, tmp_path, monkeypatch, restore_threads
):
    """Issue 66: translate.py gives a CTranslate2 folder CTranslate2's batches (64 lines sorted by source tokens, a
    call each where the limits allow it): a run stopped in its second batch, then the same command, writes the bytes
    of one run (n-best lists of prefixed lines), and --batch_size 1 (a call per line, each at its own |X| + 50
    tokens: today's call per limit) the same n-best lists."""
    from conftest import exit_code, stop_at_batch

    from vaswani_mt.cli import translate as translate_cli
    from vaswani_mt.inference.ctranslate2 import CTranslate2Model

    source, prefixes = tmp_path / "in.en", tmp_path / "prefix.de"
    source.write_text("".join(f"{line}\n" for line in (SOURCES * 15)[:100]))  # 100 lines: batches of 64 and 36
    prefixes.write_text("".join("Das\n" if i % 3 == 0 else "\n" for i in range(100)))
    argv = ["--model", str(folders[1]), "--input", str(source), "--target_prefix_file", str(prefixes), "--nbest", "2",
            "--threads", "1"]  # fmt: skip
    outputs = {name: tmp_path / f"{name}.de" for name in ("whole", "stopped", "alone")}
    assert exit_code(translate_cli.main, [*argv, "--output", str(outputs["whole"])]) is None
    with monkeypatch.context() as patch:
        searched = stop_at_batch(patch, CTranslate2Model, batch=2)
        assert exit_code(translate_cli.main, [*argv, "--output", str(outputs["stopped"])]) == 130
    assert searched == [64, 36]  # the second batch started, and was stopped
    assert exit_code(translate_cli.main, [*argv, "--output", str(outputs["stopped"])]) is None
    assert exit_code(translate_cli.main, [*argv, "--batch_size", "1", "--output", str(outputs["alone"])]) is None
    whole = outputs["whole"].read_bytes()
    assert whole.count(b"\n") == 200 and outputs["stopped"].read_bytes() == whole
    # A call per line: the same hypotheses, in the same order; log P undone from each call's lp, to round-off
    alone = [line.split(" ||| ") for line in outputs["alone"].read_text().splitlines()]
    for ours, theirs in zip([line.split(" ||| ") for line in whole.decode().splitlines()], alone, strict=True):
        assert ours[:2] == theirs[:2] and float(ours[3]) == pytest.approx(float(theirs[3]), abs=1e-4)
