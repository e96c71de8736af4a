"""Translation of byte streams (a file, a pipe, standard input) line by line: `read_text_lines` reads any bytes as
text lines, `translate_stream` writes one translation per line as each chunk is done (`translate.translate_chunks`).
Under `stopping_on_signals` (the commands), SIGINT and SIGTERM stop a translation with every line translated so far
written, in order.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import itertools
import logging
import os
import select
import signal
import stat
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from vaswani_mt.inference.controls import ControlReport
from vaswani_mt.inference.translate import (
    Sampling,
    TranslationInterrupted,
    format_nbest,
    format_translation,
    translate_chunks,
)

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


def read_text_lines(stream: BinaryIO, name: str = "<stdin>", max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of a byte stream as text, lazily, one per "\n" or "\r\n" (a leading UTF-8 BOM dropped; other
    Unicode line breaks are text). Never fails on content: bytes that are not UTF-8 become U+FFFD and a line longer
    than `max_line_bytes` is cut there, each with a warning naming `name` and the line."""
    decoder = codecs.getincrementaldecoder("utf-8")
    for number in itertools.count(1):
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


class _Signals:
    """What `stopping_on_signals` installs: the first SIGINT or SIGTERM is held (`signum`) until the program is in an
    `interruptible` block, where it raises `TranslationInterrupted` at once; a second one ends the process at once,
    by that signal (as if it had not been caught)."""

    def __init__(self):
        self.signum: int | None = None
        self.raised, self.open = False, 0

    def handle(self, signum, frame):
        if self.signum is not None:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        self.signum = signum
        if self.open:
            self.stop()

    def stop(self):
        self.raised = True
        raise TranslationInterrupted(self.signum)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        if self.signum is not None and not self.raised:
            self.stop()
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1


SIGNALS = (signal.SIGINT, signal.SIGTERM)
_signals: _Signals | None = None  # the handler of the `stopping_on_signals` block that runs


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """While the block runs, the first SIGINT or SIGTERM raises `TranslationInterrupted` (128 + its `signum` is the
    shell's exit status for it: 130, 143): at once within an `interruptible` block (translating, loading), else at
    the start of the next one or at the end of this block, so that no output is cut and no count lost. A second
    signal ends the process at once. A signal ignored when the block starts (`nohup`, a background job) stays
    ignored; the previous handlers come back after the block. Main thread only: elsewhere (a notebook's worker
    thread) nothing changes."""
    global _signals
    if threading.current_thread() is not threading.main_thread() or _signals is not None:
        yield
        return
    handler = _Signals()
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    caught = [signum for signum, old in previous.items() if old is not signal.SIG_IGN]
    _signals = handler
    for signum in caught:
        signal.signal(signum, handler.handle)
    try:
        yield
        if handler.signum is not None and not handler.raised:  # held to the end
            handler.stop()
    finally:
        for signum in caught:
            signal.signal(signum, previous[signum])
        _signals = None


def interruptible() -> contextlib.AbstractContextManager:
    """Within `stopping_on_signals`, a block that a signal stops at once: one that loses nothing when stopped
    anywhere (translating: `TranslationInterrupted.done` keeps what is done). Elsewhere it does nothing."""
    return _signals.interruptible() if _signals is not None else contextlib.nullcontext()


def translate_stream(
    model,
    tokenizer,
    source: BinaryIO,
    sink: BinaryIO,
    name: str = "<stdin>",
    batch_size: int | None = 32,
    chunk_size: int | None = None,
    progress: bool = False,
    *,
    nbest: int | None = None,
    max_tokens: int | None = None,
    sampling: Sampling | None = None,
    constraints: str | None = None,
    target_prefixes: Iterable[str] | None = None,
    block: Sequence[str] = (),
    disable_unk: bool = False,
    report: ControlReport | None = None,
    **generate_kwargs,
) -> int:
    """Translates the lines of the byte stream `source` (`read_text_lines`) into `sink`, UTF-8, one line per line in
    input order, and returns how many. Works `chunk_size` lines at a time (default 16 batches, or 1024 lines with
    `max_tokens`; one line from a terminal) and flushes each chunk: memory stays flat, and output flows while input
    still arrives. From a pipe, a chunk also ends where the input pauses.

    With `nbest`, each line gets `nbest` lines in Marian's n-best format (`format_nbest`), IDs from 0; the other
    options as in `translate_chunks`. On `TranslationInterrupted` (`stopping_on_signals`) it writes the translations of
    the chunk in progress that its `done` holds, flushes, and raises it again with `written`: the lines in `sink`.
    `model` may also be a `CTranslate2Model` (export/ctranslate2.py), which translates the chunks itself."""
    if chunk_size is None:
        chunk_size = 1 if source.isatty() else 1024 if max_tokens is not None else 16 * (batch_size or 32)
    ready = None
    try:
        fd = source.fileno()
    except (AttributeError, OSError):  # an in-memory stream: everything is there already
        fd = None
    if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
        # A pipe, a socket or a terminal: a chunk ends where the input pauses (see translate_chunks' `ready`).
        source = _PipeReader(fd)
        ready = source.ready
    count = 0
    lines = read_text_lines(source, name)
    # A model with a `translate_chunks` of its own translates itself (export.ctranslate2.CTranslate2Model)
    own = getattr(model, "translate_chunks", None)
    chunker = own if own is not None else functools.partial(translate_chunks, model, tokenizer)
    chunks = chunker(lines, batch_size, chunk_size, progress, ready=ready, nbest=nbest, max_tokens=max_tokens,
                     sampling=sampling, constraints=constraints, target_prefixes=target_prefixes, block=block,
                     disable_unk=disable_unk, report=report, **generate_kwargs)  # fmt: skip
    try:
        while True:
            with interruptible():  # a stop while writing waits for the write's end
                translations = next(chunks, None)
            if translations is None:
                return count
            count = _write(sink, translations, count, nbest)
    except TranslationInterrupted as stop:
        stop.written = _write(sink, stop.done, count, nbest)
        raise


def _write(sink: BinaryIO, translations: list, count: int, nbest: int | None) -> int:
    """Writes and flushes the translations of lines `count + 1`, ...; returns the lines written in all."""
    if nbest is None:  # an `AlignedTranslation` (with alignments) is written with its alignment, Marian's way
        text = "".join(f"{format_translation(translation)}\n" for translation in translations)
    else:
        text = "".join(format_nbest(count + i, hypotheses) for i, hypotheses in enumerate(translations))
    sink.write(text.encode("utf-8"))
    sink.flush()
    return count + len(translations)


__all__ = [
    "MAX_LINE_BYTES",
    "TranslationInterrupted",
    "count_lines",
    "interruptible",
    "read_text_lines",
    "stopping_on_signals",
    "translate_stream",
]
