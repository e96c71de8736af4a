"""A file translated by many processes and machines (`accelerate launch scripts/translate.py --input F --output
G`): the input is split once into shards of whole chunks with about equal source tokens, each process translates
its shards into files of their own, and the first process joins them into G in input order. A shard's chunks are
the ones one process reads (`TranslationOptions.chunk_lines`), so its batches, and every byte of G, are one
process's; a file shorter than a chunk a process, the default chunk, is cut into a chunk a process (one process
with `--chunk_size` that many lines writes its bytes). Each shard resumes by itself
(`system.outputs.ResumableOutput`); the folder `G.shards` beside the output holds the plan (`manifest.json`) and
the shards' files until G is whole.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from vaswani_mt.inference.streams import MAX_LINE_BYTES
from vaswani_mt.system.outputs import ResumableOutput, other_run, run_key, run_parts


@dataclass(frozen=True)
class Shard:
    index: int
    first: int  # input lines before it
    lines: int
    offset: int  # the byte its first line starts at
    tokens: int  # source tokens, as the model's tokenizer counts them, plus one per line


def plan_shards(source, tokenizer, chunk: int, count: int, spread: bool = False) -> list[Shard]:
    """At most `count` shards of `source`, a file's path (one pass over it) or its lines already read (a gettext
    catalog's: offsets 0), each a run of whole chunks of `chunk` lines (from its first line) with about the same
    number of tokens; one tokenizer call per chunk.

    `spread` (the chunk is the default one, not a `--chunk_size` given): a file shorter than `count` chunks is cut
    into `count` chunks of equal lines instead, one a shard, so that every process has a share."""
    if spread and chunk > 1:
        lines = sum(1 for _ in itertools.islice(_chunks(source, 1), chunk * count))
        if lines < chunk * count:
            chunk = max(1, -(-lines // count))
    chunks, first = [], 0  # (first line, lines, offset, tokens)
    for offset, texts in _chunks(source, chunk):
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if any(texts) else []
        chunks.append((first, len(texts), offset, sum(map(len, ids)) + len(texts)))
        first += len(texts)
    if not chunks:
        return []
    totals = list(itertools.accumulate(c[3] for c in chunks))
    cuts = {bisect.bisect_left(totals, totals[-1] * k / count) + 1 for k in range(1, count)}
    if len(chunks) <= count:  # a chunk a shard: none waits for another's
        cuts = set(range(1, len(chunks)))
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(chunks)), len(chunks)]
    shards = []
    for index, (start, end) in enumerate(itertools.pairwise(bounds)):
        part = chunks[start:end]
        shards.append(Shard(index, part[0][0], sum(c[1] for c in part), part[0][2], sum(c[3] for c in part)))
    return shards


def _chunks(source, chunk: int) -> Iterator[tuple[int, list[str]]]:
    """(the byte it starts at, its lines) of each run of `chunk` lines of `source` (`plan_shards`')."""
    if not isinstance(source, (str, os.PathLike)):
        yield from ((0, list(source[start : start + chunk])) for start in range(0, len(source), chunk))
        return
    with open(source, "rb") as f:
        while True:
            offset = f.tell()
            texts = [_decode(line) for line in itertools.islice(_lines(f), chunk)]
            if not texts:
                return
            yield offset, texts


def _lines(f: BinaryIO):
    """The lines of a binary file as `streams.read_text_lines` counts them, each cut to MAX_LINE_BYTES."""
    while line := f.readline(MAX_LINE_BYTES):
        rest = line
        while not rest.endswith(b"\n") and (rest := f.readline(MAX_LINE_BYTES)):
            pass
        yield line


def _decode(line: bytes) -> str:
    return line.rstrip(b"\r\n").decode("utf-8", errors="replace")


class ShardedOutput:
    """`output` written by shards: the plan in `output.shards/manifest.json` (the run's key and its shards), and per
    shard a `ResumableOutput` (`output.shards/K`, `K.partial`, `K.resume`)."""

    def __init__(self, output: str | os.PathLike, identity: dict, lines_per_input: int = 1):
        self.output, self.folder = Path(output), Path(f"{output}.shards")
        self.manifest = self.folder / "manifest.json"
        self.identity, self.lines_per_input = identity, lines_per_input
        self.key, self.parts = run_key(identity), run_parts(identity)

    def plan(self, source, tokenizer, chunk: int, count: int, spread: bool = False) -> list[Shard]:
        """The shards of this run: those of the manifest a stopped run of it wrote, else `plan_shards`' (written to
        the manifest). ValueError, one line, where the folder holds another run's."""
        if self.manifest.exists():
            return self.shards()
        shards = plan_shards(source, tokenizer, chunk, count, spread)
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.manifest.with_suffix(".tmp")
        temporary.write_text(
            json.dumps({"key": self.key, "parts": self.parts, "shards": [asdict(s) for s in shards]}), encoding="utf-8"
        )
        os.replace(temporary, self.manifest)
        return shards

    def shards(self) -> list[Shard]:
        """The manifest's shards; ValueError, one line, where it is another run's or cannot be read."""
        try:
            manifest = json.loads(self.manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read {self.manifest} ({error}): the output must be on a folder every process "
                             f"sees, or remove {self.folder} to start again") from None  # fmt: skip
        error = other_run(self.folder, str(self.folder), manifest, self.key, self.parts)
        if error is not None:
            raise error
        return [Shard(**shard) for shard in manifest["shards"]]

    def part(self, shard: Shard) -> ResumableOutput:
        return _ShardOutput(self.folder / f"{shard.index:05d}", {**self.identity, "shard": asdict(shard)},
                            self.lines_per_input)  # fmt: skip

    def outcomes(self, shard: Shard) -> dict[int, object]:
        """What the controls did to the lines of a finished shard (by its line, from 1), for a rerun's report."""
        path = self.folder / f"{shard.index:05d}.outcomes"
        kept = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        return {int(line): outcome for line, outcome in kept.items()}

    def is_done(self, shard: Shard) -> bool:
        return (self.folder / f"{shard.index:05d}").exists()

    def path(self, shard: Shard) -> Path:
        """The file of a finished shard."""
        return self.folder / f"{shard.index:05d}"

    def join(self, shards: list[Shard], write: Callable[[Path, ShardedOutput, list[Shard]], None] | None = None):
        """The finished shards, in order, become `output` (through `output.partial`: never half-written): their
        bytes, or what `write(partial, self, shards)` makes of them (a gettext catalog); the folder goes."""
        partial = Path(f"{self.output}.partial")
        if write is not None:
            write(partial, self, shards)
        else:
            with open(partial, "wb") as sink:
                for shard in shards:
                    with open(self.path(shard), "rb") as part:
                        shutil.copyfileobj(part, sink, 1 << 20)
        os.replace(partial, self.output)
        shutil.rmtree(self.folder)


class _ShardOutput(ResumableOutput):
    """A shard's output, whose controls outcomes stay beside it once it is whole (`K.outcomes`): a rerun that finds
    the shard done reports them, so that its exit status is the whole run's."""

    def finished(self) -> None:
        temporary = Path(f"{self.output}.outcomes.tmp")
        temporary.write_text(json.dumps(self.outcomes), encoding="utf-8")
        os.replace(temporary, f"{self.output}.outcomes")
        super().finished()


__all__ = ["Shard", "ShardedOutput", "plan_shards"]
