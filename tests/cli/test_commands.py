"""The commands as one family (vaswani_mt/cli): `--help` and bad options answered before the library is imported
or a model loads, and one rule for the folder a command writes (export, average and publish refuse a non-empty
--output without --overwrite, and with it replace the folder only once the new one is whole)."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vaswani_mt.cli import average, evaluate, export, publish, translate

ROOT = Path(__file__).resolve().parents[2]
# What each command imports, and how long it takes, to answer --help once `import vaswani_mt` has run (that import
# registers the model with transformers' Auto classes, so it loads torch and transformers whatever a command does).
_HELP_PROBE = r"""
import contextlib, importlib, io, json, sys, time
start = time.perf_counter()
import vaswani_mt
report, loaded = {"import vaswani_mt": time.perf_counter() - start}, set(sys.modules)
for name in sys.argv[1:]:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as text:
        try:
            importlib.import_module(f"vaswani_mt.cli.{name}").main(["--help"])
        except SystemExit as stop:
            code = stop.code
    new = sorted(m for m in set(sys.modules) - loaded
                 if m.split(".")[0] not in sys.stdlib_module_names and not m.startswith("vaswani_mt.cli"))
    report[name] = {"seconds": time.perf_counter() - start, "code": code, "new": new, "help": text.getvalue()}
    loaded = set(sys.modules)
print(json.dumps(report))
"""
# train.py's options are transformers' Seq2SeqTrainingArguments: its parser needs transformers' training stack.
PARSED_WITH_THE_LIBRARY = {"train"}


def test_every_command_answers_help_before_it_imports_the_library():
    commands = sorted(p.stem for p in (ROOT / "vaswani_mt" / "cli").glob("*.py") if p.stem != "__init__")
    commands = [c for c in commands if c not in PARSED_WITH_THE_LIBRARY] + sorted(PARSED_WITH_THE_LIBRARY)
    done = subprocess.run([sys.executable, "-c", _HELP_PROBE, *commands], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    for name in commands:
        assert report[name]["code"] == 0 and report[name]["help"].startswith("usage: "), name
    # The search's defaults are the model's (its generation_config.json), not numbers of ours
    searching = {name: " ".join(report[name]["help"].split()) for name in ("translate", "evaluate", "visualize")}
    assert all("beam size (default: the model's)" in text for text in searching.values())
    assert [name for name, text in searching.items() if re.search(r"(model's|paper's) \(?\d|beam \d", text)] == []
    light = {name: report[name] for name in commands if name not in PARSED_WITH_THE_LIBRARY}
    assert {name: row["new"] for name, row in light.items() if row["new"]} == {}  # nothing but argparse's own
    assert max(row["seconds"] for row in light.values()) < 1.0, report


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--nbest", "8"], "nbest=8 is more than the beam size (4): the search keeps 4 hypotheses"),
     (["--nbest", "2", "--num_beams", "1"], "nbest=2 is more than the beam size (1)"),
     (["--max_tokens", "0"], "max_tokens must be at least 1, got 0"),
     (["--constraints", "ordered", "--num_beams", "1"], "constraints need beam search (num_beams > 1)"),
     (["--sampling", "--topp", "0"], "top-p must be in (0, 1], got 0.0"),
     (["--seed", "3"], "--seed only goes with --sampling")],
)  # fmt: skip
def test_bad_decoding_options_are_refused_before_the_model_loads(options, message, tmp_path, monkeypatch):
    folder = tmp_path / "model"  # its search alone, read as JSON: there is no model to load
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"num_beams": 4, "length_penalty": 0.6}))
    monkeypatch.setattr("vaswani_mt.inference.ensemble.load_ensemble", lambda *_, **__: pytest.fail("the model loaded"))
    code = _exit_message(translate.main, ["--model", str(folder), *options])
    assert isinstance(code, str) and code.startswith("error: ") and message in code
    if "--sampling" not in options and "--seed" not in options:  # evaluate does not sample
        (tmp_path / "a.en").write_text("Hello.\n")
        files = ["--input", str(tmp_path / "a.en"), "--reference_file", str(tmp_path / "a.en")]
        nbest = ["--nbest_file", str(tmp_path / "nbest")] if "--nbest" in options else []
        assert _exit_message(evaluate.main, ["--model", str(folder), *files, *options, *nbest]) == code


def _exit_message(main, argv: list[str]) -> str | int | None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code


@pytest.fixture
def run_folder(fitted_folder, tmp_path):
    """A run's output folder with two complete checkpoints (copies of the fitted model)."""
    run = tmp_path / "run"
    for step in (1, 2):
        shutil.copytree(fitted_folder, run / f"checkpoint-{step}")
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    return run


