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
