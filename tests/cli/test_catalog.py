"""Gettext catalogs (issue 67, items 3 and 4): `translate.py --input app.pot --output de.po` fills every empty msgstr
with its format directives exactly as in the msgid, marks it fuzzy, keeps msgctxt, comments, references, flags and
the translations already there, fills every plural form of the target's Plural-Forms, and GNU gettext's
`msgfmt -c --use-fuzzy` accepts each .po written (skipped, with the reason, where msgfmt is not installed)."""

import random
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ENGLISH, exit_code, run_main, stop_at_batch

from vaswani_mt.cli import translate as translate_cli
from vaswani_mt.inference.directives import directives, formats_of
from vaswani_mt.inference.translate import translate

polib = pytest.importorskip("polib")
pytestmark = pytest.mark.usefixtures("one_thread")

HEADER = r"""# SOME DESCRIPTIVE TITLE.
#, fuzzy
msgid ""
msgstr ""
"Project-Id-Version: app 1.0\n"
"PO-Revision-Date: YEAR-MO-DA HO:MI+ZONE\n"
"Language: \n"
"MIME-Version: 1.0\n"
"Content-Type: text/plain; charset=CHARSET\n"
"Content-Transfer-Encoding: 8bit\n"
"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\n"
"""
ENTRIES = r"""
#. TRANSLATORS: schema and table
#: src/index.c:120
#, c-format
msgid "while reindexing partitioned table \"%s.%s\""
msgstr ""

#: src/main.c:44
#, c-format
msgid "unable to open output file '%.250s': %s\n"
msgstr ""

#, c-format
msgid "%u of %lu bytes (%04X, %Zd, %03d, %c, %g, %ld) %.*s %*s at %5.1f%%"
msgstr ""

#, c-format
msgid "%2$s is %1$d bytes, %<PRIu64> blocks"
msgstr ""

#: src/main.c:50
#, c-format
msgid "%d file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""

#: src/menu.c:9
msgctxt "menu"
msgid "Open"
msgstr ""

#, python-format
msgid "Hello %(name)s, you have %(count)d new messages (%s)"
msgstr ""

#, python-brace-format
msgid "Delete {0} of {total} files? {name!r:>10}"
msgstr ""

#, qt-format
msgid "Copied %1 of %2 files"
msgstr ""

#, sh-format
msgid "Installing $PACKAGE into ${PREFIX}"
msgstr ""

msgid "The house is small."
msgstr ""
"""
DONE = r"""
msgid "The girl ate an apple."
msgstr "Das Mädchen aß einen Apfel."

#, fuzzy
msgid "How are you today?"
msgstr "Wie geht es?"
"""