def test_a_non_empty_output_is_refused_in_one_line_before_any_work(fitted_folder, run_folder, tmp_path):
    output = tmp_path / "taken"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    refusal = f"error: {output} exists and is not empty: choose another --output, or pass --overwrite"
    commands = {
        export.main: ["--model", str(fitted_folder), "--format", "marian", "--output", str(output)],
        average.main: ["--model", str(run_folder), "--last", "2", "--output", str(output)],
        publish.main: ["--model", str(fitted_folder), "--repo_id", "u/m", "--dry_run", "--output", str(output)],
    }
    for main, argv in commands.items():
        assert _exit_message(main, argv) == refusal
    assert [p.name for p in output.iterdir()] == ["notes.txt"]
    # --overwrite never replaces the folder read, nor one that holds it
    for target in (fitted_folder, fitted_folder.parent):
        argv = ["--model", str(fitted_folder), "--format", "marian", "--output", str(target), "--overwrite"]
        assert _exit_message(export.main, argv) == (
            f"error: --output {target} would replace {fitted_folder}, which it reads: choose another --output"
        )


def test_overwrite_replaces_the_output_whole_and_a_failed_run_leaves_it_as_it_was(fitted_folder, run_folder,
                                                                                  tmp_path, monkeypatch):  # fmt: skip
    output = tmp_path / "out"
    output.mkdir()
    (output / "stale.bin").write_text("from an earlier export")
    argv = ["--model", str(fitted_folder), "--format", "marian", "--output", str(output), "--overwrite"]
    export.main(argv)
    assert json.loads((output / "config.json").read_text())["model_type"] == "marian"
    assert not (output / "stale.bin").exists()  # replaced, not written over
    average.main(["--model", str(run_folder), "--last", "2", "--output", str(output), "--overwrite"])
    assert json.loads((output / "config.json").read_text())["model_type"] == "vaswani_mt"
    before = sorted(p.name for p in output.iterdir())

    def fail_half_way(model, tokenizer, folder):
        (folder / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("vaswani_mt.export.marian.save_marian", fail_half_way)
    with pytest.raises(OSError, match="No space left"):
        export.main(argv)
    assert sorted(p.name for p in output.iterdir()) == before  # the averaged model, whole
    assert json.loads((output / "config.json").read_text())["model_type"] == "vaswani_mt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]  # no half-written sibling left


def test_evaluate_reports_unreadable_misaligned_or_empty_files_in_one_line(fitted_folder, tmp_path):
    (tmp_path / "two.en").write_text("Hello.\nThe house.\n")
    (tmp_path / "one.de").write_text("Hallo.\n")
    (tmp_path / "empty.en").write_text("")
    (tmp_path / "empty.de").write_text("")
    model = ["--model", str(fitted_folder), "--reference_file"]
    cases = [
        ([*model, str(tmp_path / "one.de"), "--input", str(tmp_path / "nope.en")], "nope.en: cannot be read"),
        ([*model, str(tmp_path / "one.de"), "--input", str(tmp_path / "two.en")], "two.en has 2 lines but"),
        ([*model, str(tmp_path / "empty.de"), "--input", str(tmp_path / "empty.en")], "empty.en: no sentences"),
        (["--hypotheses", str(tmp_path / "empty.en"), "--references", str(tmp_path / "empty.de")], "no sentences"),
    ]
    for argv, message in cases:
        code = _exit_message(evaluate.main, argv)
        assert isinstance(code, str) and code.startswith("error: ") and message in code and "\n" not in code, code


def test_every_option_of_every_command_says_what_it_does(monkeypatch):
    import argparse
    import importlib

    parsers = {}

    class Parsed(Exception):
        pass

    def capture(self, *args, **kwargs):
        parsers[current] = self
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)  # parse_args calls it too
    commands = sorted(p.stem for p in (ROOT / "vaswani_mt" / "cli").glob("*.py") if p.stem != "__init__")
    for current in [c for c in commands if c not in PARSED_WITH_THE_LIBRARY]:  # read by `capture`
        with pytest.raises(Parsed):
            importlib.import_module(f"vaswani_mt.cli.{current}").main([])
    silent = {prog: [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
              for prog, parser in parsers.items()}  # fmt: skip
    assert len(parsers) >= 6 and {prog: options for prog, options in silent.items() if options} == {}


def test_a_command_freezes_the_libraries_objects_and_a_program_calling_main_keeps_its_collector(monkeypatch):
    """`start_command`: gc.freeze() where the process is one of our commands (its exit then skips the collector's
    pass over torch's and transformers' objects); a program that calls `main()` (here, pytest) is left as it was."""
    import gc

    import vaswani_mt
    from vaswani_mt.cli import start_command

    frozen = gc.get_freeze_count()
    start_command()
    assert gc.get_freeze_count() == frozen
    monkeypatch.setattr(vaswani_mt, "_started_as_a_command", lambda: True)
    try:
        start_command()
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()


# Runs each console entry point (`module:function`) with its arguments, in one process where the optional packages
# cannot be imported (as after a plain `pip install vaswani-mt`), and prints each one's exit status or line.
_WITHOUT_EXTRAS_PROBE = r"""
import contextlib, importlib, io, json, sys
for optional in ("ctranslate2", "gradio", "eflomal", "playwright"):
    sys.modules[optional] = None  # `import optional` raises ModuleNotFoundError
report = {}
for name, (target, argv) in json.loads(sys.argv[1]).items():
    module, function = target.split(":")
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            getattr(importlib.import_module(module), function)(argv)
            report[name] = None
        except SystemExit as stop:
            report[name] = stop.code
print(json.dumps(report))
"""


def test_every_console_entry_point_without_its_optional_packages_names_the_extra_in_one_line(fitted_folder, tmp_path):
    """A command that needs an extra which is not installed says which, in one line, before any model loads; the
    others answer as usual (`--help`)."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    ct2 = tmp_path / "ct2"  # what is_ctranslate2_folder takes for an export: its model.bin is never read here
    ct2.mkdir()
    (ct2 / "model.bin").write_bytes(b"")
    (ct2 / "config.json").write_text("{}")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(fitted_folder / name, ct2 / name)
    (tmp_path / "a.en").write_text("Hello.\n")
    files = ["--input", str(tmp_path / "a.en"), "--reference_file", str(tmp_path / "a.en")]
    export_ct2 = ["--model", str(fitted_folder), "--format", "ctranslate2", "--output", str(tmp_path / "out")]
    needs = {
        "vaswani-mt-train": (["--output_dir", str(tmp_path / "run"), "--alignment_supervision"], "align"),
        "vaswani-mt-translate": (["--model", str(ct2)], "ctranslate2"),
        "vaswani-mt-evaluate": (["--model", str(ct2), *files], "ctranslate2"),
        "vaswani-mt-export": (export_ct2, "ctranslate2"),
        "vaswani-mt-demo": ([str(fitted_folder)], "demo"),
    }
    runs = {name: (target, needs[name][0] if name in needs else ["--help"]) for name, target in scripts.items()}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_EXTRAS_PROBE, json.dumps(runs)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert sorted(report) == sorted(scripts) and set(needs) <= set(scripts)
    for name, code in report.items():
        if name not in needs:
            assert code == 0, (name, code)
            continue
        assert isinstance(code, str) and code.startswith("error: ") and "\n" not in code, (name, code)
        assert f"pip install 'vaswani-mt[{needs[name][1]}]'" in code, (name, code)
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists() and not (tmp_path / "out").exists()
