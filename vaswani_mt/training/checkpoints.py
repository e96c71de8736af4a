"""Checkpoints: finding the last complete one, and averaging the last K (§6.1: the last 5 checkpoints, written at
10-minute intervals, for the base model, the last 20 for the big one).

A checkpoint counts as complete only when every file resuming reads was written whole (`incomplete_reason`).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vaswani_mt.inference.loading import PICKLE_SUFFIXES
from vaswani_mt.system.folders import written_whole

from .machines import MachinesError, machines

if TYPE_CHECKING:
    from transformers import Seq2SeqTrainingArguments

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# What an averaged folder never takes from a checkpoint: Trainer's bookkeeping, the old weights and every pickle,
# so that loading it unpickles nothing.
_NOT_PUBLISHED_NAMES = ("trainer_state.json", "model.safetensors.index.json")
_NOT_PUBLISHED_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES)


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (a full disk, a file-size limit, a lost mount; the checkpoints written
    before it are intact) or a resume refused one of its files; the message names the folder and the cause."""


def _safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file, read from its header alone (no tensor is loaded): a file cut off while
    it was written is shorter than the 8-byte header length, the JSON header and the data the header describes."""
    size = file.stat().st_size
    try:
        with file.open("rb") as f:
            header_length = int.from_bytes(f.read(8), "little") if size >= 8 else -1
            if not 0 < header_length <= size - 8:
                return f"{file.name} is truncated ({size} bytes, no complete header)"
            header = json.loads(f.read(header_length))
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):  # JSON and Unicode errors: ValueErrors
        return f"{file.name} has an unreadable header"
    expected = 8 + header_length + end
    if size < expected:
        return f"{file.name} is truncated ({size} of {expected} bytes)"
    if size > expected:
        return f"{file.name} has {size - expected} bytes after the data its header describes"
    return None


# What `Trainer._save_checkpoint` writes besides the weights, `trainer_state.json` last; resuming needs all of them.
_RESUME_FILES = ("optimizer.pt", "scheduler.pt", "rng_state*.pth", "trainer_state.json")


def incomplete_reason(
    checkpoint: str | os.PathLike, resumable: bool = True, processes: int | None = None
) -> str | None:
    """Why `checkpoint` cannot be used, or None when it is complete.

    Trainer writes `trainer_state.json` last, but an earlier file can still be cut short (a full disk, a crash), so
    safetensors headers must match their files' sizes and `.pt`/`.pth` files end with their zip directory.

    `resumable=False` asks only for what averaging and evaluation read: the weights and `trainer_state.json`.
    `processes`: how many processes will resume from it; a checkpoint written by several needs each rank's
    `rng_state_<r>.pth` (a rank killed while rank 0 finished the folder leaves it looking whole without its file).
    """
    checkpoint = Path(checkpoint)
    weights = _weight_files(checkpoint)
    if not weights:
        return "no model.safetensors"
    for pattern in _RESUME_FILES if resumable else ("trainer_state.json",):
        if not any(checkpoint.glob(pattern)):
            return f"no {pattern.replace('*', '')}"
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return "trainer_state.json is not complete JSON"
    if not isinstance(state, dict):
        return "trainer_state.json is not a JSON object"
    for file in weights:
        problem = _safetensors_problem(file)
        if problem:
            return problem
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            return f"{index.name} is not complete JSON"
        missing = sorted(shard for shard in shards if not (checkpoint / shard).is_file())
        if missing:
            return f"no {missing[0]} (listed in {index.name})"
    if resumable and processes and processes > 1 and any(checkpoint.glob("rng_state_*.pth")):
        missing = [
            f"rng_state_{rank}.pth" for rank in range(processes) if not (checkpoint / f"rng_state_{rank}.pth").is_file()
        ]
        if missing:
            return f"no {missing[0]}: the RNG state of one of the {processes} processes that resume from it"
    if resumable:
        for file in sorted([*checkpoint.glob("*.pt"), *checkpoint.glob("*.pth")]):
            if not zipfile.is_zipfile(file):
                return f"{file.name} is truncated (no zip directory at its end)"
    return None


def unpickling_refused(checkpoint: str | os.PathLike, error: pickle.UnpicklingError) -> CheckpointError:
    """The error for a resume that `torch.load(weights_only=True)` refused: a state file of `checkpoint` holds more
    than tensors and plain values. Names the file (found by loading each again, as safely) and what it asked for."""
    from transformers.trainer_pt_utils import safe_globals

    checkpoint = Path(checkpoint)
    culprit = "one of its state files"
    for file in sorted([*checkpoint.glob("*.pt"), *checkpoint.glob("*.pth")]):
        try:
            with safe_globals():
                torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            culprit = file.name
            break
        except Exception:  # another problem of another file, not the one refused
            continue
    found = re.search(r"WeightsUnpickler error: (.*?\.)(?:\s|$)", str(error))
    cause = found.group(1) if found else " ".join(str(error).split())[:200]
    return CheckpointError(
        f"could not resume from {checkpoint}: {culprit} holds more than tensors, and unpickling it could run code "
        f"(torch.load with weights_only=True refused it: {cause}); delete the folder, and the same command resumes "
        "from the checkpoint before it"
    )


def is_complete(checkpoint: str | os.PathLike, resumable: bool = True, processes: int | None = None) -> bool:
    """Whether `checkpoint` was written whole (`incomplete_reason`): with `resumable`, everything resuming needs."""
    return incomplete_reason(checkpoint, resumable, processes) is None


def list_checkpoints(
    directory: str | os.PathLike,
    complete_only: bool = True,
    up_to_step: int | None = None,
    resumable: bool = True,
    processes: int | None = None,
) -> list[Path]:
    """`checkpoint-N` folders in `directory`, oldest first (only N <= `up_to_step` when given); incomplete ones
    (`incomplete_reason`) are skipped with a warning that says what is wrong."""
    found = []
    for path in Path(directory).iterdir() if Path(directory).is_dir() else []:
        match = _CHECKPOINT.match(path.name)
        if not (match and path.is_dir()) or (up_to_step is not None and int(match.group(1)) > up_to_step):
            continue
        problem = incomplete_reason(path, resumable, processes) if complete_only else None
        if problem:
            logger.warning("ignoring %s: it was not completely written (%s)", path, problem)
            continue
        found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def last_checkpoint(directory: str | os.PathLike, resumable: bool = True, processes: int | None = None) -> Path | None:
    """The newest complete checkpoint in `directory` (see `list_checkpoints`), or None."""
    checkpoints = list_checkpoints(directory, resumable=resumable, processes=processes)
    return checkpoints[-1] if checkpoints else None


def log_history(run: str | os.PathLike) -> list[dict]:
    """A training run's logged rows (`trainer_state.json`'s `log_history`): the run's final state where it wrote
    one, else its last complete checkpoint's."""
    state = Path(run) / "trainer_state.json"
    if not state.is_file():
        checkpoint = last_checkpoint(run, resumable=False)
        if checkpoint is None:
            raise FileNotFoundError(f"{run}: no trainer_state.json and no checkpoint-N folder with one")
        state = checkpoint / "trainer_state.json"
    return json.loads(state.read_text())["log_history"]


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in _weight_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    if not tensors:
        raise FileNotFoundError(f"{folder}: no safetensors weights")
    return tensors


