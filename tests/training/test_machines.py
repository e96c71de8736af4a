"""Several machines (issue 36): two launchers on 127.0.0.1 through accelerate's multi-node path (`--num_machines 2
--machine_rank 0/1 --rdzv_backend static`, gloo, one CPU process each), as two machines run them. Sharing one output
folder, they train to the weights of one machine with two processes, bit for bit; with a folder and a datasets cache
each, each machine keeps a whole copy of every checkpoint. A lost machine ends the other within seconds with one line
that names it, SIGTERM to both (Slurm's preemption) saves one checkpoint, and a machine started with other options
or another corpus is refused before any step, each machine saying so in one line. The Slurm script runs as written,
with stand-in `srun` and `scontrol`. Without a launcher, two processes with torchrun's variables stand for two
machines (tests/ddp_machines_worker.py): rank 0's failures reach both, a failed store is named as such.

CI runs the Slurm script on a shared folder, two machines with folders of their own, a refusal, and the launcher-less
cases; `pytest -m slow` adds a lost machine (folders per machine, and a shared one), a launcher lost alone, a folder
missing or behind, another corpus, a broken tokenizer, SIGTERM to both launchers, and the Slurm script's preemption."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch
from conftest import (
    REFERENCE_ENV,
    ROOT,
    Launch,
    assert_same_training,
    built_once,
    ddp_command,
    free_port,
    is_zombie,
    kill_launch,
    launch_workers,
    make_model,
    reference_command,
)
from safetensors.torch import load_file

from vaswani_mt.data.corpus import load_corpus
from vaswani_mt.training.checkpoints import is_complete, list_checkpoints
from vaswani_mt.training.machines import (
    Machines,
    corpus_digest,
    is_lost_peer,
    is_store_failure,
    machines,
    speaks_for_machine,
)

pytestmark = pytest.mark.transformers_internals

BOUND = 15  # seconds from a fault to machine 0's exit; under the launcher's 30 s between SIGTERM and SIGKILL
SLURM = ROOT / "scripts" / "slurm" / "train_multinode.sbatch"
WORKER = ROOT / "tests" / "ddp_machines_worker.py"


def machine_command(rank: int, port: int, corpus: Path, output: Path, *extra: str) -> list[str]:
    """Machine `rank`'s launcher of the reference run (tests/conftest.py), one CPU process on each of 2 machines."""
    accelerate = str(Path(sys.executable).parent / "accelerate")
    return [accelerate, "launch", "--multi_gpu", "--num_machines", "2", "--num_processes", "2", "--machine_rank",
            str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--rdzv_backend", "static",
            "--same_network", "--mixed_precision", "no", "--dynamo_backend", "no",
            *reference_command(corpus, output)[1:], "--use_cpu", *extra]  # fmt: skip


