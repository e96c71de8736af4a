"""An exported folder given where it cannot serve (issue 45, item 3): one line that names it as the export it is and
says how to run it, not "another model type" (Marian) or "a config.json without model_type" (CTranslate2). A Marian
folder in translate or evaluate; a CTranslate2 folder, which those two translate with (issue 44, item 5:
tests/export/test_ctranslate2_backend.py), in the other commands (export)."""

import pytest
from conftest import assert_one_clear_line

from vaswani_mt.cli import evaluate as evaluate_cli
from vaswani_mt.cli import export as export_cli
from vaswani_mt.cli import translate as translate_cli

EXPECTED = {
    "marian": ["holds a 'marian' model, not a vaswani_mt one: import the MarianMTModel exactly with vaswani-mt-import",
               "MarianMTModel.from_pretrained(folder)"],
    "ctranslate2": ["holds a CTranslate2 export (model.bin), not a vaswani_mt model",
                    "vaswani-mt-translate and vaswani-mt-evaluate take it as --model",
                    "vaswani_mt.export.ctranslate2.CTranslate2Model(folder) (docs/export.md)"],
}  # fmt: skip


@pytest.fixture(scope="module")
def exported(fitted_folder, tmp_path_factory):
    """The fitted model exported both ways, as `vaswani-mt-export` writes them."""
    from vaswani_mt.export.marian import export_model

    root = tmp_path_factory.mktemp("exported")
    folders = {}
    for fmt in EXPECTED:
        if fmt == "ctranslate2":
            pytest.importorskip("ctranslate2")
        folders[fmt] = str(export_model(fitted_folder, fmt, root / fmt))
    (root / "source.en").write_text("Hello.\n")
    return root, folders


@pytest.mark.parametrize("fmt", list(EXPECTED))
def test_a_command_that_cannot_serve_an_export_names_it_and_how_to_run_it(exported, fmt, capfd):
    root, folders = exported
    source = str(root / "source.en")
    runs = {
        translate_cli: ["--model", folders[fmt], "--input", source],
        evaluate_cli: ["--model", folders[fmt], "--input", source, "--reference_file", source],
    }
    if fmt == "ctranslate2":  # translate and evaluate take it; export does not
        runs = {export_cli: ["--model", folders[fmt], "--format", "marian", "--output", str(root / "again")]}
    for module, argv in runs.items():
        with pytest.raises(SystemExit) as stop:
            module.main(argv)
        message = stop.value.code
        assert isinstance(message, str), message
        for part in EXPECTED[fmt]:
            assert_one_clear_line(message, folders[fmt], part)
    out, err = capfd.readouterr()
    assert not out and "Traceback" not in err
