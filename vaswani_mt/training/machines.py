"""Several machines (accelerate's multi-node path, torchrun underneath, Slurm): where each rank runs, whether the
machines share the output folder, that they were started alike, the tokenizer from rank 0, a lost machine or a failed
store named, and how a worker ends (with its launcher, and in one line).

Global rank r runs on machine `r // processes per machine`. With one shared folder, global rank 0 writes each
checkpoint; with a folder per machine (`save_on_each_node`, set by `settle_storage`), each machine writes a whole
copy, every rank's RNG state included, so that any one machine's folder resumes the whole run.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch.distributed as dist

logger = logging.getLogger(__name__)

# Options that name a place on one machine (its own disk) rather than what is trained: they may differ between
# machines. The corpus is compared by content instead of by path; rank 0's tokenizer is every rank's.
_PER_MACHINE_OPTIONS = frozenset(
    {
        *("output_dir", "logging_dir", "local_rank", "resume_from_checkpoint", "hub_token"),
        *("dataset", "tokenizer", "model_name_or_path", "config"),
    }
)
_PROBE = ".vaswani-storage-probe-"  # + a token of this launch: a name never looked up before (no stale NFS entry)


class MachinesError(RuntimeError):
    """The machines of a launch cannot train together: started with other options or corpora, storage shared by
    some and not others, a checkpoint missing on one, or a machine lost. The message names the machine."""


@dataclass(frozen=True)
class Machines:
    count: int  # machines in the launch
    index: int  # this process's machine (torchrun's GROUP_RANK, accelerate's --machine_rank)
    per_machine: int  # processes on each machine

    def of_rank(self, rank: int) -> int:
        return rank // self.per_machine

    def name(self, machines: list[int] | set[int]) -> str:
        ordered = sorted(machines)
        return ("machine " if len(ordered) == 1 else "machines ") + ", ".join(map(str, ordered))


def machines() -> Machines:
    """This launch's machines, from the variables torchrun sets for each worker (one machine when not launched)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return Machines(max(1, world // max(1, per_machine)), int(os.environ.get("GROUP_RANK", "0")), max(1, per_machine))


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def speaks_for_machine() -> bool:
    """Whether this process prints a run's one-line outcome for its machine: each machine's first process (its
    user reads that machine's log), which on one machine is global rank 0; a process on its own."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


# ---------------------------------------------------------------------------------------------------------------
# Agreement before the first step


def _options(*arguments) -> dict:
    values = {}
    for group in arguments:
        values.update(group.to_dict() if hasattr(group, "to_dict") else asdict(group))
    return {k: v for k, v in values.items() if k not in _PER_MACHINE_OPTIONS}


def corpus_digest(split, languages: tuple[str, str]) -> str:
    """SHA-256 of a split's texts, in order (Arrow batches of both sides, streamed: seconds for millions of pairs),
    with its number of rows: equal only for the same pairs wherever the files lie."""
    import pyarrow as pa
    import pyarrow.compute as pc

    digest = hashlib.sha256(str(len(split)).encode())
    for batch in split.select_columns("translation").with_format("arrow").iter(batch_size=100_000):
        column = batch.column("translation").combine_chunks()
        sides = pa.table({lang: pc.struct_field(column, lang) for lang in languages}).combine_chunks()
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, sides.schema) as writer:
            writer.write_table(sides)
        digest.update(sink.getvalue())
    return f"{len(split)} pairs, sha256 {digest.hexdigest()[:12]}"


def check_same_launch(where: Machines, arguments: tuple, corpus, languages: tuple[str, str]) -> None:
    """Every machine was started with the same options and the same corpus (by content), or `MachinesError` on
    every rank, naming the first machine that differs from machine 0 and how, before anything is trained."""
    if where.count < 2 or not _distributed():
        return
    from accelerate.utils import gather_object

    mine = {"options": _options(*arguments), "corpus": {s: corpus_digest(corpus[s], languages) for s in corpus}}
    everyone = gather_object([(where.index, mine)])
    reference = everyone[0][1]
    for machine, theirs in everyone:
        for key in sorted(set(reference["options"]) | set(theirs["options"])):
            ours, other = reference["options"].get(key), theirs["options"].get(key)
            if ours != other:
                raise MachinesError(
                    f"machine {machine} was started with --{key} {other!r}, machine 0 with {ours!r}: every machine "
                    "must run the same command (only the folders may differ)"
                )
        for split, digest in reference["corpus"].items():
            if theirs["corpus"].get(split) != digest:
                raise MachinesError(
                    f"machine {machine} has another corpus than machine 0: its {split} split holds "
                    f"{theirs['corpus'].get(split, 'nothing')}, machine 0's {digest}"
                )


def settle_storage(where: Machines, training_args, output_dir: Path) -> bool:
    """Whether every machine sees rank 0's output folder (a probe file); sets `save_on_each_node` to match: on for
    folders of their own, off for one shared folder (two writers would mix their files). Some machines sharing it
    and others not is `MachinesError`. One machine: its setting stays."""
    if where.count < 2 or not _distributed():
        return True
    from accelerate.utils import gather_object

    def write_probe() -> str:
        token = uuid.uuid4().hex
        (output_dir / f"{_PROBE}{token}").write_text(token)
        return token

    token = _on_rank_zero(write_probe, f"write in the output folder {output_dir}")
    probe = output_dir / f"{_PROBE}{token}"
    try:
        sees = probe.read_text() == token
    except OSError:
        sees = False
    seen = {machine: sees for machine, sees in gather_object([(where.index, sees)])}
    if dist.get_rank() == 0:
        probe.unlink(missing_ok=True)
    blind = {machine for machine, sees in seen.items() if not sees}
    if blind and len(blind) < where.count - 1:
        sharing = set(seen) - blind
        raise MachinesError(
            f"{where.name(sharing)} share the output folder {output_dir} but {where.name(blind)} "
            "cannot see it: give every machine one shared folder, or each a folder of its own"
        )
    shared = not blind
    if shared and training_args.save_on_each_node:
        logger.warning("--save_on_each_node off: the %d machines share %s, where two writers would mix their files",
                       where.count, output_dir)  # fmt: skip
    elif not shared and not training_args.save_on_each_node:
        logger.info("the output folder is not shared between the machines: each keeps a whole copy of every "
                    "checkpoint (--save_on_each_node)")  # fmt: skip
    training_args.save_on_each_node = not shared
    return shared


def from_rank_zero(build: Callable[[], object], *, expected: tuple[type[BaseException], ...] = ()):
    """A tokenizer built once, by global rank 0 (`build()`), and sent to every other rank as its saved files, so
    every rank gets the same vocabulary. Any exception in rank 0's build is `MachinesError` on every rank, in one
    line; its type is named unless it is one of `expected` (whose messages say what is wrong by themselves)."""
    if not _distributed():
        return build()
    from transformers import AutoTokenizer

    built = None

    def build_and_pack() -> dict[str, bytes]:
        nonlocal built
        built = build()
        with tempfile.TemporaryDirectory() as folder:
            built.save_pretrained(folder)
            return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}

    files = _on_rank_zero(build_and_pack, "build the tokenizer", expected)
    if built is not None:
        return built
    with tempfile.TemporaryDirectory() as folder:
        for name, data in files.items():
            Path(folder, name).write_bytes(data)
        return AutoTokenizer.from_pretrained(folder)


def rank_zero_first(load: Callable[[], object], doing: str, *, expected: tuple[type[BaseException], ...] = ()):
    """`load()` by global rank 0 first, then by every other rank (from the cache rank 0 filled: a Hub download made
    once, not once a process). Where rank 0 fails, every rank raises `MachinesError` in one line at once (each
    failing alone, the first to exit had its launcher kill the others, the one that speaks among them)."""
    if not _distributed():
        return load()
    loaded = None

    def first() -> None:
        nonlocal loaded
        loaded = load()

    _on_rank_zero(first, doing, expected)
    return loaded if dist.get_rank() == 0 else load()


def _on_rank_zero(work: Callable[[], object], doing: str, expected: tuple[type[BaseException], ...] = ()):
    """`work()` run by global rank 0 alone, its value sent to every rank. An exception in it is sent instead and
    raised on every rank as `MachinesError("rank 0 could not <doing>: ...")`: raised on rank 0 alone, it would leave
    the others waiting in the broadcast, or have them report machine 0 lost."""
    message: list = [None]
    failure = None
    if dist.get_rank() == 0:
        try:
            message = [("ok", work())]
        except Exception as error:
            failure = error
            said = " ".join(str(error).split())
            said = said if isinstance(error, expected) and said else f"{type(error).__name__}: {said}".rstrip(": ")
            message = [("error", said)]
            logger.debug("rank 0 could not %s", doing, exc_info=True)
    dist.broadcast_object_list(message, src=0)
    outcome, value = message[0]
    if outcome == "error":
        raise MachinesError(f"rank 0 could not {doing}: {value}") from failure
    return value


# ---------------------------------------------------------------------------------------------------------------
# A lost machine, a failed store

# What gloo (and NCCL) say when a peer process is gone: its sockets closed, or the collective timed out on it.
_LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out waiting",
              "remote process exited", "Connection refused")  # fmt: skip


def is_store_failure(error: BaseException) -> bool:
    """A failure of the rendezvous store (torchrun's TCPStore, kept by machine 0's launcher), which c10d raises as
    its own errors; gloo's lost peer is a plain RuntimeError."""
    return isinstance(error, (dist.DistStoreError, dist.DistNetworkError))