@torch.no_grad()
def average_checkpoints(
    checkpoint_dir: str | os.PathLike, last: int, output: str | os.PathLike, up_to_step: int | None = None
) -> Path:
    """Writes the element-wise mean of the last `last` complete checkpoints in `checkpoint_dir` to `output`.

    `up_to_step`: only checkpoints of that step or earlier count. The output holds `model.safetensors` (summed in
    float64, stored in the checkpoints' dtype) and the newest checkpoint's config, generation config, code and
    tokenizer files, so it loads with `from_pretrained`; it is written whole (`system.written_whole`).
    """
    if last < 1:
        raise ValueError(f"last must be at least 1, got {last}")
    checkpoints = list_checkpoints(checkpoint_dir, up_to_step=up_to_step, resumable=False)
    if not checkpoints:
        window = f" up to step {up_to_step}" if up_to_step is not None else ""
        raise FileNotFoundError(f"{checkpoint_dir}: no complete checkpoint-N folders{window}")
    if len(checkpoints) < last:
        logger.warning("asked to average %d checkpoints but %s has %d", last, checkpoint_dir, len(checkpoints))
    chosen = checkpoints[-last:]
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for checkpoint in chosen:
        weights = _read_weights(checkpoint)
        if total and weights.keys() != total.keys():
            raise ValueError(f"{checkpoint} holds different tensors than {chosen[0]}")
        for key, tensor in weights.items():
            dtypes[key] = tensor.dtype
            total[key] = total.get(key, 0) + tensor.to(torch.float64)
    averaged = {key: (value / len(chosen)).to(dtypes[key]).contiguous() for key, value in total.items()}

    output = Path(output)
    if output.resolve() in (Path(checkpoint_dir).resolve(), *Path(checkpoint_dir).resolve().parents):
        raise ValueError(f"output {output} would replace the folder that holds the checkpoints; choose another")
    if output.exists() and list_checkpoints(output, complete_only=False):
        raise ValueError(f"output {output} holds checkpoints of its own; refusing to replace it")
    with written_whole(output) as staging:
        for item in chosen[-1].iterdir():
            if item.is_file() and item.suffix not in _NOT_PUBLISHED_SUFFIXES and item.name not in _NOT_PUBLISHED_NAMES:
                shutil.copy2(item, staging / item.name)
        metadata = {"format": "pt", "averaged_checkpoints": json.dumps([c.name for c in chosen])}
        save_file(averaged, str(staging / "model.safetensors"), metadata=metadata)
    logger.info("averaged %s into %s", ", ".join(c.name for c in chosen), output)
    return output


