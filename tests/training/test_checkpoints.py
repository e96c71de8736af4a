"""Checkpoints (`vaswani_mt.training.checkpoints`): what makes one complete, which one a resume takes, the mean of the
last K (§6.1), and a run's logged rows. The damaged checkpoints here are copies of the reference run's
(tests/conftest.py); runs killed and resumed for real: test_faults.py."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import make_model, reference_command

from vaswani_mt import VaswaniForConditionalGeneration
from vaswani_mt.training.arguments import parse_args
from vaswani_mt.training.checkpoints import (
    CheckpointError,
    average_checkpoints,
    incomplete_reason,
    is_complete,
    last_checkpoint,
    log_history,
    resume_point,
)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]

TINY_VOCABULARY = 1000  # the tiny preset's own vocabulary size


# ---------------------------------------------------------------------------------------------------------------
# Complete or not


def _cut(file: str, keep: int | None = None):
    def damage(checkpoint: Path):
        path = checkpoint / file
        path.write_bytes(path.read_bytes()[: keep if keep is not None else path.stat().st_size // 2])

    return damage


def _scramble_header(checkpoint: Path):
    path = checkpoint / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:8] + b"\xff" * 8 + data[16:])


def _remove(file: str):
    return lambda checkpoint: (checkpoint / file).unlink()


def _write(file: str, text: str):
    return lambda checkpoint: (checkpoint / file).write_text(text)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_cut("model.safetensors"), r"model.safetensors is truncated \(\d+ of \d+ bytes\)"),
        (_cut("model.safetensors", keep=4), r"model.safetensors is truncated \(4 bytes, no complete header\)"),
        (_cut("model.safetensors", keep=500), r"model.safetensors is truncated \(500 bytes, no complete header\)"),
        (_scramble_header, r"model.safetensors has an unreadable header"),
        (_remove("model.safetensors"), r"no model.safetensors"),
        (_remove("optimizer.pt"), r"no optimizer.pt"),
        (_remove("scheduler.pt"), r"no scheduler.pt"),
        (_remove("rng_state.pth"), r"no rng_state.pth"),
        (_cut("optimizer.pt"), r"optimizer.pt is truncated \(no zip directory at its end\)"),
        (_cut("rng_state.pth"), r"rng_state.pth is truncated \(no zip directory at its end\)"),
        (_remove("trainer_state.json"), r"no trainer_state.json"),
        (_cut("trainer_state.json"), r"trainer_state.json is not complete JSON"),
        (_write("trainer_state.json", "[]"), r"trainer_state.json is not a JSON object"),
    ],
)
def test_a_checkpoint_cut_off_while_it_was_written_is_never_complete(reference, tmp_path, damage, reason):
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(reference / "checkpoint-2", checkpoint)
    assert incomplete_reason(checkpoint) is None
    damage(checkpoint)
    assert re.fullmatch(reason, incomplete_reason(checkpoint) or "")
    assert not is_complete(checkpoint) and last_checkpoint(tmp_path) is None


def test_averaging_needs_only_the_weights_and_trainer_state(reference, tmp_path):
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(reference / "checkpoint-2", checkpoint)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (checkpoint / name).unlink()
    assert incomplete_reason(checkpoint) == "no optimizer.pt"
    assert incomplete_reason(checkpoint, resumable=False) is None
    with (checkpoint / "model.safetensors").open("ab") as weights:
        weights.write(b"\0" * 3)
    assert (
        incomplete_reason(checkpoint, resumable=False)
        == "model.safetensors has 3 bytes after the data its header describes"
    )


def test_a_checkpoint_of_several_processes_needs_each_ones_rng_state(reference, tmp_path):
    """Under DDP every rank writes rng_state_<rank>.pth; a rank killed while rank 0 finished the folder leaves it
    without that rank's file, which the ranks that resume would each need."""
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(reference / "checkpoint-2", checkpoint)
    assert is_complete(checkpoint, processes=2)  # a one-process checkpoint: transformers resumes it on 2, unseeded
    state = (checkpoint / "rng_state.pth").read_bytes()
    (checkpoint / "rng_state.pth").unlink()
    for rank in (0, 1, 2):
        (checkpoint / f"rng_state_{rank}.pth").write_bytes(state)
    assert is_complete(checkpoint, processes=3) and is_complete(checkpoint, processes=2)
    (checkpoint / "rng_state_1.pth").unlink()
    assert is_complete(checkpoint)  # nothing says how many processes wrote it
    assert incomplete_reason(checkpoint, processes=3) == (
        "no rng_state_1.pth: the RNG state of one of the 3 processes that resume from it"
    )
    assert last_checkpoint(tmp_path, processes=2) is None and last_checkpoint(tmp_path) == checkpoint
    assert is_complete(checkpoint, resumable=False, processes=3)  # averaging reads no RNG state


