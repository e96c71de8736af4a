"""Gettext catalogs (issue 67, items 3 and 4): `translate.py --input app.pot --output de.po` fills every empty msgstr
with its format directives exactly as in the msgid, marks it fuzzy, keeps msgctxt, comments, references, flags and
the translations already there, fills every plural form of the target's Plural-Forms, and GNU gettext's
`msgfmt -c --use-fuzzy` accepts each .po written (skipped, with the reason, where msgfmt is not installed)."""

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ENGLISH, run_main

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


def test_a_stopped_catalog_keeps_the_finished_entries_and_the_same_command_continues(fitted_folder, tmp_path,
                                                                                    monkeypatch, capsys):  # fmt: skip
    import signal

    from vaswani_mt.cli import translate as command

    load, calls = command.load_translator, []

    def load_and_signal_at_batch_3(args, options):
        translator = load(args, options)
        generate = translator.backend.model.generate

        def generate_and_signal(*a, **k):
            calls.append(1)
            if len(calls) == 3:
                signal.raise_signal(signal.SIGTERM)
            return generate(*a, **k)

        monkeypatch.setattr(translator.backend.model, "generate", generate_and_signal)
        return translator

    source, target = tmp_path / "app.pot", tmp_path / "de.po"
    source.write_text(HEADER + ENTRIES, encoding="utf-8")
    extra = ("--language", "de", "--chunk_size", "1", "--num_beams", "1")
    monkeypatch.setattr(command, "load_translator", load_and_signal_at_batch_3)
    _, code = run_catalog(fitted_folder, source, target, monkeypatch, *extra)
    assert code == 128 + signal.SIGTERM and not target.exists()
    partial = polib.pofile(f"{target}.partial")
    assert [bool(e.msgstr) for e in partial][:3] == [True, True, False] and len(partial.translated_entries()) == 0
    assert "interrupted: 2 entries written to" in capsys.readouterr().err
    monkeypatch.setattr(command, "load_translator", load)
    _, code = run_catalog(fitted_folder, source, target, monkeypatch, *extra)
    assert code is None and "continuing" in capsys.readouterr().err and not Path(f"{target}.partial").exists()
    catalog = polib.pofile(str(target))
    assert [e.msgstr for e in catalog][:2] == [e.msgstr for e in partial][:2] and not catalog.untranslated_entries()
    check_with_msgfmt(target)


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