def describe_write_failure(folder: Path, error: Exception, rank: int | None = None, writes_all: bool = True) -> str:
    """What stopped a checkpoint's write, in one line: the file it stopped in (the newest this process writes: under
    DDP, `rank` given, its own RNG state, and with `writes_all` the rest), the cause, the free space and the
    file-size limit (`ulimit -f`) when there is one."""
    text = " ".join(str(error).split())
    if isinstance(error, OSError) and error.strerror:
        cause = error.strerror
    elif "inline_container" in text or "PytorchStreamWriter" in text:
        cause = "torch.save could not write the whole file"
    else:
        cause = text or type(error).__name__
    own = "rng_state.pth" if rank is None else f"rng_state_{rank}.pth"

    def mine(path: Path) -> bool:
        return path.name == own or (writes_all and not path.name.startswith("rng_state"))

    written = sorted(filter(mine, folder.iterdir()), key=lambda p: p.stat().st_mtime_ns) if folder.is_dir() else []
    where = f"{written[-1].name}: " if written else ""
    facts = [f"{shutil.disk_usage(folder.parent).free / 2**30:.1f} GiB free on its disk"]
    try:
        import resource  # Unix only

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            facts.append(f"files limited to {limit} bytes (ulimit -f)")
    except ImportError:
        pass
    return f"{where}{cause} ({', '.join(facts)})"


def resume_point(training_args: Seq2SeqTrainingArguments, output_dir: Path) -> str | None:
    """The checkpoint to resume from: the one given, or (by default, or `last`/`auto`/`true`) the last complete one
    (`incomplete_reason`; under `--save_only_model` the weights and trainer_state.json suffice). A given one that
    is not complete raises `CheckpointError`, with the reason.

    Under DDP rank 0 alone decides and broadcasts its choice, so every rank resumes from the same checkpoint; a rank
    that cannot see it (a disk the ranks do not share) ends the run on every rank with a `CheckpointError`.
    """
    import torch.distributed as dist
    from accelerate.utils import gather_object

    if not (dist.is_available() and dist.is_initialized()):
        return _choose_resume_point(training_args, output_dir)
    if training_args.save_on_each_node and machines().count > 1:
        return _common_resume_point(training_args, output_dir)
    decision: list = [None]
    if dist.get_rank() == 0:
        try:
            decision = [("ok", _choose_resume_point(training_args, output_dir))]
        except CheckpointError as error:
            decision = [("error", str(error))]
    dist.broadcast_object_list(decision, src=0)
    outcome, value = decision[0]
    if outcome == "error":
        raise CheckpointError(value)
    unseen = None if value is None or Path(value).is_dir() else f"rank {dist.get_rank()} cannot see {value}"
    problems = [problem for problem in gather_object([unseen]) if problem]
    if problems:
        raise CheckpointError(
            f"rank 0 resumes from {value}, but {problems[0]}: the output folder must be on a disk every process "
            "shares (or give each node its own with --save_on_each_node)"
        )
    return value


