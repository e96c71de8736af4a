"""Every command keeps transformers', datasets' and huggingface_hub's progress bars off its stderr ("Loading weights",
"Writing model shards", "Map", "Generating ... split", ...: `vaswani_mt.cli.quiet_library_bars`), while the training
bar, ours, stays."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import train_command, write_jsonl

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LIBRARY_BARS = ("Loading weights", "Writing model shards", "Map", "Filter", "tokenizing ", "Generating ",
                "Saving the dataset", "Loading dataset")  # fmt: skip
# Runs each command's main in one process, with the library bars turned back on before each (as a fresh process
# starts), and reports what it wrote to stderr and whether it left the bars off. `control`: no command, the fitted
# folder loaded and saved with the bars on, what the commands would print without quiet_library_bars.
_PROBE = r"""
import contextlib, importlib, io, json, os, sys
from transformers.utils import logging as transformers_logging

def library_bars_off():
    if "datasets" in sys.modules:
        datasets_off = not sys.modules["datasets"].is_progress_bar_enabled()
    else:
        datasets_off = os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS") == "1"
    return datasets_off and not transformers_logging.is_progress_bar_enabled()

report = {}
for name, argv in json.loads(sys.argv[1]):
    transformers_logging.enable_progress_bar()
    if "datasets" in sys.modules and "HF_DATASETS_DISABLE_PROGRESS_BARS" not in os.environ:  # else it has priority
        sys.modules["datasets"].enable_progress_bars()
    if name == "demo":  # the model loads as the demo loads it, and nothing is served
        import vaswani_mt.app.demo
        from vaswani_mt.inference.loading import load_for_inference
        vaswani_mt.app.demo.launch = lambda model, **_: load_for_inference(model, attn_implementation="eager")
    if name == "publish":  # its check loads the folder in a fresh process of its own, whose stderr it keeps
        import vaswani_mt.hub.publish
        vaswani_mt.hub.publish.check_hub_folder = lambda *_, **__: {"class": "not checked here"}
    with contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())), contextlib.redirect_stderr(io.StringIO()) as err:
        if name == "control":
            from vaswani_mt.inference.loading import load_for_inference
            load_for_inference(argv[0])[0].save_pretrained(argv[1])
        else:
            importlib.import_module(f"vaswani_mt.cli.{name}").main(argv)
    report[name] = {"stderr": err.getvalue(), "bars_off": library_bars_off()}
print(json.dumps(report))
"""


def _library_bars(stderr: str) -> list[str]:
    return [bar for bar in LIBRARY_BARS if bar in stderr]


def test_commands_print_no_library_progress_bars(fitted_folder, tmp_path):
    run = tmp_path / "run"  # a run with two complete checkpoints, for average
    for step in (1, 2):
        shutil.copytree(fitted_folder, run / f"checkpoint-{step}")
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "source.en").write_text("The house.\nA small cat.\n")
    corpus = tmp_path / "corpus"  # a local dataset folder: datasets' builder draws "Generating test split"
    corpus.mkdir()
    shutil.copy(write_jsonl(corpus / "train.jsonl", count=20), corpus / "test.jsonl")
    model, table3_cpu = ["--model", str(fitted_folder)], CONFIGS / "table3_cpu.yaml"
    commands = [  # evaluate first: datasets is imported after its quiet_library_bars, as in a fresh process
        ("evaluate", [*model, "--dataset", str(corpus), "--max_samples", "2", "--num_beams", "1"]),
        ("translate", [*model, "--input", str(tmp_path / "source.en"), "--num_beams", "1"]),
        ("average", ["--model", str(run), "--last", "2", "--output", str(tmp_path / "averaged")]),
        ("export", [*model, "--format", "marian", "--output", str(tmp_path / "marian")]),
        ("publish", [*model, "--repo_id", "u/m", "--dry_run", "--output", str(tmp_path / "hub")]),
        ("visualize", [*model, "--text", "The house.", "--output", str(tmp_path / "plots"), "--num_beams", "1"]),
        ("demo", model),
        ("table3", ["--rows", "base", "--scale", str(table3_cpu), "--rows_dir", str(CONFIGS / "table3"), "--list"]),
        ("control", [str(fitted_folder), str(tmp_path / "saved")]),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(commands)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    control = report.pop("control")
    assert _library_bars(control["stderr"]) == ["Loading weights", "Writing model shards"]
    assert {name: _library_bars(row["stderr"]) for name, row in report.items() if _library_bars(row["stderr"])} == {}
    assert [name for name, row in report.items() if not row["bars_off"]] == []


def test_the_training_job_prints_its_own_bar_and_no_library_bars(tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", count=60)
    command = train_command(data, tmp_path / "run", "--max_steps", "2", "--save_steps", "1", "--average_last", "2")
    command += ["--disable_tqdm", "false"]  # the averaging loads weights; each checkpoint writes them
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "averaged checkpoint-1, checkpoint-2" in done.stderr
    assert _library_bars(done.stderr) == []
    assert "2/2 [" in done.stderr  # the training bar