def is_lost_peer(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and not is_store_failure(error) and any(t in str(error) for t in _LOST_PEER)


def _first_sentence(error: BaseException) -> str:
    cause = " ".join(str(error).split())
    return cause.split("] ", 1)[-1].split(". ", 1)[0].rstrip(".")  # after gloo's source location, its first sentence


def lost_machine_error(
    error: BaseException, step: int | None = None, wait_seconds: float | None = None
) -> MachinesError:
    """The one line for a collective that failed because a peer is gone (`is_lost_peer`): which machine (or rank)
    was lost, found by asking every live rank to sign in to the rendezvous store within `wait_seconds`. Where the
    store itself failed (`error` is the store's, or the store does not answer), the line says so: it then cannot
    tell which machine is gone."""
    where, rank = machines(), int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    store_at = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    again = "start every machine's command again" if where.count > 1 else "run the same command again"
    when = f"at step {step}" if step is not None else "outside the training steps"
    intact = f"the checkpoints before it are intact: {again} to resume"
    if is_store_failure(error):
        return MachinesError(f"the rendezvous store at {store_at} failed {when} ({_first_sentence(error)}); {intact}")
    if wait_seconds is None:  # the processes of one machine see a lost peer within milliseconds of each other
        wait_seconds = 3.0 if where.count > 1 else 1.0
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=wait_seconds), wait_for_workers=False)  # fmt: skip
        store.set(f"vaswani_mt/alive/{rank}", "1")
        keys = [f"vaswani_mt/alive/{r}" for r in range(world)]
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline and not store.check(keys):
            time.sleep(0.1)
        lost_ranks = [r for r in range(world) if not store.check([keys[r]])]
    except Exception as store_error:  # no store: its keeper (machine 0's launcher) or the network to it failed
        return MachinesError(
            f"the rendezvous store at {store_at} failed ({_first_sentence(store_error)}) after a collective failed "
            f"{when} ({_first_sentence(error)}), so the lost process cannot be named; {intact}"
        )
    lost_ranks = [r for r in lost_ranks if r != rank]
    ranks = f"rank{'s' if len(lost_ranks) > 1 else ''} {', '.join(map(str, lost_ranks))}"
    if not lost_ranks:
        who = "another process"
    elif where.count > 1:
        who = f"{where.name({where.of_rank(r) for r in lost_ranks})} ({ranks})"
    else:
        who = ranks
    return MachinesError(f"{who} was lost {when} ({_first_sentence(error)}); {intact}")


