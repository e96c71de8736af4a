"""An output file that appears only whole and that a stopped run continues (`--output F` of translate): until every
line is done the lines go to `F.partial`, in input order, locked while a run writes it; `F.resume` says what run
wrote them (a key of each part of what makes the output), what the controls did to each line, and, after a clean
stop (a signal), the lines it finished past the first unfinished one. The same command then continues where it
stopped, does no finished line again, and refuses in one line, naming what differs, another run's files; after a
hard stop (`kill -9`, a lost machine) it continues from the whole lines in `F.partial`.

A rerun restarts at the chunk of lines the stop fell in (`resume(chunk)`), keeping that chunk's finished lines, so
its batches are the uninterrupted run's and so is every byte of the output.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path


def run_key(identity: dict) -> str:
    """A short key of a run's identity (any JSON-able description: options, models, input), for its files."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_parts(identity: dict) -> dict[str, str]:
    """The key of each named part of a run's identity, so that a rerun that differs can say in what."""
    return {name: run_key({name: value}) for name, value in identity.items()}


def other_run(what: os.PathLike, remove: str, stored: dict, key: str, parts: dict[str, str]) -> ValueError | None:
    """None where the `stored` state (a `key` and its `parts`) of `what` is this run's; else the one-line error that
    names the parts that differ (a state written before parts were kept: none named) and what to `remove`."""
    if stored.get("key") == key:
        return None
    before = stored.get("parts") or {}
    changed = sorted(name for name in {*before, *parts} if before.get(name) != parts.get(name)) if before else []
    named = f" ({', '.join(changed)})" if changed else ""
    return ValueError(f"{what} was written by a run with other options or input{named}: rerun that command to continue "
                      f"it, or remove {remove} to start again")  # fmt: skip


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (a model's weights, an input): what a run's key holds of it, not its name."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _scan(f, step: int) -> tuple[int, list[int], int]:
    """(the whole lines of a binary file, the byte every run of `step` lines starts at, the byte after the last whole
    line), read a block at a time: memory stays flat whatever its size."""
    lines, starts, end, position = 0, [0], 0, 0
    while block := f.read(1 << 20):
        count, at = block.count(b"\n"), -1
        if count:
            end = position + block.rindex(b"\n") + 1
        while lines + count >= len(starts) * step:  # a run of `step` lines ends in this block
            for _ in range(len(starts) * step - lines):
                at = block.index(b"\n", at + 1)
            count -= len(starts) * step - lines
            lines = len(starts) * step
            starts.append(position + at + 1)
        lines += count
        position += len(block)
    return lines, starts, end


class ResumableOutput:
    """The files of `output` for the run whose `identity` (any JSON-able description: options, models, input) is
    given; lines are counted from 1; each input line writes `lines_per_input` output lines (n-best: K)."""

    def __init__(self, output: str | os.PathLike, identity: dict, lines_per_input: int = 1):
        self.output, self.partial, self.state = Path(output), Path(f"{output}.partial"), Path(f"{output}.resume")
        self.key, self.parts = run_key(identity), run_parts(identity)
        self.lines_per_input = lines_per_input
        self.kept: dict[int, str] = {}
        # What the controls did to the lines kept or written (JSON, by line): a rerun that keeps one reports it again.
        self.outcomes: dict[int, object] = {}

    def resume(self, chunk: int = 1) -> tuple[int, dict[int, str]]:
        """(the input lines to skip: the whole chunks of `chunk` lines a stopped run of this command wrote to
        `F.partial`, the text of the finished lines after them by line); (0, {}) for a new run. `F.partial` is cut
        back to those chunks. The finished lines are kept only from a clean stop, which recorded every one: after a
        hard stop the chunk is translated again whole, so that its batches are the same. ValueError, one line,
        where the files are another run's, or `F.partial` has no `F.resume` that says what it holds."""
        state = self.check()
        if state is None:
            self.state.unlink(missing_ok=True)
            return 0, {}
        k = self.lines_per_input
        with open(self.partial, "r+b") as f:
            self._locked(f)
            lines, starts, end = _scan(f, chunk * k)  # whole lines only: what a hard stop left after them is cut
            written = lines // k
            start = written // chunk * chunk
            f.seek(starts[written // chunk])  # read back the last chunk only, however long the file
            tail = f.read(end - starts[written // chunk]).split(b"\n")
            self.kept = {}
            if "later" in state:  # a clean stop: every finished line is known
                self.kept = {start + i + 1: b"".join(x + b"\n" for x in tail[i * k : (i + 1) * k]).decode("utf-8")
                             for i in range(written - start)}  # fmt: skip
                self.kept.update({int(line): text for line, text in state["later"].items() if int(line) > written})
            f.truncate(starts[written // chunk])
        self.outcomes = {int(line): outcome for line, outcome in state.get("outcomes", {}).items()
                         if int(line) <= start or int(line) in self.kept}  # fmt: skip
        return start, dict(self.kept)

    def check(self) -> dict | None:
        """The state of a stopped run of this command (None: there is none), before anything is loaded or written;
        ValueError, one line, where the files are another run's (naming what differs) or say nothing."""
        if not self.partial.exists():
            return None
        try:
            state = json.loads(self.state.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise ValueError(f"{self.partial} exists without a readable {self.state.name}: remove {self.partial} to "
                             "start again") from None  # fmt: skip
        error = other_run(self.partial, f"{self.partial} and {self.state}", state, self.key, self.parts)
        if error is not None:
            raise error
        return state

    def open(self):
        """`F.partial`, to append to, locked (ValueError, one line, where another run holds it). `F.resume` first says
        whose it is, and no more: what a hard stop leaves, so that its rerun translates the chunk it fell in again
        whole."""
        f = open(self.partial, "ab")
        try:
            self._locked(f)
        except ValueError:
            f.close()
            raise
        self._record({})
        return f

    def _locked(self, f) -> None:
        """An exclusive lock on `F.partial` (open as `f`) while this run holds it, or ValueError, one line: two runs
        writing one output at once would mix their lines."""
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{self.partial} is being written by another run: wait for it to end, or stop it "
                             "first") from None  # fmt: skip
        except OSError:  # a file system without locks (some network ones): written unlocked, as before
            pass

    def record_outcomes(self, outcomes: dict[int, object]) -> None:
        """Records what the controls did to lines (by line), before those lines are written."""
        self.outcomes.update(outcomes)
        self._record({})

    def stopped(self, written: int, later: dict[int, str], outcomes: dict[int, object] | None = None) -> str:
        """Records a clean stop (`written`: its lines in `F.partial`; `later`: the text of lines finished after them,
        `outcomes` what the controls did to those) and says so, in one line."""
        kept = {line: text for line, text in {**self.kept, **later}.items() if line > written}
        self.outcomes.update(outcomes or {})
        self._record({"written": written, "later": kept})
        more = f" and {len(kept)} finished lines after them in {self.state}" if kept else ""
        return (f"interrupted at line {written + 1}: {written} lines written to {self.partial}{more}; rerun the same "
                f"command to continue (it writes {self.output} once every line is done)")  # fmt: skip

    def finished(self) -> None:
        """`F.partial` becomes F; the state goes."""
        os.replace(self.partial, self.output)
        self.state.unlink(missing_ok=True)

    def _record(self, state: dict) -> None:
        temporary = self.state.with_name(self.state.name + ".tmp")
        state = {"key": self.key, "parts": self.parts, "outcomes": self.outcomes, **state}
        temporary.write_text(json.dumps(state), encoding="utf-8")
        os.replace(temporary, self.state)


__all__ = ["ResumableOutput", "file_digest", "other_run", "run_key", "run_parts"]
