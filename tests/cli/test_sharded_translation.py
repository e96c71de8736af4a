"""translate.py under `accelerate launch` (issue 53): the input split into shards of whole chunks with about equal
tokens, translated by two processes on one machine or by two machines (two launchers, gloo, as the multi-node
training tests run them), gives the bytes one process writes; a `kill -9` of one process at a random moment, then
the same command again, gives them too; a rerun with other options is refused in one line. Without a launcher,
`--output F` resumes a hard stop from F.partial's whole lines, chunk-aligned, to the same bytes.

CI kills one of two processes and reruns the command (two processes on one machine), and runs two machines without
a fault through the Slurm script (tests/training/test_machines.py: n-best lists and alignments, the bytes of one
process); `pytest -m slow` adds two processes and two machines without a fault here, kills five times over at random
moments, and loses a machine."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import ENGLISH, accelerate_launch, exit_code, free_port, stop_at_batch

from vaswani_mt.cli import translate as translate_cli
from vaswani_mt.inference.backends import TorchBackend
from vaswani_mt.inference.shards import ShardedOutput, plan_shards
from vaswani_mt.inference.streams import LineLimit, read_text_lines

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "translate.py")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
LINES = 150  # 5 chunks of 32 lines (chunk_size 32 below): shards cut between chunks, not on batch 16's edges


def _text(lines: int = LINES, seed: int = 0) -> str:
    words = " ".join(ENGLISH).split()
    draw = random.Random(seed)
    rows = [" ".join(draw.choice(words) for _ in range(draw.randint(0, 12))) for _ in range(lines)]
    return "".join(f"{row}\n" for row in rows)


def _options(folder: Path, source: Path, output: Path, *extra: str) -> list[str]:
    return ["--model", str(folder), "--input", str(source), "--output", str(output), "--batch_size", "4",
            "--chunk_size", "32", "--num_beams", "2", "--threads", "1", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, fitted_folder):
    """The input, and one process's output of it with n-best lists and alignments (two lines per input line)."""
    folder = tmp_path_factory.mktemp("shards")
    source = folder / "in.en"
    source.write_text(_text())
    whole = folder / "whole.de"
    assert _call(_options(fitted_folder, source, whole, "--nbest", "2", "--alignments", "hard")) is None
    return source, whole.read_bytes()


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory, fitted_folder):
    """A longer input (3 x LINES lines: a few seconds for two processes), and one process's output of it."""
    folder = tmp_path_factory.mktemp("long_shards")
    source = folder / "in.en"
    source.write_text(_text(3 * LINES, seed=2))
    whole = folder / "whole.de"
    assert _call(_options(fitted_folder, source, whole, "--nbest", "2")) is None
    return source, whole.read_bytes()


def _call(argv: list[str]):
    return exit_code(translate_cli.main, argv)


def test_shards_are_whole_chunks_with_about_equal_tokens(tmp_path, tokenizer):
    source = tmp_path / "in.en"
    source.write_text(_text(1000, seed=1))
    shards = plan_shards(source, tokenizer, chunk=32, count=3)
    assert [s.first for s in shards] == [0, *(s.first + s.lines for s in shards[:-1])]
    assert sum(s.lines for s in shards) == 1000 and all(s.first % 32 == 0 for s in shards)
    assert max(s.tokens for s in shards) < 1.2 * min(s.tokens for s in shards)
    with open(source, "rb") as f:
        f.seek(shards[1].offset)
        lines = list(read_text_lines(LineLimit(f, shards[1].lines)))
    assert lines == source.read_text().splitlines()[shards[1].first : shards[1].first + shards[1].lines]
    assert len(plan_shards(source, tokenizer, chunk=400, count=8)) == 3  # never a shard without a chunk
    assert plan_shards(tmp_path / "empty", tokenizer, 32, 2) == [] if (tmp_path / "empty").touch() is None else None


def test_an_input_shorter_than_a_default_chunk_a_process_is_cut_into_a_chunk_a_process(tmp_path, tokenizer):
    """300 lines on 2 processes with the default chunk (512 lines): 2 shards of 150 lines, not one shard and an idle
    process; a --chunk_size given keeps its chunks (one process reading them writes the same bytes)."""
    source = tmp_path / "in.en"
    source.write_text(_text(300, seed=2))
    assert [(s.first, s.lines) for s in plan_shards(source, tokenizer, 512, 2, spread=True)] == [(0, 150), (150, 150)]
    assert [(s.first, s.lines) for s in plan_shards(source, tokenizer, 512, 2)] == [(0, 300)]
    assert [s.lines for s in plan_shards(source, tokenizer, 512, 7, spread=True)] == [43] * 6 + [42]
    assert [s.lines for s in plan_shards(source, tokenizer, 100, 3, spread=True)] == [100] * 3  # long enough


