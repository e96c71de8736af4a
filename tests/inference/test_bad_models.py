"""A folder that is not a servable vaswani_mt model gets one clear line from every entry point (issue 26, item 4).

Each bad folder (missing, empty, garbage or impossible config.json, a config edited after saving, another model type,
pickle-only or truncated weights, a Hub id that cannot be fetched) is given to every entry point: translate,
evaluate, export, publish, attention plots and the demo. Each must end with exactly one line, `error: ...`, that
names the folder and what is wrong, exit non-zero, print no traceback and write nothing. The whole matrix runs
in-process (the scripts' `__main__`, as `python script.py` runs it); a sample runs as real subprocesses, and the full
matrix of subprocesses is marked slow. The bad folders come from tests/conftest.py (`bad`); what `load_for_inference`
says of each, and of each broken file: test_loading.py.
"""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BAD_FOLDERS, assert_one_clear_line

ROOT = Path(__file__).resolve().parents[2]


def entry_point_command(entry: str, model: str, root: Path, output: Path) -> list[str]:
    """The command line of `entry` on `model`; anything it would write goes under `output`."""
    scripts = ROOT / "scripts"
    return {
        "translate": [scripts / "translate.py", "--model", model, "--input", root / "source.en"],
        "evaluate": [scripts / "evaluate_model.py", "--model", model, "--source_file", root / "source.en",
                     "--reference_file", root / "reference.de", "--output", output / "hypotheses.de"],
        "export": [scripts / "export.py", "--model", model, "--format", "marian", "--output", output / "marian"],
        "publish": [scripts / "push_to_hub.py", "--model", model, "--repo_id", "alice/tiny", "--output",
                    output / "hub", "--dry_run"],
        "attention_plots": [scripts / "visualize_attention.py", "--model", model, "--text", "Hello.",
                            "--output_dir", output / "attention"],
        "demo": [ROOT / "app.py", model, "--port", "9"],  # the model is checked before the server starts
    }[entry]  # fmt: skip


ENTRY_POINTS = ["translate", "evaluate", "export", "publish", "attention_plots", "demo"]


@pytest.mark.parametrize("folder", list(BAD_FOLDERS))
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_refuses_every_bad_folder_in_one_line(entry, folder, bad, tmp_path, monkeypatch, capfd,
                                                                 offline):  # fmt: skip
    command = [str(part) for part in entry_point_command(entry, bad[folder], bad["root"], tmp_path)]
    monkeypatch.setattr(sys, "argv", command)
    if entry == "demo":  # a folder that loaded would start a server here: fail instead of serving
        monkeypatch.setattr("gradio.Blocks.launch", lambda *args, **kwargs: pytest.fail("the demo started"))
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(command[0], run_name="__main__")  # what `python script.py ...` runs
    # `sys.exit("error: ...")`: the interpreter prints the string to stderr and exits with status 1.
    assert isinstance(exit_.value.code, str), exit_.value.code
    assert_one_clear_line(exit_.value.code, bad[folder], BAD_FOLDERS[folder])
    out, err = capfd.readouterr()
    assert "Traceback" not in err and not out
    assert not any(tmp_path.iterdir())  # nothing written: the folder is checked before any output exists


def run_script(command: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, *map(str, command)], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env, stdin=subprocess.DEVNULL)  # fmt: skip


def assert_refused_in_one_line(result: subprocess.CompletedProcess, model: str, expected: str) -> None:
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not result.stdout, result.stderr[-2000:]
    assert_one_clear_line(result.stderr.strip().splitlines()[-1], model, expected)


# Two real processes in the default run (each pays ~10 s of imports on one core): the rest of the matrix runs
# in-process above, and all of it as processes under -m slow.
@pytest.mark.parametrize(("entry", "folder"), [("translate", "config_disagrees_with_weights"), ("publish", "marian")])
def test_scripts_refuse_a_bad_folder_as_real_processes(entry, folder, bad, tmp_path):
    result = run_script(entry_point_command(entry, bad[folder], bad["root"], tmp_path), cwd=tmp_path)
    assert_refused_in_one_line(result, bad[folder], BAD_FOLDERS[folder])
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("folder", list(BAD_FOLDERS))
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_refuses_every_bad_folder_as_a_real_process(entry, folder, bad, tmp_path):
    result = run_script(entry_point_command(entry, bad[folder], bad["root"], tmp_path / "out"), cwd=tmp_path)
    assert_refused_in_one_line(result, bad[folder], BAD_FOLDERS[folder])
    assert not (tmp_path / "out").exists()