def check_with_msgfmt(path: Path) -> None:
    """GNU gettext's own check of a .po (C and Python formats, plural forms, header); skipped where it is missing."""
    msgfmt = shutil.which("msgfmt")
    if msgfmt is None:
        pytest.skip("msgfmt (GNU gettext) is not installed: apt-get install gettext")
    done = subprocess.run([msgfmt, "-c", "--use-fuzzy", "-o", "/dev/null", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def run_catalog(folder, source: Path, target: Path, monkeypatch, *extra: str):
    argv = ["--model", str(folder), "--input", str(source), "--output", str(target), *extra]
    return run_main(translate_cli, argv, monkeypatch)


def test_a_pot_becomes_a_po_with_every_directive_exact_fuzzy_and_msgfmt_clean(fitted_folder, tmp_path, monkeypatch):
    source, target = tmp_path / "app.pot", tmp_path / "de.po"
    source.write_text(HEADER + ENTRIES, encoding="utf-8")
    _, code = run_catalog(fitted_folder, source, target, monkeypatch, "--language", "de")
    assert code is None
    template, catalog = polib.pofile(str(source)), polib.pofile(str(target))
    assert catalog.metadata["Language"] == "de" and catalog.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    assert [(e.msgctxt, e.msgid, e.msgid_plural, e.comment, e.occurrences) for e in catalog] == [
        (e.msgctxt, e.msgid, e.msgid_plural, e.comment, e.occurrences) for e in template]  # fmt: skip
    for entry in catalog:
        assert "fuzzy" in entry.flags and set(entry.flags) - {"fuzzy"} == set(template.find(entry.msgid).flags)
        formats = formats_of(entry.flags)
        forms = [entry.msgstr] if not entry.msgid_plural else [entry.msgstr_plural[0], entry.msgstr_plural[1]]
        for form, msgid in zip(forms, [entry.msgid, entry.msgid_plural][: len(forms)], strict=True):
            assert form.strip(), entry.msgid
            assert sorted(directives(form, formats, False)) == sorted(directives(msgid, formats, False)), form
            assert form.endswith("\n") == msgid.endswith("\n")
    # an entry without directives is translated exactly as the same text line
    assert catalog.find("The house is small.").msgstr == translate(*load(fitted_folder), ["The house is small."])[0]
    check_with_msgfmt(target)


def load(folder):
    from vaswani_mt.inference.loading import load_for_inference

    return load_for_inference(str(folder), device="cpu")


def test_translations_already_there_are_kept_and_retranslate_refills_the_fuzzy_ones(fitted_folder, tmp_path,
                                                                                    monkeypatch):  # fmt: skip
    source, target = tmp_path / "de.po", tmp_path / "out.po"
    source.write_text(HEADER.replace('"Language: \\n"', '"Language: de\\n"') + DONE + ENTRIES, encoding="utf-8")
    _, code = run_catalog(fitted_folder, source, target, monkeypatch)  # the language from the catalog
    assert code is None
    catalog = polib.pofile(str(target))
    assert catalog.find(ENGLISH[0]).msgstr == "Das Mädchen aß einen Apfel." and not catalog.find(ENGLISH[0]).fuzzy
    assert catalog.find("How are you today?").msgstr == "Wie geht es?"  # fuzzy, but there: kept
    _, code = run_catalog(fitted_folder, source, target, monkeypatch, "--retranslate")
    catalog = polib.pofile(str(target))
    assert catalog.find(ENGLISH[0]).msgstr == "Das Mädchen aß einen Apfel."  # reviewed: never touched
    assert catalog.find("How are you today?").msgstr != "Wie geht es?" and catalog.find("How are you today?").fuzzy
    check_with_msgfmt(target)


def test_plural_forms_follow_the_target_language(fitted_folder, tmp_path, monkeypatch):
    source, target = tmp_path / "messages", tmp_path / "ru.po"  # no extension: --format po
    source.write_text(HEADER + ENTRIES, encoding="utf-8")
    _, code = run_catalog(fitted_folder, source, target, monkeypatch, "--format", "po", "--language", "ru")
    assert code is None
    catalog = polib.pofile(str(target))
    entry = catalog.find("%d file")
    assert catalog.metadata["Plural-Forms"].startswith("nplurals=3;") and sorted(entry.msgstr_plural) == [0, 1, 2]
    assert all(directives(form, formats_of(["c-format"])) == ["%d"] for form in entry.msgstr_plural.values())
    check_with_msgfmt(target)


def test_an_entry_that_fails_is_left_empty_and_the_run_exits_1(fitted_folder, tmp_path, monkeypatch, capsys, caplog):
    import vaswani_mt.inference.markup as markup
    from vaswani_mt.inference.markup import restore

    def restore_or_raise(plan, translation, *rule):
        if "%u of" in plan.line:
            raise IndexError("list index out of range")
        return restore(plan, translation, *rule)

    monkeypatch.setattr(markup, "restore", restore_or_raise)
    source, target = tmp_path / "app.pot", tmp_path / "de.po"
    source.write_text(HEADER + ENTRIES, encoding="utf-8")
    _, code = run_catalog(fitted_folder, source, target, monkeypatch, "--language", "de")
    assert code == 1
    catalog = polib.pofile(str(target))
    assert [e.msgid for e in catalog.untranslated_entries()] == [e.msgid for e in catalog if "%u of" in e.msgid]
    assert len(catalog.fuzzy_entries()) == len(catalog) - 1
    err = capsys.readouterr().err
    assert "line 3: markup not put back (IndexError: list index out of range)" in caplog.text
    assert "10 entries translated (fuzzy), 0 kept, 1 left empty" in err
    assert "error: 1 of 12 lines written as their source" in err
    check_with_msgfmt(target)


def test_a_catalog_refuses_what_it_cannot_take(fitted_folder, tmp_path, monkeypatch, capsys):
    source = tmp_path / "app.pot"
    source.write_text(HEADER + ENTRIES, encoding="utf-8")
    _, code = run_catalog(fitted_folder, source, tmp_path / "x.po", monkeypatch, "--nbest", "2")
    assert code == "error: --nbest does not go with a gettext catalog (--format po)"
    _, code = run_catalog(fitted_folder, source, tmp_path / "x.po", monkeypatch, "--language", "xx")
    assert "no Plural-Forms known for language 'xx'" in code and not (tmp_path / "x.po").exists()


@pytest.mark.parametrize("retranslate", [(), ("--retranslate",)], ids=["fill", "retranslate"])
def test_a_stopped_catalog_then_the_same_command_gives_the_uninterrupted_bytes_translating_no_line_twice(
    fitted_folder, tmp_path, monkeypatch, capsys, retranslate
):
    """A stop leaves the finished lines (de.po.shards/); the same command continues from the chunk the stop fell in
    and writes the uninterrupted run's bytes. With --retranslate too: the rerun reads the input, not what the stopped
    run filled (and marked fuzzy), so it translates none of those again."""
    from vaswani_mt.inference.backends import TorchBackend
    from vaswani_mt.inference.catalogs import catalog_work

    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    source, whole, target = tmp_path / "de.po", tmp_path / "whole.po", tmp_path / "out.po"
    source.write_text(HEADER.replace('"Language: \\n"', '"Language: de\\n"') + DONE + ENTRIES, encoding="utf-8")
    extra = ("--chunk_size", "2", "--num_beams", "1", *retranslate)
    lines = len(catalog_work(polib.pofile(str(source)), "de", retranslate=bool(retranslate)).lines)
    assert run_catalog(fitted_folder, source, whole, monkeypatch, *extra)[1] is None
    with monkeypatch.context() as patch:
        stop_at_batch(patch, TorchBackend, batch=3)  # chunks 1 and 2 (4 lines) done
        assert run_catalog(fitted_folder, source, target, monkeypatch, *extra)[1] == 130
    assert not target.exists() and "rerun the same command to continue" in capsys.readouterr().err
    searched = stop_at_batch(monkeypatch, TorchBackend, batch=10**9)
    assert run_catalog(fitted_folder, source, target, monkeypatch, *extra)[1] is None
    assert sum(searched) == lines - 4  # not the 4 lines done, nor (--retranslate) their entries again
    assert target.read_bytes() == whole.read_bytes() and not Path(f"{target}.shards").exists()
    check_with_msgfmt(target)


def _catalog(entries: int, seed: int = 3) -> str:
    """A catalog of `entries` entries of the fitted model's words, each with its own msgctxt: C directives (a plural
    each fourth), Python ones, none."""
    words = " ".join(ENGLISH).replace(".", "").replace("?", "").replace("!", "").replace(",", "").split()
    draw = random.Random(seed)
    parts = [HEADER.replace('"Language: \\n"', '"Language: de\\n"')]
    for k in range(entries):
        text = " ".join(draw.choice(words) for _ in range(draw.randint(2, 10)))
        parts.append([f'\n#, c-format\nmsgctxt "k{k}"\nmsgid "{text} %s of %d"\nmsgstr ""\n',
                      f'\n#, python-format\nmsgctxt "k{k}"\nmsgid "%(name)s: {text}"\nmsgstr ""\n',
                      f'\n#, c-format\nmsgctxt "k{k}"\nmsgid "%d {text}"\nmsgid_plural "%d {text}s"\nmsgstr[0] ""\n'
                      f'msgstr[1] ""\n', f'\nmsgctxt "k{k}"\nmsgid "{text}"\nmsgstr ""\n'][k % 4])  # fmt: skip
    return "".join(parts)


@pytest.fixture(scope="module")
def big_catalog(tmp_path_factory, fitted_folder):
    """A catalog of 320 entries (400 lines), its command's arguments by output, and one process's .po of it."""
    folder = tmp_path_factory.mktemp("big_catalog")
    source = folder / "app.po"
    source.write_text(_catalog(320), encoding="utf-8")

    def argv(output: Path) -> list[str]:
        return ["--model", str(fitted_folder), "--input", str(source), "--output", str(output), "--batch_size", "4",
                "--chunk_size", "16", "--num_beams", "2", "--threads", "1"]  # fmt: skip

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SOURCE_DATE_EPOCH", EPOCH)
        assert exit_code(translate_cli.main, argv(folder / "one.po")) is None
    catalog = polib.pofile(str(folder / "one.po"))
    assert len(catalog.fuzzy_entries()) > 300 and any(entry.msgstr_plural.get(1) for entry in catalog)
    check_with_msgfmt(folder / "one.po")
    return argv, (folder / "one.po").read_bytes()


EPOCH = "1700000000"  # SOURCE_DATE_EPOCH: the header's PO-Revision-Date the same in every run


def _launch_catalog(argv: list[str]):
    from test_sharded_translation import ENV, _launch

    ENV["SOURCE_DATE_EPOCH"] = EPOCH
    try:
        return _launch(argv)
    finally:
        del ENV["SOURCE_DATE_EPOCH"]


def test_a_killed_process_on_a_catalog_then_the_same_command_gives_one_process_bytes(big_catalog, tmp_path):
    """`accelerate launch` on a catalog (issue 67): its lines cut into shards of whole chunks, each entry's flags and
    plural forms read from the input by every process, the .po written by the first; a `kill -9` of one process,
    then the same command, gives one process's bytes."""
    from test_sharded_translation import _kill_one_worker

    argv, one = big_catalog
    killed = tmp_path / "killed.po"
    assert _kill_one_worker(argv(killed), killed, seed=0) != 0 and not killed.exists()
    result = _launch_catalog(argv(killed))
    assert result.returncode == 0, result.stderr[-3000:]
    assert killed.read_bytes() == one and not Path(f"{killed}.shards").exists()
    assert f"{killed}: 400 lines, 2 shards on 2 processes" in result.stderr


@pytest.mark.slow  # CI: the killed run's rerun (above)
def test_two_processes_on_one_catalog_write_one_process_bytes(big_catalog, tmp_path):
    argv, one = big_catalog
    two = tmp_path / "two.po"
    result = _launch_catalog(argv(two))
    assert result.returncode == 0, result.stderr[-3000:]
    assert two.read_bytes() == one and f"{two}: 400 lines, 2 shards on 2 processes" in result.stderr


def test_a_glossary_forces_its_terms_into_the_entries_that_have_them(fitted_folder, tmp_path, monkeypatch, capsys):
    source, target, glossary = tmp_path / "app.pot", tmp_path / "de.po", tmp_path / "terms.tsv"
    source.write_text(HEADER + ENTRIES, encoding="utf-8")
    glossary.write_text("# source<TAB>target\nfile\tDatei\nnew messages\tein Buch\n", encoding="utf-8")
    _, code = run_catalog(fitted_folder, source, target, monkeypatch, "--language", "de", "--glossary", str(glossary))
    assert code is None
    catalog = polib.pofile(str(target))
    for entry in catalog:
        formats = formats_of(entry.flags)
        forms = [entry.msgstr] if not entry.msgid_plural else list(entry.msgstr_plural.values())
        for form in forms:
            assert sorted(directives(form, formats, False)) == sorted(directives(entry.msgid, formats, False))
        if "file" in entry.msgid.split():  # "files" is another word: the plural has no term
            assert "Datei" in forms[0], forms
    assert "ein Buch" in catalog.find("Hello %(name)s, you have %(count)d new messages (%s)").msgstr  # never split
    check_with_msgfmt(target)
    _, code = run_catalog(fitted_folder, source, target, monkeypatch, "--constraints", "unordered")
    assert code.startswith("error: a gettext catalog's terms come from --glossary")


def test_without_language_the_model_cards_target_language_is_the_catalogs(fitted_folder, tmp_path, monkeypatch):
    source, target = tmp_path / "app.pot", tmp_path / "de.po"
    source.write_text(HEADER + ENTRIES, encoding="utf-8")  # "Language: " left empty, as xgettext writes it
    _, code = run_catalog(fitted_folder, source, target, monkeypatch)
    assert code is None and polib.pofile(str(target)).metadata["Language"] == "de"  # the card's `language: [en, de]`


def test_a_glossary_gives_each_line_its_terms_with_their_source_side():
    from vaswani_mt.inference.catalogs import catalog_work

    catalog = polib.POFile()
    catalog.metadata = {"Plural-Forms": "nplurals=2; plural=(n != 1);"}
    catalog.append(polib.POEntry(msgid="Open the <b>File</b> in the <i>new messages</i> folder."))
    catalog.append(polib.POEntry(msgid="Two files"))
    glossary = [("file", "Datei"), ("new messages", "neue Nachrichten"), ("folder", "Ordner")]
    work = catalog_work(catalog, "de", glossary=glossary)
    assert work.terms == [[("file", "Datei"), ("new messages", "neue Nachrichten"), ("folder", "Ordner")], []]
