"""The README is what a newcomer runs: its test command is CI's, and its Python example runs as written."""

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
    result = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "my-model" / "model.safetensors").exists()