def _common_resume_point(training_args: Seq2SeqTrainingArguments, output_dir: Path) -> str | None:
    """Where each machine keeps its own copy of the checkpoints: the newest one that every machine holds whole.
    Without one in common, a `MachinesError` names the machine behind; a machine ahead resumes with the others."""
    from accelerate.utils import gather_object

    where = machines()
    processes = max(1, training_args.world_size)
    resume = training_args.resume_from_checkpoint
    if resume in (None, "", "last", "auto", "True", "true"):
        wanted = None
    else:
        wanted = Path(resume).name
        if not _CHECKPOINT.match(wanted):
            raise CheckpointError(f"--resume_from_checkpoint {resume}: not a checkpoint-N folder")
    held = None
    if training_args.local_process_index == 0:
        held = [checkpoint_step(c) for c in list_checkpoints(output_dir, resumable=not training_args.save_only_model,
                                                             processes=processes)]  # fmt: skip
    holdings = {machine: set(steps) for machine, steps in gather_object([(where.index, held)]) if steps is not None}
    newest = {machine: max(steps, default=None) for machine, steps in holdings.items()}
    if wanted is not None:
        step = checkpoint_step(wanted)
        lacking = sorted(machine for machine, steps in holdings.items() if step not in steps)
        if lacking:
            raise MachinesError(f"--resume_from_checkpoint {wanted}: {where.name(lacking)} hold no complete copy of it")
        return str(output_dir / wanted)
    if not any(holdings.values()):
        return None
    common = set.intersection(*holdings.values())
    if not common:
        behind = sorted(holdings, key=lambda machine: (newest[machine] or -1, machine))[0]
        has = f"checkpoint-{newest[behind]}" if newest[behind] is not None else "no checkpoint"
        ahead = max(holdings, key=lambda machine: newest[machine] or -1)
        raise MachinesError(
            f"machine {behind}'s output folder is missing or behind: it holds {has}, machine {ahead} "
            f"checkpoint-{newest[ahead]}, and no checkpoint is on both; copy machine {ahead}'s newest checkpoint "
            "folder there, or start every machine afresh in an empty folder"
        )
    step = max(common)
    for machine in sorted(holdings):
        if newest[machine] > step and training_args.local_process_index == 0:
            logger.warning("machine %d holds checkpoint-%d, which another machine lacks: every machine resumes from "
                           "checkpoint-%d, the newest they all hold", machine, newest[machine], step)  # fmt: skip
    return str(output_dir / f"checkpoint-{step}")


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """N of a `checkpoint-N` folder."""
    return int(Path(checkpoint).name.rsplit("-", 1)[1])


def _choose_resume_point(training_args: Seq2SeqTrainingArguments, output_dir: Path) -> str | None:
    resume = training_args.resume_from_checkpoint
    resumable = not training_args.save_only_model
    processes = max(1, training_args.world_size)
    if resume in (None, "", "last", "auto", "True", "true"):
        found = last_checkpoint(output_dir, resumable=resumable, processes=processes)
        if found is None and resume not in (None, ""):
            logger.warning("no complete checkpoint in %s to resume from; starting fresh", output_dir)
        return str(found) if found is not None else None
    problem = incomplete_reason(resume, resumable, processes) if Path(resume).is_dir() else "no such folder"
    if problem:
        raise CheckpointError(f"--resume_from_checkpoint {resume}: not a complete checkpoint ({problem})")
    return resume


__all__ = [
    "CheckpointError",
    "average_checkpoints",
    "checkpoint_step",
    "describe_write_failure",
    "incomplete_reason",
    "is_complete",
    "last_checkpoint",
    "list_checkpoints",
    "log_history",
    "resume_point",
    "unpickling_refused",
]