def test_a_failed_write_names_the_file_this_rank_was_writing(tmp_path):
    """Under DDP the ranks write into one folder at once: rank 0 everything but the others' RNG states, rank r its
    own `rng_state_<r>.pth`; the newest file of the folder may be another rank's."""
    import os

    from vaswani_mt.training.checkpoints import describe_write_failure

    for age, name in enumerate(["rng_state_1.pth", "optimizer.pt", "rng_state_0.pth", "model.safetensors"]):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, ns=(10**18 - age * 10**9,) * 2)  # rng_state_1.pth the newest
    full = OSError(28, "No space left on device")
    assert describe_write_failure(tmp_path, full, rank=0).startswith("optimizer.pt: No space left on device (")
    assert describe_write_failure(tmp_path, full, rank=1, writes_all=False).startswith("rng_state_1.pth: No space")
    assert describe_write_failure(tmp_path, full).startswith("optimizer.pt: ")  # one process: rng_state.pth


def test_a_checkpoint_given_to_resume_from_must_be_complete(reference, corpus, tmp_path):
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(reference / "checkpoint-2", checkpoint)
    (checkpoint / "rng_state.pth").unlink()

    def resume_from(*extra: str):
        args = parse_args(
            [*reference_command(corpus, tmp_path)[2:], "--resume_from_checkpoint", str(checkpoint), *extra]
        )
        return resume_point(args[3], tmp_path)

    with pytest.raises(
        CheckpointError, match=rf"{re.escape(str(checkpoint))}: not a complete checkpoint \(no rng_state.pth\)"
    ):
        resume_from()
    assert resume_from("--save_only_model", "true") == str(checkpoint)  # such a run saves only the weights
    checkpoint = tmp_path / "nowhere"
    with pytest.raises(CheckpointError, match="nowhere: not a complete checkpoint \\(no such folder\\)"):
        resume_from()


# ---------------------------------------------------------------------------------------------------------------
# Averaging and the logged rows


def test_averaging_writes_the_mean_of_the_last_k_checkpoints(tmp_path):
    checkpoints = tmp_path / "run"
    models = []
    for step, seed in ((1, 0), (2, 1), (3, 2)):
        model = make_model(seed=seed, vocab_size=TINY_VOCABULARY)
        folder = checkpoints / f"checkpoint-{step}"
        model.save_pretrained(folder)
        (folder / "trainer_state.json").write_text("{}")
        models.append(model)
    (checkpoints / "checkpoint-4").mkdir()  # incomplete: ignored
    out = average_checkpoints(checkpoints, last=2, output=tmp_path / "avg")
    averaged = VaswaniForConditionalGeneration.from_pretrained(out)
    expected = (models[1].model.shared.weight + models[2].model.shared.weight) / 2
    torch.testing.assert_close(averaged.model.shared.weight, expected)
    assert averaged.lm_head.weight is averaged.model.shared.weight
    torch.testing.assert_close(
        averaged.model.decoder.layers[0].ffn.fc1.bias,
        (models[1].model.decoder.layers[0].ffn.fc1.bias + models[2].model.decoder.layers[0].ffn.fc1.bias) / 2,
    )
    assert not (out / "trainer_state.json").exists()
    # A window that ends earlier: checkpoints 1 and 2.
    window = VaswaniForConditionalGeneration.from_pretrained(
        average_checkpoints(checkpoints, last=2, output=tmp_path / "avg2", up_to_step=2)
    )
    torch.testing.assert_close(
        window.model.shared.weight, (models[0].model.shared.weight + models[1].model.shared.weight) / 2
    )
    with pytest.raises(FileNotFoundError, match="up to step 0"):
        average_checkpoints(checkpoints, last=2, output=tmp_path / "avg0", up_to_step=0)
    with pytest.raises(ValueError, match="checkpoints"):
        average_checkpoints(checkpoints, last=2, output=checkpoints)


def test_log_history_is_the_runs_final_state_else_its_last_checkpoints(job_run, tmp_path):
    output = Path(shutil.copytree(job_run.output, tmp_path / "run"))  # a copy: its final state is removed below
    history = json.loads((output / "trainer_state.json").read_text())["log_history"]
    assert log_history(output) == history
    # a run cut off by its time budget has no final state: its last checkpoint's
    (output / "trainer_state.json").rename(tmp_path / "state.json")
    last_state = json.loads((last_checkpoint(output) / "trainer_state.json").read_text())
    assert log_history(output) == last_state["log_history"]
