"""An output file that appears only whole and that a stopped run continues (`--output F` of translate): until every
line is done the lines go to `F.partial`, in input order; a run stopped by a signal also keeps, in `F.resume`, the
lines it finished past the first unfinished one and what the run was (a key of its options and input), so that the
same command continues where it stopped, does no finished line again, and refuses in one line another command's run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


class ResumableOutput:
    """The files of `output` for the run whose `identity` (any JSON-able description: options, models, input) is
    given; lines are counted from 1."""

    def __init__(self, output: str | os.PathLike, identity: dict):
        self.output, self.partial, self.state = Path(output), Path(f"{output}.partial"), Path(f"{output}.resume")
        self.key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
        self.kept: dict[int, str] = {}

    def resume(self) -> tuple[int, dict[int, str]]:
        """(the lines a stopped run of this command wrote to `F.partial`, the text of those it finished after them by
        line); (0, {}) for a new run. ValueError, one line, where they are another run's, or `F.partial` has no
        `F.resume` that says what it holds."""
        if not self.partial.exists():
            self.state.unlink(missing_ok=True)
            return 0, {}
        try:
            state = json.loads(self.state.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise ValueError(f"{self.partial} exists without a readable {self.state.name} (a run that did not stop "
                             f"cleanly): remove {self.partial} to start again") from None  # fmt: skip
        if state.get("key") != self.key:
            raise ValueError(f"{self.partial} was written by a run with other options or input: rerun that command to "
                             f"continue it, or remove {self.partial} and {self.state} to start again")  # fmt: skip
        with open(self.partial, "r+b") as f:  # whole lines only: what a hard stop left after the last one is cut
            data = f.read()
            f.truncate(data.rfind(b"\n") + 1)
        self.kept = {int(line): text for line, text in state.get("later", {}).items()}
        return int(state["written"]), dict(self.kept)

    def open(self):
        """`F.partial`, to append to."""
        return open(self.partial, "ab")

    def stopped(self, written: int, later: dict[int, str]) -> str:
        """Records a stopped run (`written`: its lines in `F.partial`; `later`: the text of lines finished after them)
        and says so, in one line."""
        kept = {line: text for line, text in {**self.kept, **later}.items() if line > written}
        temporary = self.state.with_name(self.state.name + ".tmp")
        temporary.write_text(json.dumps({"key": self.key, "written": written, "later": kept}), encoding="utf-8")
        os.replace(temporary, self.state)
        more = f" and {len(kept)} finished lines after them in {self.state}" if kept else ""
        return (f"interrupted at line {written + 1}: {written} lines written to {self.partial}{more}; rerun the same "
                f"command to continue (it writes {self.output} once every line is done)")  # fmt: skip

    def finished(self) -> None:
        """`F.partial` becomes F; the state goes."""
        os.replace(self.partial, self.output)
        self.state.unlink(missing_ok=True)


__all__ = ["ResumableOutput"]
