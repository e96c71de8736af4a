"""Faults during training (issue 26): SIGKILL at a random step, a checkpoint cut off while it was written, SIGTERM
and SIGINT (preemption), a full disk, and a planted pickle. Every interrupted run, started again with the same
command, ends with the very weights of an uninterrupted run (same seed, CPU, dropout on so that the RNG state
matters), and its learning rate, steps and trained minutes go on where they stopped.

The kill steps come from a seeded RNG (`VASWANI_FAULT_SEED`, default 26) and are printed (`pytest -s`). What makes
a checkpoint complete, file by file: test_checkpoints.py. CI runs the faults one after another in one run, with
SIGTERM; `pytest -m slow` again with SIGINT."""

import json
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest
import torch
from conftest import REFERENCE_ENV, REFERENCE_STEPS, assert_same_training, checkpoint_step, reference_command

from vaswani_mt import VaswaniForConditionalGeneration
from vaswani_mt.training.arguments import parse_args
from vaswani_mt.training.checkpoints import (
    incomplete_reason,
    is_complete,
    last_checkpoint,
    list_checkpoints,
    unpickling_refused,
)
from vaswani_mt.training.trainer import VaswaniTrainer

pytestmark = pytest.mark.transformers_internals

STEPS, ENV = REFERENCE_STEPS, REFERENCE_ENV  # the reference run's (tests/conftest.py): the runs here resume to it
SEED = int(os.environ.get("VASWANI_FAULT_SEED", "26"))

# Records each torch.load of the run it is imported into (the file and its weights_only argument).
_RECORDER = """
import json, os, torch
_load = torch.load
def _recording_load(f, *args, **kwargs):
    with open(os.environ["TORCH_LOAD_RECORD"], "a") as log:
        log.write(json.dumps({"file": os.path.basename(str(f)), "weights_only": kwargs.get("weights_only")}) + "\\n")
    return _load(f, *args, **kwargs)
torch.load = _recording_load
"""