def test_a_shard_folder_of_another_run_is_refused_in_one_line(tmp_path, tokenizer):
    source = tmp_path / "in.en"
    source.write_text(_text(100))
    ShardedOutput(tmp_path / "out.de", {"options": 1}).plan(source, tokenizer, 32, 2)
    with pytest.raises(ValueError, match=r"out\.de\.shards was written by a run with other options or input "
                                         r"\(options\): rerun that command to continue it, or remove .+ to start "
                                         r"again$"):  # fmt: skip
        ShardedOutput(tmp_path / "out.de", {"options": 2}).plan(source, tokenizer, 32, 2)


def test_several_processes_need_an_output_file_and_an_input_file(fitted_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    source = tmp_path / "in.en"
    source.write_text("The house is small.\n")
    assert _call(["--model", str(fitted_folder), "--input", str(source)]) == (
        "error: 2 processes translate into files: give --output (each writes its shards beside it)"
    )
    assert _call(["--model", str(fitted_folder), "--output", str(tmp_path / "o")]) == (
        "error: 2 processes split the input between them: give --input, a file (not standard input)"
    )


def test_a_hard_stop_resumes_from_the_whole_lines_written_to_the_same_bytes(fitted_folder, corpus, tmp_path,
                                                                            monkeypatch):  # fmt: skip
    """What `kill -9` leaves (F.partial cut inside a line, F.resume without a clean stop's record): the rerun cuts
    F.partial back to its last whole chunk and translates that chunk again whole, so its batches are the same. A
    clean stop's rerun keeps every finished line and translates only the others, to the same bytes too."""
    source, whole = corpus
    output = tmp_path / "out.de"
    partial, state = Path(f"{output}.partial"), Path(f"{output}.resume")
    argv = _options(fitted_folder, source, output, "--nbest", "2", "--alignments", "hard")
    with monkeypatch.context() as patch:
        stop_at_batch(patch, TorchBackend, batch=12)  # in the 2nd chunk of 32 lines (8 batches of 4 each)
        assert _call(argv) == 130
    key = json.loads(state.read_text())["key"]
    assert json.loads(state.read_text())["later"]  # a clean stop: the finished lines past the first unfinished
    lines = whole.split(b"\n")
    for cut in (2 * 45 + 1, 2 * 70, 2 * 64):  # inside an n-best list, inside a line, on a chunk's edge
        partial.write_bytes(b"\n".join(lines[:cut]) + b"\n" + lines[cut][:5])
        state.write_text(json.dumps({"key": key}))
        searched = stop_at_batch(monkeypatch, TorchBackend, batch=10**9)
        assert _call(argv) is None
        assert output.read_bytes() == whole and not partial.exists() and not state.exists()
        assert sum(searched) == LINES - cut // 2 // 32 * 32 - sum(not line.strip() for line in _text().splitlines()[
            cut // 2 // 32 * 32 :])  # fmt: skip
        output.rename(partial)  # the next case starts from a stopped run's files again
    partial.unlink()


def _launch(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(accelerate_launch(SCRIPT, *argv), env=ENV, capture_output=True, text=True, timeout=timeout)


def _machines(argv: list[str]) -> list[tuple[int, str]]:
    """Two launchers on 127.0.0.1, one CPU process each, as two machines sharing the output's folder run them."""
    accelerate, port = str(Path(sys.executable).parent / "accelerate"), free_port()
    launchers = [subprocess.Popen([accelerate, "launch", "--multi_gpu", "--num_machines", "2", "--num_processes", "2",
                                   "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
                                   "--main_process_port", str(port), "--rdzv_backend", "static", "--same_network",
                                   "--mixed_precision", "no", "--dynamo_backend", "no", SCRIPT, *argv],
                                  env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in (0, 1)]  # fmt: skip
    return [(launcher.wait(timeout=300), launcher.stdout.read()) for launcher in launchers]


@pytest.mark.slow  # 50 s; CI: the Slurm script's two machines (test_machines.py) and the killed run's rerun (below)
def test_two_processes_and_two_machines_write_the_bytes_of_one_process(fitted_folder, corpus, tmp_path):
    source, whole = corpus
    two = tmp_path / "two.de"
    result = _launch(_options(fitted_folder, source, two, "--nbest", "2", "--alignments", "hard"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert two.read_bytes() == whole and not Path(f"{two}.shards").exists()
    assert f"{two}: {LINES} lines, 2 shards on 2 processes" in result.stderr
    machines = tmp_path / "machines.de"
    ends = _machines(_options(fitted_folder, source, machines, "--nbest", "2", "--alignments", "hard"))
    assert [code for code, _ in ends] == [0, 0], ends[0][1][-3000:] + ends[1][1][-3000:]
    assert machines.read_bytes() == whole


def _kill_one_worker(argv: list[str], output: Path, seed: int, signum: int = signal.SIGKILL) -> int:
    """Launches two processes, and `kill -9`s one of them (or sends it `signum`) at a random moment once some lines
    are written; returns the launcher's status."""
    launcher = subprocess.Popen(accelerate_launch(SCRIPT, *argv), env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    draw = random.Random(seed)
    folder = Path(f"{output}.shards")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(p.stat().st_size for p in folder.glob("*.partial")):
        time.sleep(0.05)
    time.sleep(draw.uniform(0.0, 1.0))
    workers = [p for p in psutil.Process(launcher.pid).children(recursive=True) if SCRIPT in " ".join(p.cmdline())]
    assert workers, "the run ended before the kill"
    os.kill(draw.choice(workers).pid, signum)
    launcher.communicate(timeout=120)
    return launcher.returncode


@pytest.mark.parametrize("seeds", [pytest.param(range(1), id="once"),
                                   pytest.param(range(1, 6), id="five", marks=pytest.mark.slow)])  # fmt: skip
def test_a_killed_process_then_the_same_command_gives_the_uninterrupted_bytes(fitted_folder, long_corpus, tmp_path,
                                                                             seeds):  # fmt: skip
    source, whole = long_corpus
    for seed in seeds:
        output = tmp_path / f"killed{seed}.de"
        argv = _options(fitted_folder, source, output, "--nbest", "2")
        assert _kill_one_worker(argv, output, seed) != 0 and not output.exists()
        assert any(part.stat().st_size for part in Path(f"{output}.shards").glob("*.partial"))  # some lines kept
        result = _launch(argv)
        assert result.returncode == 0, result.stderr[-3000:]
        assert output.read_bytes() == whole, f"seed {seed}"
        assert f"{output}: {3 * LINES} lines, 2 shards on 2 processes" in result.stderr
        assert not Path(f"{output}.shards").exists()  # the first process joined the shards and removed their folder
    if len(seeds) == 1:
        return  # CI's run; the slow one also reruns a stopped run with other options
    output = tmp_path / "refused.de"
    argv = _options(fitted_folder, source, output, "--nbest", "2")
    _kill_one_worker(argv, output, 0)
    refused = _launch([*argv[:-2], "--nbest", "1"])  # other options on the stopped run's folder
    assert refused.returncode != 0 and (f"error: {output}.shards was written by a run with other options or input "
                                        "(--nbest): rerun that command to continue it") in refused.stderr  # fmt: skip


@pytest.mark.slow
def test_sigterm_to_one_process_then_the_same_command_gives_the_uninterrupted_bytes(fitted_folder, long_corpus,
                                                                                   tmp_path):  # fmt: skip
    """A clean stop inside translate_shards (as the peer watcher's own SIGTERM on a lost peer): each process writes
    what it finished, whole lines only, and the rerun gives one process's bytes."""
    source, whole = long_corpus
    for seed in range(3):
        output = tmp_path / f"stopped{seed}.de"
        argv = _options(fitted_folder, source, output, "--nbest", "2")
        assert _kill_one_worker(argv, output, seed, signal.SIGTERM) != 0 and not output.exists()
        result = _launch(argv)
        assert result.returncode == 0, result.stderr[-3000:]
        assert output.read_bytes() == whole, f"seed {seed}"


@pytest.mark.slow
def test_a_lost_machine_ends_the_other_with_one_line_naming_it(fitted_folder, long_corpus, tmp_path):
    source, whole = long_corpus
    output = tmp_path / "lost.de"
    argv = _options(fitted_folder, source, output, "--nbest", "2")
    accelerate, port = str(Path(sys.executable).parent / "accelerate"), free_port()
    launchers = [subprocess.Popen([accelerate, "launch", "--multi_gpu", "--num_machines", "2", "--num_processes", "2",
                                   "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
                                   "--main_process_port", str(port), "--rdzv_backend", "static", "--same_network",
                                   "--mixed_precision", "no", "--dynamo_backend", "no", SCRIPT, *argv],
                                  env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
                 for rank in (0, 1)]  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(p.stat().st_size for p in Path(f"{output}.shards").glob("*.partial")):
        time.sleep(0.05)
    os.killpg(launchers[1].pid, signal.SIGKILL)  # machine 1: its launcher and its worker
    lost = time.monotonic()
    text = launchers[0].communicate(timeout=120)[0]
    print(f"machine 0 ended {time.monotonic() - lost:.1f} s after machine 1 was lost")
    assert launchers[0].returncode != 0 and "machine 1 (rank 1) was lost" in text, text[-3000:]
    assert "Traceback" not in text.split("machine 1 (rank 1) was lost")[0][-2000:]
    result = _launch(argv)  # one machine, two processes: the same command continues both shards
    assert result.returncode == 0, result.stderr[-3000:]
    assert output.read_bytes() == whole


def test_a_finished_shard_keeps_its_controls_outcomes_for_a_rerun_that_finds_it_done(tmp_path, tokenizer):
    source = tmp_path / "in.en"
    source.write_text(_text(100))
    sharded = ShardedOutput(tmp_path / "out.de", {"options": 1})
    shard = sharded.plan(source, tokenizer, 32, 2)[1]
    part = sharded.part(shard)
    part.resume()
    with part.open() as f:
        f.write(b"".join(b"x\n" for _ in range(shard.lines)))
    part.record_outcomes({3: {"failed": "bad"}, 5: {"unmet": ["Haus"]}})
    part.finished()
    assert sharded.is_done(shard) and sharded.outcomes(shard) == {3: {"failed": "bad"}, 5: {"unmet": ["Haus"]}}
    assert sharded.outcomes(sharded.shards()[0]) == {}