# ---------------------------------------------------------------------------------------------------------------
# How a worker ends

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_launcher() -> None:
    """Under torchrun (accelerate launch; TORCHELASTIC_RUN_ID set), this worker is killed when its launcher dies
    (Linux: PR_SET_PDEATHSIG). A worker whose launcher died would train on, and the other machines' launchers would
    wait minutes at exit for the dead one (torchrun's exit barrier); killed, it is a lost machine, named by the
    others within seconds. A launcher that is signalled stops its workers itself. Call it first thing: a launcher
    that dies before the call goes unnoticed (the parent's id then tells nothing: a container's launcher is pid 1)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        logger.warning("this process will outlive its launcher: prctl failed (%s)", os.strerror(ctypes.get_errno()))


def exit_run(line: str | None, code: int = 1) -> NoReturn:
    """Ends the process with status `code`, printing `line` (`error: ...`) on stderr if given. Under a process group
    it leaves through `os._exit` once the streams are flushed: a group left open at interpreter exit can abort in
    gloo's teardown (SIGABRT, "terminate called without an active exception"), and closing it can wait on a lost
    peer. Without one it raises SystemExit, the line as its code for status 1 (what an in-process caller reads)."""
    grouped = dist.is_available() and dist.is_initialized()
    if line is not None and code == 1 and not grouped:
        sys.exit(line)
    if line is not None:
        print(line, file=sys.stderr)
    if not grouped:
        sys.exit(code)
    logging.shutdown()  # flushes the log handlers, which os._exit would not
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


__all__ = [
    "Machines",
    "MachinesError",
    "check_same_launch",
    "corpus_digest",
    "end_with_launcher",
    "exit_run",
    "from_rank_zero",
    "is_lost_peer",
    "is_store_failure",
    "lost_machine_error",
    "machines",
    "rank_zero_first",
    "settle_storage",
    "speaks_for_machine",
]
