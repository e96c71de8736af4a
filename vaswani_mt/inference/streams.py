"""Translation of byte streams (a file, a pipe, standard input) line by line: `read_text_lines` reads any bytes as
text lines, `translate_stream` writes one translation per line as a `Translator` gives them. Under
`system.signals.stopping_on_signals` (the commands), SIGINT and SIGTERM stop a translation with every finished line
up to the first unfinished one written, in order.
"""

from __future__ import annotations

import codecs
import copy
import itertools
import logging
import os
import select
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from vaswani_mt.inference.controls import ControlReport
from vaswani_mt.inference.translate import format_output
from vaswani_mt.inference.translator import Resume, Translator
from vaswani_mt.system.signals import TranslationInterrupted, held, interruptible

logger = logging.getLogger(__name__)


class _PipeReader:
    """`readline` over a pipe, socket or terminal that can also tell, without blocking, whether a line is there
    (`ready`), so that `translate_stream` answers each line a program writes and waits on."""

    def __init__(self, fd: int):
        self.fd, self.buffer, self.ended = fd, bytearray(), False

    def readline(self, limit: int) -> bytes:
        while True:
            end = self.buffer.find(b"\n", 0, limit)
            if end >= 0 or len(self.buffer) >= limit or self.ended:
                size = end + 1 if end >= 0 else min(limit, len(self.buffer))
                line = bytes(self.buffer[:size])
                del self.buffer[:size]
                return line
            data = os.read(self.fd, 1 << 16)
            self.ended = not data
            self.buffer += data

    def ready(self) -> bool:
        if self.ended or b"\n" in self.buffer:
            return True
        return bool(select.select([self.fd], [], [], 0)[0])


# Bytes read of one input line at most: more than the model can use (pipeline_vaswani._CHARS_PER_TOKEN); the rest is
# skipped without being held, so a stream without line ends cannot fill the memory.
MAX_LINE_BYTES = 1 << 20


def read_text_lines(stream: BinaryIO, name: str = "<stdin>", max_line_bytes: int = MAX_LINE_BYTES,
                    first: int = 1) -> Iterator[str]:  # fmt: skip
    """The lines of a byte stream as text, lazily, one per "\n" or "\r\n" (a UTF-8 BOM dropped from line 1 only: a
    shard or a resumed run that starts later reads U+FEFF there as the whole run does, as text; other
    Unicode line breaks are text). Never fails on content: bytes that are not UTF-8 become U+FFFD and a line longer
    than `max_line_bytes` is cut there, each with a warning naming `name` and the line (the first is line `first`)."""
    decoder = codecs.getincrementaldecoder("utf-8")
    for number in itertools.count(first):
        line = stream.readline(max_line_bytes)
        if not line:
            return
        cut = len(line) == max_line_bytes and not line.endswith(b"\n")
        if cut:  # skip the rest of the line without keeping it
            skipped = 0
            while (rest := stream.readline(max_line_bytes)) and not rest.endswith(b"\n"):
                skipped += len(rest)
            skipped += len(rest)
            if skipped:
                logger.warning(
                    "%s:%d: a line of more than %d bytes: only its first %d bytes are read", name, number,
                    max_line_bytes, max_line_bytes,
                )  # fmt: skip
            else:
                cut = False  # exactly max_line_bytes at the end of the stream: nothing was left out
        line = line.removesuffix(b"\n").removesuffix(b"\r")
        if number == 1:
            line = line.removeprefix(codecs.BOM_UTF8)
        try:
            # A cut line may end inside a character: the incomplete end is dropped, not replaced (final=False).
            text = decoder("strict").decode(line, final=not cut)
        except UnicodeDecodeError as error:
            text = decoder("replace").decode(line, final=not cut)
            logger.warning(
                "%s:%d: bytes that are not UTF-8 (%r at byte %d) read as U+FFFD", name, number,
                line[error.start : error.end], error.start + 1,
            )  # fmt: skip
        yield text