class _OpensAFile:
    """A pickle that runs code when it is loaded: unpickling calls open(path, "w")."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _interrupt(command: list[str], lines: int, signum: int, log: Path, env: dict = ENV) -> int:
    """Runs `command`, sends it `signum` once it has logged `lines` steps (one log row a step), lets it end, and
    returns its exit status; its stderr goes to `log`. The signal lands in the next step or in the checkpoint
    write that follows the row."""
    assert lines >= 1
    with log.open("w") as stderr:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                   start_new_session=True)  # fmt: skip
        watchdog = threading.Timer(600, process.kill)
        watchdog.start()
        try:
            logged = 0
            for line in process.stdout:
                logged += "'loss'" in line
                if logged == lines:
                    os.killpg(process.pid, signum) if signum == signal.SIGKILL else process.send_signal(signum)
                    break
            for _ in process.stdout:  # drain, so that a process stopping cleanly never blocks on a full pipe
                pass
            code = process.wait()
        finally:
            watchdog.cancel()
    assert logged == lines, f"the run ended after {logged} steps, before the signal"
    return code


@pytest.mark.usefixtures("live_sigint")  # the run gets SIGINT live, even under nohup
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGTERM, id="SIGTERM"),
                                    pytest.param(signal.SIGINT, id="SIGINT", marks=pytest.mark.slow)])  # fmt: skip
def test_sigkill_a_signal_a_full_disk_and_a_cut_off_checkpoint_resume_to_the_uninterrupted_weights(
    reference, corpus, tmp_path, signum
):
    """One run through every fault, each start the same command: SIGKILL, then SIGTERM (a scheduler's preemption;
    `-m slow`: SIGINT, Ctrl-C, the same handler: test_callbacks.py runs both in this process), then a full disk,
    then a checkpoint cut off while it was written, then the run to the end."""
    name = signal.Signals(signum).name
    rng = random.Random(SEED)
    kill = rng.randint(1, STEPS - 4)
    # after step 5, checkpoint-4 is whole: one to fall back on; stopped by step 8, a checkpoint is left to fail on
    interrupt = rng.randint(max(kill + 1, 5), STEPS - 3)
    print(f"\nVASWANI_FAULT_SEED={SEED}: SIGKILL after step {kill}, {name} after step {interrupt}")
    output = tmp_path / "run"
    command = reference_command(corpus, output)

    # SIGKILL: nothing is saved; the newest complete checkpoint is where the same command resumes.
    assert _interrupt(command, kill, signal.SIGKILL, tmp_path / "kill.log") == -signal.SIGKILL
    survivor = last_checkpoint(output)

    # SIGTERM or SIGINT: the step ends, a checkpoint is saved, the exit status is 128 + the signal's number.
    log = tmp_path / "signal.log"
    assert _interrupt(command, interrupt - checkpoint_step(survivor), signum, log) == 128 + signum
    text = log.read_text()
    assert (f"resuming from {survivor} " in text) if survivor else ("resuming from" not in text)
    stopped = _stopped(log, name, output)
    assert interrupt <= stopped <= STEPS - 2 and not (output / "results.json").exists()  # not finished: unpublished

    # A full disk: a file-size limit between the weights' size and the optimizer state's, so the next checkpoint
    # writes its weights and fails on optimizer.pt.
    sizes = [(reference / "checkpoint-2" / file).stat().st_size for file in ("model.safetensors", "optimizer.pt")]
    limit = sum(sizes) // 2
    full = subprocess.run(command, env=ENV, capture_output=True, text=True, preexec_fn=lambda: _limit_files(limit))
    failed = stopped + 2 - stopped % 2  # the next multiple of --save_steps 2
    assert full.returncode == 1, full.stderr[-3000:]
    assert f"resuming from {output / f'checkpoint-{stopped}'} " in full.stderr
    errors = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in full.stderr, full.stderr[-3000:]
    folder = output / f"checkpoint-{failed}"
    assert errors[0].startswith(f"error: could not write checkpoint {folder}: optimizer.pt: torch.save could not ")
    assert f"files limited to {limit} bytes" in errors[0] and "the checkpoints before it are intact" in errors[0]
    assert not folder.exists()  # the half-written folder is gone
    kept = sorted(path.name for path in output.glob("checkpoint-*"))
    assert kept == [c.name for c in list_checkpoints(output)] and checkpoint_step(last_checkpoint(output)) == stopped

    # A kill in the middle of the newest checkpoint's write: its weights file cut short.
    newest = last_checkpoint(output)
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert "model.safetensors is truncated" in incomplete_reason(newest)
    fallback = last_checkpoint(output)
    assert checkpoint_step(fallback) < stopped

    recorder = tmp_path / "recorder"
    recorder.mkdir()
    (recorder / "sitecustomize.py").write_text(_RECORDER)
    record = tmp_path / "torch_load.jsonl"
    env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(recorder), ENV.get("PYTHONPATH")])),
           "TORCH_LOAD_RECORD": str(record)}  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"ignoring {newest}: it was not completely written (model.safetensors is truncated" in result.stderr
    assert f"resuming from {fallback} " in result.stderr
    assert_same_training(output, reference)

    # No pickle on resume: Trainer read the optimizer, scheduler and RNG state with weights_only=True.
    loads = [json.loads(line) for line in record.read_text().splitlines()]
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth"} <= {load["file"] for load in loads}
    assert all(load["weights_only"] is True for load in loads), loads


def _stopped(log: Path, name: str, output: Path) -> int:
    """The step a preempted run stopped at, from its last words; its checkpoint there is complete."""
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    found = re.search(rf"stopped by {name} at step (\d+); (\S+) saved: run the same command to resume$", text, re.M)
    assert found, text[-3000:]
    step = int(found.group(1))
    assert found.group(2) == str(output / f"checkpoint-{step}") and is_complete(found.group(2))
    assert json.loads((output / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"] == step
    return step


def _limit_files(size: int) -> None:
    """In the child: no file grows past `size` bytes (RLIMIT_FSIZE), and a write past it fails with EFBIG instead
    of killing the process (SIGXFSZ ignored), as on a full disk."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def test_a_resume_refuses_a_pickle_that_would_run_code(reference, tmp_path, restore_rng):
    """Trainer's own loaders, as a resume calls them, on a checkpoint whose state files would run code."""
    checkpoint, marker = tmp_path / "checkpoint-2", tmp_path / "code-ran"
    shutil.copytree(reference / "checkpoint-2", checkpoint)
    model = VaswaniForConditionalGeneration.from_pretrained(checkpoint)
    trainer = VaswaniTrainer(model=model, args=parse_args(["--output_dir", str(tmp_path), "--report_to", "none"])[3])
    trainer.create_optimizer_and_scheduler(num_training_steps=STEPS)
    trainer._load_optimizer_and_scheduler(str(checkpoint))  # the genuine files load
    trainer._load_rng_state(str(checkpoint))  # sets every RNG of this process: restore_rng puts them back
    for planted in ("rng_state.pth", "optimizer.pt"):
        torch.save({"python": _OpensAFile(marker)}, checkpoint / planted)
        assert incomplete_reason(checkpoint) is None  # a whole file: only weights_only stands in its way
        with pytest.raises(pickle.UnpicklingError) as refused:
            trainer._load_rng_state(str(checkpoint))
            trainer._load_optimizer_and_scheduler(str(checkpoint))
        assert not marker.exists()
        message = str(unpickling_refused(checkpoint, refused.value))
        assert message.startswith(f"could not resume from {checkpoint}: {planted} holds more than tensors")
        assert "GLOBAL io.open" in message and "\n" not in message
        shutil.copy2(reference / "checkpoint-2" / planted, checkpoint / planted)
