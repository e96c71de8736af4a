"""The README is what a newcomer runs: its test command is CI's, and its Python example runs as written."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readmes_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(line for line in ci.splitlines() if "pytest" in line)
    assert test_command in README


def test_readme_python_example_runs(tmp_path):
    example = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the tiny model: one thread is many times faster on a busy machine
    result = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "my-model" / "model.safetensors").exists()


def test_readme_stays_one_page_and_names_only_files_and_modules_that_exist():
    assert len(README.encode()) < 16 * 1024
    paths = set(re.findall(r"\b((?:scripts|benchmarks|configs)/[\w./-]+\.(?:py|sh|yaml|md))", README))
    assert paths and [p for p in sorted(paths) if not (ROOT / p).is_file()] == []
    modules = set(re.findall(r"`(vaswani_mt(?:\.[a-z_0-9]+)+)", README))
    missing = []
    for dotted in sorted(modules):  # a module, or a module's attribute (`vaswani_mt.system.native_bf16`)
        parts = dotted.split(".")
        if not any((ROOT / Path(*parts[:n])).with_suffix(".py").is_file() or (ROOT / Path(*parts[:n])).is_dir()
                   for n in (len(parts), len(parts) - 1)):  # fmt: skip
            missing.append(dotted)
    assert missing == []
