"""The commands as one family (vaswani_mt/cli): one rule for the folder a command writes (export, average and
publish refuse a non-empty --output without --overwrite, and with it replace the folder only once the new one is
whole)."""

import json
import shutil

import pytest

from vaswani_mt.cli import average, export, publish


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
