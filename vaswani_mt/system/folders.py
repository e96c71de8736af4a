"""The folders the commands write: replaced only when asked (`check_replaceable`), and written whole
(`written_whole`): what is left at `--output` is the old folder or the new one complete, never one cut short by a
crash, a full disk or Ctrl-C that a later step would take for a whole model."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path


def check_replaceable(output: str | os.PathLike, overwrite: bool, reads: Iterable[str | os.PathLike] = ()) -> None:
    """The rule of every command that writes a folder, checked before any work: `output` is not, and does not hold,
    a folder in `reads`; and where it exists and is not an empty folder, only `overwrite` lets it be replaced.
    Raises ValueError (one line) otherwise."""
    path = Path(output)
    for folder in reads:
        read = Path(folder).resolve()
        if path.resolve() == read or path.resolve() in read.parents:
            raise ValueError(f"--output {output} would replace {folder}, which it reads: choose another --output")
    if not overwrite and (path.is_symlink() or path.exists()) and not (path.is_dir() and not any(path.iterdir())):
        raise ValueError(f"{output} exists and is not empty: choose another --output, or pass --overwrite")


@contextlib.contextmanager
def written_whole(output: str | os.PathLike) -> Iterator[Path]:
    """Yields a new empty sibling of `output` (`.NAME-XXXXXXXX`) to write into. When the block ends without an error,
    it takes `output`'s place: a folder already there is first renamed aside, then deleted once the new one is in
    place. On an error the sibling is deleted and `output` is left as it was."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    # mkdir, not tempfile.mkdtemp: the folder keeps the umask's permissions (mkdtemp's are 0700) once it is renamed.
    staging = output.parent / f".{output.name}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        old = None
        if output.exists() or output.is_symlink():
            old = output.parent / f".{output.name}-old-{uuid.uuid4().hex[:8]}"
            os.replace(output, old)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()


__all__ = ["check_replaceable", "written_whole"]