def count_lines(path: str | Path) -> int:
    """How many lines `read_text_lines` reads from the file at `path`, counted without decoding it (OSError where it
    cannot be read)."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            lines, last = lines + block.count(b"\n"), block[-1:]
    return lines + (last != b"\n")  # a last line without its end counts too


def has_tab(path: str | Path) -> bool:
    """Whether the file at `path` has a tab anywhere (constrained input: `source<TAB>term`), read a block at a time."""
    with open(path, "rb") as f:
        return any(b"\t" in block for block in iter(lambda: f.read(1 << 20), b""))


def translate_stream(translator: Translator, source: BinaryIO, sink: BinaryIO, name: str = "<stdin>", *,
                     prefixes: Iterable[str] | None = None, report: ControlReport | None = None,
                     resume: Resume | None = None, progress: bool = False) -> int:  # fmt: skip
    """Translates the lines of the byte stream `source` (`read_text_lines`) into `sink`, UTF-8, one line per line in
    input order (with `nbest`, that many lines each in Marian's n-best format, IDs from `resume.first_line - 1`), and
    returns how many input lines. Reads `chunk_size` lines at a time (default 16 batches, or 1024 lines with
    `max_tokens`; one line from a terminal; from a pipe, a chunk also ends where the input pauses) and flushes each
    line: memory stays flat, and output flows while input still arrives. `resume`: the number of `source`'s first
    line (n-best IDs, warnings) and the outputs already `done` (written as they are: `FormattedOutput`s); `prefixes`
    (from the first line read), `report` and `progress` as `Translator.translate_iterable` takes them.

    On `TranslationInterrupted` (`system.signals.stopping_on_signals`) it writes the finished lines that follow the
    last one written (the exception's `done`), flushes, and raises it again with `written`: the input lines whose
    output is in `sink`; its `later` keeps the lines finished past them."""
    ready = None
    try:
        fd = source.fileno()
    except (AttributeError, OSError):  # an in-memory stream: everything is there already
        fd = None
    interactive = source.isatty()
    if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
        # A pipe, a socket or a terminal: a chunk ends where the input pauses (see translate_iterable's `ready`).
        source = _PipeReader(fd)
        ready = source.ready
    if interactive and translator.options.chunk_size is None:
        translator = copy.copy(translator)
        translator.options = translator.options.replace(chunk_size=1)
    first_line = resume.first_line if resume is not None else 1
    lines = read_text_lines(source, name, first=first_line)
    outputs = translator.translate_iterable(lines, prefixes=prefixes, report=report, ready=ready, resume=resume,
                                            progress=progress)  # fmt: skip
    return write_translations(outputs, sink, first_line)


def write_translations(outputs: Iterator, sink: BinaryIO, first_line: int = 1) -> int:
    """Writes the outputs a translator's iterator gives (lines from `first_line`) into `sink` as they come, each
    flushed, and returns how many; a stop (`TranslationInterrupted`) is `translate_stream`'s."""
    count = first_line - 1
    try:
        while True:
            with interruptible():
                output = next(outputs, _END)
            if output is _END:
                return count - first_line + 1
            with held():  # a stop waits until the line is written and counted, however deep the nesting
                count = _write(sink, [output], count)
    except TranslationInterrupted as stop:
        if outputs.gi_frame is not None:  # stopped at a yield: the translator gives its chunk's outputs
            try:
                outputs.throw(stop)
            except TranslationInterrupted:
                pass
        # `done` from line `first`: those past the lines written here (one yielded but not written, say) are written.
        done = stop.done if stop.first is None else stop.done[max(0, count + 1 - stop.first) :]
        stop.written = _write(sink, done, count) - first_line + 1
        raise


_END = object()


def _write(sink: BinaryIO, outputs: list, count: int) -> int:
    """Writes and flushes the outputs of lines `count + 1`, ...; returns the lines written in all."""
    sink.write("".join(format_output(output, count + i) for i, output in enumerate(outputs)).encode("utf-8"))
    sink.flush()
    return count + len(outputs)


class Recorded:
    """A resumable output's `F.partial` (`system.outputs.ResumableOutput`), to append to, that records in `F.resume`
    what the controls and the markup did to each line (`report`, lines numbered `offset` + output line) before the
    line is written: a rerun that keeps the line reports it again, and its exit status is the whole run's. `lines`:
    the lines in `F.partial` already."""

    def __init__(self, output, report: ControlReport, offset: int, lines: int):
        self.file, self.output, self.report, self.offset, self.lines = output.open(), output, report, offset, lines
        self.seen, self.pending = 0, []  # the report's size when last read; its lines not recorded yet

    def write(self, data: bytes) -> int:
        self.lines += data.count(b"\n") // self.output.lines_per_input
        report, low, high = self.report, self.offset, self.offset + self.lines
        noted = (*report.unmet, *report.failed, *report.unrestored)
        if len(noted) != self.seen:
            self.seen = len(noted)
            self.pending = [line for line in set(noted) if line > low and line - low not in self.output.outcomes]
        due = {line - low: report.outcome(line) for line in self.pending if line <= high}
        if due:
            self.output.record_outcomes(due)
            self.pending = [line for line in self.pending if line > high]
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


class LineLimit:
    """The first `lines` lines of a binary file (a shard of it), read as `read_text_lines` reads them."""

    def __init__(self, stream: BinaryIO, lines: int):
        self.stream, self.left = stream, lines

    def readline(self, limit: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        line = self.stream.readline(limit)
        if not line or line.endswith(b"\n"):
            self.left -= 1
        return line

    def isatty(self) -> bool:
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stream.close()


def skip_lines(stream: BinaryIO, count: int) -> int:
    """Reads `count` lines of `stream` (as `read_text_lines` counts them) and drops them; returns how many it read."""
    skipped = 0
    while skipped < count:
        line = stream.readline(MAX_LINE_BYTES)
        while line and not line.endswith(b"\n"):  # the rest of a long line
            more = stream.readline(MAX_LINE_BYTES)
            if not more:
                break
            line = more
        if not line:
            break
        skipped += 1
    return skipped


__all__ = [
    "MAX_LINE_BYTES",
    "LineLimit",
    "Recorded",
    "count_lines",
    "has_tab",
    "read_text_lines",
    "skip_lines",
    "translate_stream",
    "write_translations",
]
