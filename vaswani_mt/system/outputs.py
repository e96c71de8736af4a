"""An output file that appears only whole and that a stopped run continues (`--output F` of translate): until every
line is done the lines go to `F.partial`, in input order; `F.resume` says what run wrote them (a key of its options
and input) and, after a clean stop (a signal), the lines it finished past the first unfinished one. The same command
then continues where it stopped, does no finished line again, and refuses in one line another command's run; after
a hard stop (`kill -9`, a lost machine) it continues from the whole lines in `F.partial`.

A rerun restarts at the chunk of lines the stop fell in (`resume(chunk)`), keeping that chunk's finished lines, so
its batches are the uninterrupted run's and so is every byte of the output.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def run_key(identity: dict) -> str:
    """A short key of a run's identity (any JSON-able description: options, models, input), for its files."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ResumableOutput:
    """The files of `output` for the run whose `identity` (any JSON-able description: options, models, input) is
    given; lines are counted from 1; each input line writes `lines_per_input` output lines (n-best: K)."""

    def __init__(self, output: str | os.PathLike, identity: dict, lines_per_input: int = 1):
        self.output, self.partial, self.state = Path(output), Path(f"{output}.partial"), Path(f"{output}.resume")
        self.key = run_key(identity)
        self.lines_per_input = lines_per_input
        self.kept: dict[int, str] = {}

    def resume(self, chunk: int = 1) -> tuple[int, dict[int, str]]:
        """(the input lines to skip: the whole chunks of `chunk` lines a stopped run of this command wrote to
        `F.partial`, the text of the finished lines after them by line); (0, {}) for a new run. `F.partial` is cut
        back to those chunks. The finished lines are kept only from a clean stop, which recorded every one: after a
        hard stop the chunk is translated again whole, so that its batches are the same. ValueError, one line,
        where the files are another run's, or `F.partial` has no `F.resume` that says what it holds."""
        if not self.partial.exists():
            self.state.unlink(missing_ok=True)
            return 0, {}
        try:
            state = json.loads(self.state.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise ValueError(f"{self.partial} exists without a readable {self.state.name}: remove {self.partial} to "
                             "start again") from None  # fmt: skip
        if state.get("key") != self.key:
            raise ValueError(f"{self.partial} was written by a run with other options or input: rerun that command to "
                             f"continue it, or remove {self.partial} and {self.state} to start again")  # fmt: skip
        with open(self.partial, "r+b") as f:
            data = f.read()
            lines = data.split(b"\n")[:-1]  # whole lines only: what a hard stop left after the last one is cut
            written = len(lines) // self.lines_per_input
            start = written // chunk * chunk
            k = self.lines_per_input
            self.kept = {}
            if "later" in state:  # a clean stop: every finished line is known
                self.kept = {line: b"".join(x + b"\n" for x in lines[(line - 1) * k : line * k]).decode("utf-8")
                             for line in range(start + 1, written + 1)}  # fmt: skip
                self.kept.update({int(line): text for line, text in state["later"].items() if int(line) > written})
            f.truncate(sum(len(x) + 1 for x in lines[: start * k]))
        return start, dict(self.kept)

    def open(self):
        """`F.partial`, to append to. `F.resume` first says whose it is, and no more: what a hard stop leaves, so
        that its rerun translates the chunk it fell in again whole."""
        self._record({"key": self.key})
        return open(self.partial, "ab")

    def stopped(self, written: int, later: dict[int, str]) -> str:
        """Records a clean stop (`written`: its lines in `F.partial`; `later`: the text of lines finished after them)
        and says so, in one line."""
        kept = {line: text for line, text in {**self.kept, **later}.items() if line > written}
        self._record({"key": self.key, "written": written, "later": kept})
        more = f" and {len(kept)} finished lines after them in {self.state}" if kept else ""
        return (f"interrupted at line {written + 1}: {written} lines written to {self.partial}{more}; rerun the same "
                f"command to continue (it writes {self.output} once every line is done)")  # fmt: skip

    def finished(self) -> None:
        """`F.partial` becomes F; the state goes."""
        os.replace(self.partial, self.output)
        self.state.unlink(missing_ok=True)

    def _record(self, state: dict) -> None:
        temporary = self.state.with_name(self.state.name + ".tmp")
        temporary.write_text(json.dumps(state), encoding="utf-8")
        os.replace(temporary, self.state)


__all__ = ["ResumableOutput", "run_key"]