def run_machines(commands: list[list[str]], logs: list[Path], envs: list[dict] | None = None, after: int | None = None,
                 fault: Callable[[list[subprocess.Popen]], None] | None = None) -> list[Launch]:  # fmt: skip
    """Starts one launcher per machine; once machine 0 has logged `after` steps, calls `fault(launchers)`. Returns
    each launch: its status, its output (stdout and stderr), its workers, and those alive after it ended; machine
    0's `seconds` run from the fault (or its last step logged) to its exit."""
    envs = envs or [REFERENCE_ENV] * len(commands)
    launchers = []
    for rank, (command, log, env) in enumerate(zip(commands, logs, envs, strict=True)):
        stdout = subprocess.PIPE if rank == 0 else log.open("w")
        stderr = log.with_suffix(".err").open("w") if rank == 0 else subprocess.STDOUT
        launchers.append(subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, text=True,
                                          start_new_session=True))  # fmt: skip
    watchdog = threading.Timer(300, lambda: [kill_launch(launcher) for launcher in launchers])
    watchdog.start()
    workers: list[dict[int, int]] = [{} for _ in launchers]
    try:
        logged, since, output = 0, time.monotonic(), []
        for line in launchers[0].stdout:
            output.append(line)
            if "'loss'" not in line:
                continue
            logged, since = logged + 1, time.monotonic()
            workers = [found or launch_workers(launcher) for found, launcher in zip(workers, launchers, strict=True)]
            if logged == after and fault is not None:
                fault(launchers)
                break
        output += list(launchers[0].stdout)
        codes = [launcher.wait(timeout=120) for launcher in launchers]
        seconds = time.monotonic() - since
    finally:
        watchdog.cancel()
        for launcher in launchers:
            kill_launch(launcher) if launcher.poll() is None else None
    assert after is None or logged == after, f"machine 0 ended after {logged} steps, before the fault"
    print(f"{logs[0].stem}: exit statuses {codes}, machine 0 {seconds:.2f} s after the {'fault' if fault else 'end'}")
    texts = ["".join(output) + logs[0].with_suffix(".err").read_text(), *(log.read_text() for log in logs[1:])]
    deadline = time.monotonic() + 5  # an orphaned worker is reaped by init
    pids = [pid for found in workers for pid in found.values()]
    while (left := [p for p in pids if psutil.pid_exists(p) and not is_zombie(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [Launch(code, seconds, text, found, left) for code, text, found in zip(codes, texts, workers, strict=True)]


def launch_both(name: str, corpus: Path, folders: list[Path], tmp_path: Path, envs: list[dict] | None = None,
                extra: tuple[list[str], list[str]] = ([], []), **fault) -> list[Launch]:  # fmt: skip
    """Both machines' launchers of the reference run on a new port, machine m writing to `folders[m]` with the
    options `extra[m]` more; logs `<tmp_path>/<name>-<m>.log`; `fault`: `run_machines`' `after` and `fault`."""
    port = free_port()
    commands = [machine_command(rank, port, corpus, folders[rank], *extra[rank]) for rank in (0, 1)]
    return run_machines(commands, [tmp_path / f"{name}-{rank}.log" for rank in (0, 1)], envs, **fault)


def assert_resume_exactly(corpus: Path, folders: list[Path], tmp_path: Path, reference: Path,
                          envs: list[dict] | None = None) -> list[Launch]:  # fmt: skip
    """Both commands again finish the run, with the uninterrupted run's weights, losses and learning rates."""
    resumed = launch_both("resume", corpus, folders, tmp_path, envs)
    assert [launch.returncode for launch in resumed] == [0, 0], resumed[0].stderr[-3000:]
    assert_same_training(folders[0], reference)
    for launch in resumed:  # the tied embedding matrix is saved once, as model.shared.weight: nothing is missing
        assert "There were missing keys in the checkpoint" not in launch.stderr
    return resumed


def lose_machine_1(launchers: list[subprocess.Popen]) -> None:
    """Machine 1 is gone: its launcher and its workers killed at once, as a crash or a power cut of the machine
    would end them (their sockets close)."""
    kill_launch(launchers[1])


def errors(launch: Launch) -> list[str]:
    return [line for line in launch.stderr.splitlines() if line.startswith("error:")]


def assert_ends_in_one_line(launch: Launch, said: str) -> None:
    """The machine's one `error:` line starting with `said`, its worker's status 1 (not an abort), and no traceback
    but the launcher's own (torchrun's ChildFailedError, which accelerate lets through for any status but 0)."""
    said_once = len(errors(launch)) == 1 and errors(launch)[0].startswith(said)
    assert launch.returncode != 0 and said_once, launch.stderr[-3000:]
    launcher = f'Traceback (most recent call last):\n  File "{Path(sys.executable).parent}'
    workers_part = launch.stderr.split(launcher)[0]
    assert "Traceback" not in workers_part, workers_part[-3000:]
    assert "terminate called" not in launch.stderr and "SIGABRT" not in launch.stderr, launch.stderr[-3000:]
    assert re.search(r"exitcode\s*: 1 \(pid", launch.stderr), launch.stderr[-3000:]


def steps_logged(launch: Launch) -> int:
    return len(re.findall(r"'loss': ", launch.stderr))


def same_weights(a: Path, b: Path) -> bool:
    ours, theirs = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.fixture(scope="module")
def saved_corpus(corpus, tmp_path_factory) -> Path:
    """The reference corpus as a `save_to_disk` folder: datasets caches its tokenization on disk beside it."""
    folder = tmp_path_factory.mktemp("saved-corpus") / "pairs"
    load_corpus(str(corpus)).save_to_disk(str(folder))
    return folder


# ---------------------------------------------------------------------------------------------------------------
# The parts, without a launch


def test_ranks_are_placed_machine_by_machine_from_torchruns_variables(monkeypatch):
    for name, value in {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "LOCAL_RANK": "2"}.items():
        monkeypatch.setenv(name, value)
    where = machines()
    assert (where.count, where.index, where.per_machine) == (2, 1, 4)
    assert [where.of_rank(r) for r in range(8)] == [0] * 4 + [1] * 4
    assert where.name({1}) == "machine 1" and where.name([2, 0]) == "machines 0, 2"
    assert not speaks_for_machine()  # local rank 2; each machine's local rank 0 speaks for it
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    assert machines() == Machines(1, 0, 1) and speaks_for_machine()


def test_a_corpus_digest_depends_on_the_text_not_on_where_the_file_lies(corpus, tmp_path):
    copy = tmp_path / "elsewhere.jsonl"
    shutil.copy(corpus, copy)
    changed = tmp_path / "changed.jsonl"
    changed.write_text(corpus.read_text(encoding="utf-8").replace("Katze", "Kater", 1), encoding="utf-8")
    digests = [corpus_digest(load_corpus(str(path))["train"], ("en", "de")) for path in (corpus, copy, changed)]
    assert digests[0] == digests[1] != digests[2]
    assert digests[0].startswith("231 pairs, sha256 ")


def test_gloos_words_for_a_lost_peer_are_recognised():
    closed = "[/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:15253. This is typically caused"
    assert is_lost_peer(RuntimeError(closed)) and is_lost_peer(RuntimeError("Read error: Connection reset by peer"))
    assert not is_lost_peer(RuntimeError("CUDA out of memory")) and not is_lost_peer(ValueError(closed))
    store = torch.distributed.DistNetworkError("Broken pipe")  # what a TCPStore client says once its server is gone
    assert is_store_failure(store) and not is_lost_peer(store) and not is_store_failure(RuntimeError(closed))


def test_a_resumed_run_does_not_warn_that_the_tied_embedding_matrix_is_missing(tmp_path, caplog, restore_rng):
    """A checkpoint holds the tied matrix once (model.shared.weight); Trainer's resume ties the other three names
    to it again instead of warning that they are missing, which read like damaged weights."""
    from transformers import Seq2SeqTrainingArguments

    from vaswani_mt.training.trainer import VaswaniTrainer

    model = make_model()
    model.save_pretrained(tmp_path)
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = VaswaniTrainer(model=make_model(seed=1), args=args, max_tokens_per_batch=None, lr_schedule="trainer")
    with caplog.at_level("WARNING"):
        trainer._load_from_checkpoint(str(tmp_path))  # what train(resume_from_checkpoint=...) calls
    assert [r.message for r in caplog.records if "missing keys" in r.message] == []
    loaded = trainer.model
    assert torch.equal(loaded.model.shared.weight, model.model.shared.weight)
    assert loaded.lm_head.weight is loaded.model.shared.weight is loaded.model.encoder.embed_tokens.weight


# ---------------------------------------------------------------------------------------------------------------
# Two processes as two machines, without a launcher (tests/ddp_machines_worker.py)


def start_machines(*argv: str, env: dict | None = None) -> tuple[list[subprocess.Popen], int]:
    """The worker on two "machines" of one process each (torchrun's variables, a new port); and the port."""
    port = free_port()
    processes = []
    for rank in (0, 1):
        variables = {"RANK": str(rank), "GROUP_RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                     "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        processes.append(subprocess.Popen([sys.executable, str(WORKER), *argv], env={**REFERENCE_ENV, **variables,
                         **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    return processes, port


@pytest.fixture(scope="module")
def rank0_fails(tmp_path_factory) -> tuple[list[tuple[int, str, str]], Path]:
    """Both machines through two storage probes and a tokenizer build that raises a KeyError on rank 0: each
    process's status, stdout and stderr, and the probes' folder (once per pytest run: `built_once`)."""

    def build(root: Path) -> None:
        (root / "probes").mkdir()
        processes, _ = start_machines("rank0", str(root / "probes"))
        ended = []
        for process in processes:
            try:
                stdout, stderr = process.communicate(timeout=120)
            except subprocess.TimeoutExpired:  # a rank left waiting for rank 0: the fault this guards against
                for other in processes:
                    other.kill()
                raise
            ended.append((process.returncode, stdout, stderr))
        (root / "ended.json").write_text(json.dumps(ended))

    root = built_once(tmp_path_factory, "rank0-fails", build)
    return [tuple(process) for process in json.loads((root / "ended.json").read_text())], root / "probes"


def test_any_exception_in_rank_0s_tokenizer_build_ends_every_machine_with_one_line(rank0_fails):
    """A KeyError (what a tokenizer.json without its added tokens raises), not one of the kinds rank 0 expects:
    before, rank 0 printed its traceback and the other machine said machine 0 was lost."""
    said = "error: rank 0 could not build the tokenizer: KeyError: 'added_tokens'"
    for returncode, _, stderr in rank0_fails[0]:
        assert returncode == 1 and [line for line in stderr.splitlines() if "error" in line.lower()] == [said], stderr
        assert "Traceback" not in stderr and "terminate called" not in stderr


def test_a_hub_corpus_that_cannot_be_reached_ends_every_rank_with_one_line(corpus, tmp_path):
    """A Hub id without the Hub (the WMT recipes on a machine without a network): rank 0 asks first, and its failure
    is every rank's, in one line from each machine's first process; no rank's traceback, no step."""
    output = tmp_path / "run"
    command = ddp_command(corpus, output)
    command[command.index("--dataset") + 1] = "nobody-here/no-such-corpus"
    run = subprocess.run(command, env={**REFERENCE_ENV, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    ours = run.stderr.split("\nE1")[0]  # what the processes said, before torchrun's own report of their exit
    errors = [line for line in ours.splitlines() if line.startswith("error:")]
    assert run.returncode != 0 and len(errors) == 1, run.stderr[-3000:]
    assert errors[0].startswith("error: rank 0 could not load the corpus: nobody-here/no-such-corpus: cannot be ")
    assert "Traceback" not in ours and not list(output.glob("checkpoint-*"))


def test_each_launch_probes_the_storage_with_a_file_of_a_new_name(rank0_fails):
    """A name looked up once only: an NFS client's cached entry of an earlier launch's probe cannot answer for it."""
    ended, folder = rank0_fails
    names = [line.split()[1] for line in ended[1][1].splitlines() if line.startswith("probe ")]
    assert len(names) == 2 and names[0] != names[1], names
    assert all(re.fullmatch(r"\.vaswani-storage-probe-[0-9a-f]{32}", name) for name in names), names
    assert list(folder.iterdir()) == []  # rank 0 removes each probe


def test_a_failed_store_is_named_as_the_store_not_as_a_lost_machine(tmp_path):
    """The rendezvous store is gone (here held by this test, as torchrun's agent holds it on machine 0) when
    machine 1 is lost: machine 0 cannot ask which ranks are alive, and says that the store failed (it said that
    machine 0 was lost, or 'another process'), within seconds."""
    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    processes, _ = start_machines("store", env={"MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"})
    watchdog = threading.Timer(120, lambda: [process.kill() for process in processes])
    watchdog.start()
    try:
        for process in processes:
            assert process.stdout.readline() == "ready\n", process.communicate(timeout=60)[1][-3000:]
        del store  # its server stops: the store has failed
        processes[1].kill()
        lost_at = time.monotonic()
        _, stderr = processes[0].communicate(timeout=60)
        seconds = time.monotonic() - lost_at
    finally:
        watchdog.cancel()
        for process in processes:
            process.kill()
    said = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert processes[0].returncode == 1 and len(said) == 1 and seconds < BOUND, (seconds, stderr[-3000:])
    assert said[0].startswith(f"error: the rendezvous store at 127.0.0.1:{port} failed (")
    assert re.search(r"\) after a collective failed at step \d+ \(", said[0]), said
    assert "so the lost process cannot be named" in said[0] and "was lost" not in said[0]


_LAUNCHER = r"""
import os, subprocess, sys
wait = "from vaswani_mt.training.machines import end_with_launcher; end_with_launcher(); import os, time; "
wait += "os.write(1, b'ready\\n'); time.sleep(120)"  # one write: the children share the pipe
for run_id in ("run-1", None):  # a torchrun worker, and a process of no launcher
    env = {**os.environ, "TORCHELASTIC_RUN_ID": run_id} if run_id else dict(os.environ)
    print("pid", subprocess.Popen([sys.executable, "-c", wait], env=env, start_new_session=True).pid, flush=True)
os.wait()
"""


def test_a_worker_whose_launcher_is_killed_ends_with_it():
    """SIGKILL to a launcher (the OOM killer, a lost shell): its torchrun worker is killed with it, so that the other
    machines see a lost machine at once; a process started without a launcher stays."""
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER], env=REFERENCE_ENV, stdout=subprocess.PIPE,
                                text=True)  # fmt: skip
    said = [launcher.stdout.readline() for _ in range(4)]  # each child's pid, and `ready` from each
    pids = [int(line.split()[1]) for line in said if line.startswith("pid ")]
    try:
        assert len(pids) == 2 and said.count("ready\n") == 2, said
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 5
        while not is_zombie(pids[0]) and psutil.pid_exists(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert is_zombie(pids[0]) or not psutil.pid_exists(pids[0]), "the torchrun worker outlived its launcher"
        assert psutil.pid_exists(pids[1]) and not is_zombie(pids[1])
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------------------------
# The Slurm script, with stand-ins for srun and scontrol

_SRUN = """#!{python}
# srun's stand-in: --ntasks tasks of the command, all on this machine, task i with SLURM_NODEID=i, SLURM_PROCID=i and
# SLURM_JOB_NODELIST; SIGTERM and SIGINT passed on to every task; with --kill-on-bad-exit, a task that fails ends the
# others. Exits with the highest status, as srun does.
import os, signal, subprocess, sys, time
args, ntasks, kill_on_bad_exit = sys.argv[1:], 1, False
while args and args[0].startswith("-"):
    option = args.pop(0)
    name, _, value = option.partition("=")
    if name in ("--ntasks", "-n"):
        ntasks = int(value or args.pop(0))
    elif name in ("--nodes", "-N", "--ntasks-per-node") and not value:
        args.pop(0)
    elif name == "--kill-on-bad-exit":
        kill_on_bad_exit = value != "0"
tasks = [subprocess.Popen(args, env={{**os.environ, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i),
         "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": os.environ["SLURM_JOB_NODELIST"]}}, start_new_session=True)
         for i in range(ntasks)]
def forward(signum, frame):
    for task in tasks:
        task.send_signal(signum)
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
while any(task.poll() is None for task in tasks):
    if kill_on_bad_exit and any(task.poll() not in (None, 0) for task in tasks):
        for task in tasks:
            if task.poll() is None:
                os.killpg(task.pid, signal.SIGKILL)
    time.sleep(0.1)
codes = [task.returncode for task in tasks]
sys.exit(max((128 - c if c < 0 else c) for c in codes))
"""
_SCONTROL = """#!/usr/bin/env bash
# scontrol's stand-in: `show hostnames LIST` names this machine once per node; `requeue ID` is written down.
case "$1 $2" in
    "show hostnames") for _ in $(seq "$SLURM_JOB_NUM_NODES"); do echo localhost; done ;;
    "requeue "*) echo "$2" >> "$SCONTROL_REQUEUED" ;;
    *) echo "scontrol stand-in: $*" >&2; exit 1 ;;
esac
"""


def slurm_env(tmp_path: Path) -> dict:
    """What `sbatch --nodes 2` sets for the script, with the stand-ins first on PATH and this venv's accelerate."""
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir(exist_ok=True)
    (stand_ins / "srun").write_text(_SRUN.format(python=sys.executable))
    (stand_ins / "scontrol").write_text(_SCONTROL)
    for tool in ("srun", "scontrol"):
        (stand_ins / tool).chmod(0o755)
    path = os.pathsep.join([str(stand_ins), str(Path(sys.executable).parent), os.environ["PATH"]])
    return {**REFERENCE_ENV, "PATH": path, "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_SUBMIT_DIR": str(ROOT), "MASTER_PORT": str(free_port()),
            "SCONTROL_REQUEUED": str(tmp_path / "requeued")}  # fmt: skip


def test_the_slurm_script_runs_two_machines_that_share_a_folder_as_one_machine_with_two_processes(
    ddp_reference, corpus, saved_corpus, tmp_path
):
    """Through scripts/slurm/train_multinode.sbatch as written: each machine's rank from its own $SLURM_NODEID, the
    head node from scontrol, one CPU process a node with --use_cpu. The same weights as one machine's two processes
    (on the same pairs, read from a save_to_disk copy of the corpus), the tokenizer trained once and the corpus
    tokenized once, both ranks' RNG states in the one checkpoint folder, the model published by global rank 0."""
    output = tmp_path / "run"
    arguments = reference_command(corpus, output)[2:]
    arguments[arguments.index("--dataset") + 1] = str(saved_corpus)
    run = subprocess.run(["bash", str(SLURM), *arguments, "--use_cpu"], env=slurm_env(tmp_path), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "vaswani_mt: 2 nodes x 1 processes, head localhost:" in run.stderr
    assert re.findall(r"--machine_rank|rank: [01] \(local_rank: 0\)", run.stderr) == []  # no launcher failed
    assert_same_training(output, ddp_reference)
    assert run.stderr.count("trained a 195-token BPE vocabulary") == 1
    assert run.stderr.count("tokenized the train split (231 pairs) into datasets' cache") == 1
    assert run.stderr.count("read the train split (231 pairs) from datasets' cache") == 1
    for checkpoint in list_checkpoints(output):
        assert {p.name for p in checkpoint.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert run.stderr.count("averaged checkpoint-2, checkpoint-4") == 1  # rank 0 alone publishes
    assert run.stderr.count("finished at step 10: ") == 2  # each machine's outcome
    assert (output / "model.safetensors").is_file() and not (tmp_path / "requeued").exists()


def test_the_translation_slurm_script_writes_the_bytes_of_one_process(fitted_folder, tmp_path):
    """scripts/slurm/translate_multinode.sbatch as written, with PROCESSES_PER_NODE=1 (CPU nodes): two machines
    translate their shards of one file into the bytes one process writes (docs/translating.md), n-best lists and
    alignments included. CI's two machines translating without a fault (tests/cli/test_sharded_translation.py kills
    one of two processes on one machine)."""
    from conftest import ENGLISH

    from vaswani_mt.cli import translate as translate_cli

    source = tmp_path / "in.en"
    source.write_text("".join(f"{line}\n" for line in ENGLISH * 20))
    options = ["--model", str(fitted_folder), "--input", str(source), "--chunk_size", "16", "--num_beams", "2",
               "--nbest", "2", "--alignments", "hard"]  # fmt: skip
    translate_cli.main([*options, "--output", str(tmp_path / "one.de")])
    script = SLURM.with_name("translate_multinode.sbatch")
    two = tmp_path / "two.de"
    run = subprocess.run(["bash", str(script), *options, "--output", str(two), "--threads", "1"],
                         env={**slurm_env(tmp_path), "PROCESSES_PER_NODE": "1"}, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "vaswani_mt: 2 nodes x 1 processes, head localhost:" in run.stderr
    assert f"{two}: {20 * len(ENGLISH)} lines, 2 shards on 2 processes" in run.stderr
    assert two.read_bytes() == (tmp_path / "one.de").read_bytes() and not Path(f"{two}.shards").exists()


# ---------------------------------------------------------------------------------------------------------------
# Storage per machine, and a lost machine


def test_machines_with_folders_of_their_own_each_keep_a_whole_copy_of_every_checkpoint(ddp_reference, corpus, tmp_path):
    """A folder and a datasets cache per machine: found by the run, each machine's first process writes a whole copy
    of each checkpoint (the other machine's RNG state included), with one machine's two processes' weights; the model
    is published on machine 0 alone. Each machine's log ends with its outcome (machine 1's printed none)."""
    folders = [tmp_path / f"machine{rank}" for rank in (0, 1)]
    envs = [{**REFERENCE_ENV, "HF_DATASETS_CACHE": str(tmp_path / f"cache{rank}")} for rank in (0, 1)]
    run = launch_both("run", corpus, folders, tmp_path, envs)
    assert [launch.returncode for launch in run] == [0, 0], run[0].stderr[-3000:]
    assert run[0].lines("finished at ") == [f"finished at step 10: the model is in {folders[0]}"]
    assert run[1].lines("finished at ") == ["finished at step 10: machine 0 publishes the model"]
    for launch in run:
        assert "the output folder is not shared between the machines: each keeps a whole copy" in launch.stderr
    assert_same_training(folders[0], ddp_reference)
    for checkpoint in list_checkpoints(ddp_reference):
        assert is_complete(folders[1] / checkpoint.name, processes=2)
        assert same_weights(folders[1] / checkpoint.name, checkpoint), checkpoint.name
    assert (folders[0] / "model.safetensors").is_file() and not (folders[1] / "model.safetensors").exists()


@pytest.mark.slow  # 25 s; CI: each machine keeps a whole copy (above), and a killed rank on one machine
def test_a_lost_machine_is_named_and_both_resume_each_from_its_own_folder(ddp_reference, corpus, tmp_path):
    """Machine 1 lost after step 5 (folders per machine): machine 0 ends within seconds with one line naming it, no
    process outlives the launches, and both commands again resume, each from its own folder, to the uninterrupted
    run's weights."""
    folders = [tmp_path / f"machine{rank}" for rank in (0, 1)]
    envs = [{**REFERENCE_ENV, "HF_DATASETS_CACHE": str(tmp_path / f"cache{rank}")} for rank in (0, 1)]
    lost = launch_both("lost", corpus, folders, tmp_path, envs, after=5, fault=lose_machine_1)
    assert lost[0].returncode != 0 and lost[0].seconds < BOUND, (lost[0].seconds, lost[0].stderr[-3000:])
    assert lost[0].left == [] and lost[1].left == [] and sorted(lost[0].workers) == [0]
    assert len(errors(lost[0])) == 1 and "Traceback" not in lost[0].stderr.split("E1")[0], lost[0].stderr[-3000:]
    assert re.fullmatch(r"error: machine 1 \(rank 1\) was lost at step [56] \(.*\); the checkpoints before it are "
                        r"intact: start every machine's command again to resume", errors(lost[0])[0])  # fmt: skip
    for folder in folders:  # each copy whole: the weights, the optimizer, both ranks' RNG states
        assert [c.name for c in list_checkpoints(folder, processes=2)][:2] == ["checkpoint-2", "checkpoint-4"]
    resumed = assert_resume_exactly(corpus, folders, tmp_path, ddp_reference, envs)
    for launch, folder in zip(resumed, folders, strict=True):
        assert re.search(rf"resuming from {folder}/checkpoint-[46] ", launch.stderr), launch.stderr[-3000:]
    for checkpoint in list_checkpoints(ddp_reference):
        assert same_weights(folders[1] / checkpoint.name, checkpoint), checkpoint.name


@pytest.mark.slow  # 25 s; CI resumes machines with folders of their own (above)
def test_a_machine_whose_folder_is_missing_or_behind_is_named_on_every_machine(ddp_reference, corpus, tmp_path):
    """Machine 1's folder gone (a replaced disk): one line on every machine, before any step. Machine 1's folder
    behind machine 0's (its last checkpoints lost): every machine resumes from the newest one both hold, and the
    run ends with the uninterrupted run's weights."""
    folders = [tmp_path / f"machine{rank}" for rank in (0, 1)]
    envs = [{**REFERENCE_ENV, "HF_DATASETS_CACHE": str(tmp_path / f"cache{rank}")} for rank in (0, 1)]
    for folder, steps in zip(folders, ((2, 4, 6, 8), (2, 4, 6)), strict=True):  # machine 1 lost its checkpoint-8
        for step in steps:
            shutil.copytree(ddp_reference / f"checkpoint-{step}", folder / f"checkpoint-{step}")

    behind = assert_resume_exactly(corpus, folders, tmp_path, ddp_reference, envs)
    assert "machine 0 holds checkpoint-8, which another machine lacks: every machine resumes from checkpoint-6" in (
        behind[0].stderr
    )

    shutil.rmtree(folders[1])  # machine 1's disk replaced: its folder is gone
    (folders[0] / "results.json").unlink()  # the run unfinished again (a finished one is left as it is: runs.py)
    missing = launch_both("missing", corpus, folders, tmp_path, envs)
    said = "error: machine 1's output folder is missing or behind: it holds no checkpoint, machine 0 checkpoint-10"
    for launch in missing:
        assert launch.returncode != 0 and len(errors(launch)) == 1 and errors(launch)[0].startswith(said), (
            launch.stderr[-3000:]
        )
        assert steps_logged(launch) == 0


def assert_refused(name: str, corpus: Path, tmp_path: Path, extra: list[str], said: str) -> None:
    """Machine 1 started with `extra` more: refused before any step, in one line on each machine, whose worker
    exits with status 1 (machine 0's aborted at times, with the process group left open: SIGABRT)."""
    output = tmp_path / "run"
    for launch in launch_both(name, corpus, [output, output], tmp_path, extra=([], extra)):
        assert steps_logged(launch) == 0, launch.stderr[-3000:]
        assert_ends_in_one_line(launch, said)
    assert list(output.glob("checkpoint-*")) == []


def test_a_machine_started_with_other_options_is_refused_before_any_step_in_one_line(corpus, tmp_path):
    said = "error: machine 1 was started with --warmup_steps 8.0, machine 0 with 4.0: every machine must run the same"
    assert_refused("options", corpus, tmp_path, ["--warmup_steps", "8"], said)


@pytest.mark.slow  # 16 s; CI: other options
def test_a_machine_with_another_corpus_is_refused_before_any_step_in_one_line(corpus, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text("".join(corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:-1]), encoding="utf-8")
    said = "error: machine 1 has another corpus than machine 0: its train split holds 230 pairs, sha256 "
    assert_refused("corpus", corpus, tmp_path, ["--dataset", str(other)], said)


@pytest.mark.slow  # 16 s; CI: any exception in rank 0's build (without a launcher, above)
def test_a_broken_tokenizer_on_machine_0_ends_both_machines_in_one_line(corpus, tmp_path):
    """The run's saved tokenizer damaged (its tokenizer.json without added tokens): transformers raises a KeyError
    on rank 0, which both machines report (before, machine 1 said that machine 0 was lost)."""
    output = tmp_path / "run"
    (output / "tokenizer").mkdir(parents=True)
    (output / "tokenizer" / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    for launch in launch_both("tokenizer", corpus, [output, output], tmp_path):
        assert_ends_in_one_line(launch, "error: rank 0 could not build the tokenizer: KeyError: 'added_tokens'")


# ---------------------------------------------------------------------------------------------------------------
# Longer cases (pytest -m slow)


@pytest.mark.slow  # 25 s; CI loses a machine that has a folder of its own (above)
def test_a_lost_machine_on_a_shared_folder_resumes_to_the_uninterrupted_run(ddp_reference, corpus, tmp_path):
    folders = [tmp_path / "run"] * 2
    lost = launch_both("lost", corpus, folders, tmp_path, after=5, fault=lose_machine_1)
    assert lost[0].returncode != 0 and lost[0].seconds < BOUND and lost[0].left == [], lost[0].stderr[-3000:]
    assert len(errors(lost[0])) == 1 and errors(lost[0])[0].startswith("error: machine 1 (rank 1) was lost at step")
    assert_resume_exactly(corpus, folders, tmp_path, ddp_reference)


@pytest.mark.slow  # 25 s; CI: a worker killed with its launcher (without a launch, above)
def test_a_launcher_lost_alone_takes_its_worker_and_the_other_machine_ends_within_seconds(corpus, tmp_path):
    """Machine 1's launcher killed, its worker left running: the worker is killed with it, and machine 0 names
    machine 1 lost within seconds (before, both trained on and machine 0's launcher waited 5 minutes at exit for
    machine 1's, in torchrun's exit barrier)."""

    def kill_launcher_1(launchers):
        launchers[1].kill()

    output = tmp_path / "run"
    lost = launch_both("launcher", corpus, [output, output], tmp_path, after=3, fault=kill_launcher_1)
    assert lost[0].seconds < BOUND and lost[0].left == [] and lost[1].left == [], (lost[0].seconds, lost[1].left)
    assert_ends_in_one_line(lost[0], "error: machine 1 (rank 1) was lost at step ")


@pytest.mark.slow  # 20 s
def test_sigterm_to_both_launchers_saves_one_checkpoint_and_each_machine_says_so(ddp_reference, corpus, tmp_path):
    """Slurm's preemption: SIGTERM to each machine's launcher, which passes it on to its rank. The ranks stop at
    the same step, one checkpoint is written, each machine prints one line, and the rerun resumes exactly."""
    output = tmp_path / "run"

    def preempt(launchers):
        for launcher in launchers:
            launcher.send_signal(signal.SIGTERM)

    stopped = launch_both("term", corpus, [output, output], tmp_path, after=3, fault=preempt)
    assert stopped[0].seconds < BOUND and all(launch.left == [] for launch in stopped)
    said = [launch.lines("stopped by SIGTERM at step ") for launch in stopped]
    assert [len(lines) for lines in said] == [1, 1] and said[0] == said[1], said
    step = int(said[0][0].split()[5].rstrip(";"))
    assert said[0][0].endswith(f"{output / f'checkpoint-{step}'} saved: run the same command to resume")
    assert [c.name for c in list_checkpoints(output, processes=2)][-1] == f"checkpoint-{step}"
    assert [c for c in output.glob("checkpoint-*") if int(c.name.split("-")[1]) > step] == []
    assert_resume_exactly(corpus, [output, output], tmp_path, ddp_reference)


@pytest.mark.slow  # 12 s
def test_the_slurm_script_passes_sigterm_on_and_requeues_the_job(corpus, tmp_path):
    output = tmp_path / "run"
    arguments = reference_command(corpus, output)[2:]
    script = subprocess.Popen(["bash", str(SLURM), *arguments, "--max_steps", "200", "--use_cpu"],
                              env=slurm_env(tmp_path), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)  # fmt: skip
    try:
        for line in script.stdout:
            if "'loss'" in line:
                break
        time.sleep(1)
        script.send_signal(signal.SIGTERM)  # what --signal=B:TERM sends: to the batch script alone
        _, stderr = script.communicate(timeout=60)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
    said = [line for line in stderr.splitlines() if line.startswith("stopped by SIGTERM at step ")]
    assert len(said) == 2 and said[0] == said[1], stderr[-3000:]
    assert "vaswani_mt: requeueing job 4242" in stderr and (tmp_path / "requeued").read_text() == "4242\n"
    step = int(said[0].split()[5].rstrip(";"))
    assert is_complete(output / f"checkpoint-{step}", processes=2)
