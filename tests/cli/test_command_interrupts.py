"""SIGINT and SIGTERM to `vaswani-mt-translate` and `vaswani-mt-evaluate` as real processes on a long input (issue 45):
every line translated so far is written, in order, one line on stderr says where to rerun from, the exit status is
130 or 143, and there is no traceback. The library's part: tests/inference/test_interrupts.py. CI sends each
command one of the two signals; `pytest -m slow` the other one too."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ENGLISH, built_once

ROOT = Path(__file__).resolve().parents[2]
LINES = 3000
# The six sentences longest first, each 500 times: batches, which run longest first, then follow the input order, so
# that a run stopped midway has many lines before the first one not translated (evaluate sorts the whole input).
TEXT = "".join(f"{sentence}\n" * (LINES // 6) for sentence in sorted(ENGLISH, key=len, reverse=True))
pytestmark = pytest.mark.usefixtures("live_sigint")  # the commands get SIGINT live, even under nohup
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def command(name: str, model: Path, source: Path, output: Path | None = None) -> list[str]:
    """The command line of scripts/translate.py or scripts/evaluate_model.py on `source` (greedy search)."""
    if name == "translate":
        return [sys.executable, str(ROOT / "scripts" / "translate.py"), "--model", str(model), "--input", str(source),
                "--num_beams", "1"]  # fmt: skip
    return [sys.executable, str(ROOT / "scripts" / "evaluate_model.py"), "--model", str(model), "--input", str(source),
            "--reference_file", str(source), "--num_beams", "1", "--output", str(output)]  # fmt: skip


@pytest.fixture(scope="module")
def long_input(tmp_path_factory, fitted_folder):
    """The input file and the output of an uninterrupted run of translate on it (once per pytest run: `built_once`)."""

    def build(folder: Path) -> None:
        (folder / "long.en").write_text(TEXT)
        with open(folder / "whole.de", "wb") as out:
            subprocess.run(command("translate", fitted_folder, folder / "long.en"), stdout=out, env=ENV,
                           stderr=subprocess.DEVNULL, timeout=600, check=True, stdin=subprocess.DEVNULL)  # fmt: skip

    folder = built_once(tmp_path_factory, "long-input", build)
    whole = (folder / "whole.de").read_text().splitlines()
    assert len(whole) == LINES and all(whole)
    return folder / "long.en", whole


def _started(process: subprocess.Popen, output: Path, stderr: list[bytes]) -> bool:
    """Whether `process` has translated its first lines: some in `output` (translate), or a batch counted by the
    progress bar (evaluate, which writes its output at the end)."""
    if output.exists() and output.stat().st_size:
        return True
    counts = re.findall(rb"\| *(\d+)/\d+", b"".join(stderr))
    return bool(counts) and int(counts[-1]) > 0


@pytest.mark.parametrize(("name", "signum"), [
    pytest.param("translate", signal.SIGINT, id="translate-2"),
    pytest.param("evaluate", signal.SIGTERM, id="evaluate-15"),
    # each command and each signal are in CI above; the library stops alike on both (tests/inference/test_interrupts.py)
    pytest.param("translate", signal.SIGTERM, id="translate-15", marks=pytest.mark.slow),
    pytest.param("evaluate", signal.SIGINT, id="evaluate-2", marks=pytest.mark.slow),
])  # fmt: skip
def test_a_signal_writes_every_line_translated_and_says_where_to_rerun_from(name, signum, fitted_folder, long_input,
                                                                           tmp_path):  # fmt: skip
    source, whole = long_input
    output = tmp_path / "out.de"
    with open(output if name == "translate" else tmp_path / "stdout", "wb") as stdout:
        process = subprocess.Popen(command(name, fitted_folder, source, output), stdout=stdout,
                                   stderr=subprocess.PIPE, env=ENV, stdin=subprocess.DEVNULL)  # fmt: skip
        stderr: list[bytes] = []
        reader = threading.Thread(target=lambda: stderr.extend(iter(lambda: process.stderr.read1(4096), b"")))
        reader.start()
        deadline = time.monotonic() + 300
        while not _started(process, output, stderr):
            assert process.poll() is None, b"".join(stderr).decode()[-3000:]
            assert time.monotonic() < deadline, "no line translated in 300 s"
            time.sleep(0.05)
        process.send_signal(signum)
        process.wait(timeout=120)
        reader.join(timeout=60)
    err = b"".join(stderr).decode()
    assert process.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in err
    if name == "translate":
        written = output.read_text().splitlines()
        count = len(written)
        assert err.strip().splitlines()[-1] == (f"interrupted at line {count}: {count} lines written to <stdout>; "
                                                f"rerun with the input from line {count + 1} and --first_line "
                                                f"{count + 1}")  # fmt: skip
    else:  # the lines done go beside --output, which an interrupted evaluation never replaces
        assert not output.exists()
        written = Path(f"{output}.partial").read_text().splitlines()
        count = len(written)
        expected = (f"interrupted at line {count}: {count} lines translated, written to {output}.partial ({output} "
                    "left as they were); no scores")  # fmt: skip
        assert err.strip().splitlines()[-1] == expected
    assert 0 < count < LINES and written == whole[:count]
    if name == "evaluate":
        assert (tmp_path / "stdout").read_text() == ""  # no scores for a partial set
