"""Batched and streamed translation with `generate()` (the paper's search by default, §6.1): a list of sentences,
an iterable of any length a chunk at a time, or a byte stream (a file, a pipe, standard input) line by line.

Any text gets exactly one single-line translation, in input order (the translation pipeline's rules,
`pipeline_vaswani.encode_source`); invalid UTF-8 becomes U+FFFD with a warning naming the line.
"""

from __future__ import annotations

import codecs
import itertools
import logging
import os
import select
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import BinaryIO

import torch

from vaswani_mt.model.pipeline_vaswani import default_max_source_tokens, encode_source, single_line

logger = logging.getLogger(__name__)


def _translate_batches(
    model, tokenizer, sentences: Sequence[str], batch_size: int, limit: int, generate_kwargs: dict,
    first_line: int = 1, on_batch=None,
) -> list[str]:  # fmt: skip
    """`translate` of `sentences`, numbered from `first_line` in warnings; `on_batch(n)` after each batch of n."""
    results: list[str] = [""] * len(sentences)
    blank = [i for i, sentence in enumerate(sentences) if not sentence.strip()]
    if blank:  # nothing to translate: the line stays empty, so output lines still match input lines
        logger.warning(
            "%d empty or whitespace-only lines left empty (first: line %d)", len(blank), first_line + blank[0]
        )
    # Longest first, so that a batch holds sentences of similar length (little padding); the order of the results
    # is the input order, and a sentence's translation does not depend on its batch (tests/test_hostile_input.py).
    order = sorted(
        (i for i, sentence in enumerate(sentences) if sentence.strip()), key=lambda i: len(sentences[i]), reverse=True
    )
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        encoded = [encode_source(tokenizer, sentences[i], limit, where=f"line {first_line + i}: ") for i in chunk]
        batch = tokenizer.pad({"input_ids": encoded}, return_tensors="pt").to(model.device)
        output = model.generate(**batch, **generate_kwargs)
        for i, text in zip(chunk, tokenizer.batch_decode(output, skip_special_tokens=True), strict=True):
            results[i] = single_line(text)  # one line, whoever reads it
        if on_batch is not None:
            on_batch(len(chunk))
    return results


def _progress_bar(total: int | None, unit: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="translating", unit=unit, file=sys.stderr)


@torch.no_grad()
def translate(
    model,
    tokenizer,
    sentences: Sequence[str],
    batch_size: int = 32,
    progress: bool = False,
    max_source_tokens: int | None = None,
    **generate_kwargs,
) -> list[str]:
    """Translates `sentences` in batches of similar length (order preserved) with `model.generate`.

    Without `generate_kwargs` this is the paper's search (§6.1): beam 4, GNMT alpha 0.6, input length + 50. Any
    text gets exactly one translation, a single line: empty lines stay empty; a source longer than
    `max_source_tokens` (default: `config.max_position_embeddings`) is cut with a warning; characters outside the
    vocabulary are named in a warning, lone surrogates become U+FFFD (the translation pipeline's rules,
    `pipeline_vaswani.encode_source`); a line break in a translation becomes a space.
    """
    limit = max_source_tokens or default_max_source_tokens(model, tokenizer)
    model.eval()
    bar = _progress_bar(sum(1 for sentence in sentences if sentence.strip()), "sent") if progress else None
    on_batch = None if bar is None else bar.update
    try:
        return _translate_batches(model, tokenizer, sentences, batch_size, limit, generate_kwargs, on_batch=on_batch)
    finally:
        if bar is not None:
            bar.close()


@torch.no_grad()
def translate_chunks(
    model,
    tokenizer,
    lines: Iterable[str],
    batch_size: int = 32,
    chunk_size: int = 512,
    progress: bool = False,
    max_source_tokens: int | None = None,
    ready: Callable[[], bool] | None = None,
    **generate_kwargs,
) -> Iterator[list[str]]:
    """`translate` of an iterable of any length, lazily: reads `chunk_size` lines, translates them (sorted by length
    into batches of `batch_size`), yields their translations in input order, then reads the next chunk. Memory is
    that of one chunk however many lines there are; warnings number the lines from 1 across chunks.

    `ready()`, when given, says whether another line can be read without waiting: a chunk then ends early when the
    input has nothing more for now, so a program that writes a line into a pipe and waits gets its answer."""
    if batch_size < 1 or chunk_size < 1:
        raise ValueError(f"batch_size and chunk_size must be at least 1, got {batch_size} and {chunk_size}")
    limit = max_source_tokens or default_max_source_tokens(model, tokenizer)
    model.eval()
    bar = _progress_bar(None, "line") if progress else None
    on_batch = None if bar is None else bar.update
    lines, done = iter(lines), 0
    try:
        while chunk := _next_chunk(lines, chunk_size, ready):
            yield _translate_batches(model, tokenizer, chunk, batch_size, limit, generate_kwargs, done + 1, on_batch)
            if bar is not None:
                bar.update(sum(1 for line in chunk if not line.strip()))  # blank lines count as done too
            done += len(chunk)
    finally:
        if bar is not None:
            bar.close()


def _next_chunk(lines: Iterator[str], size: int, ready: Callable[[], bool] | None) -> list[str]:
    """Up to `size` lines; with `ready`, the first may wait for input, the others are taken only while it is there."""
    if ready is None:
        return list(itertools.islice(lines, size))
    chunk = list(itertools.islice(lines, 1))
    while chunk and len(chunk) < size and ready():
        line = next(lines, None)
        if line is None:
            break
        chunk.append(line)
    return chunk


class _PipeReader:
    """`readline` over a pipe, a socket or a terminal's file descriptor that can also tell, without blocking,
    whether a line is there (`ready`): what `translate_stream` needs to answer each line a program writes and waits
    on, while still batching lines that arrive together."""

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


# Bytes read of one input line at most: the model sees the first `max_source_tokens` tokens of a line, 32 characters
# each at most (pipeline_vaswani._CHARS_PER_TOKEN), so 1 MiB is more than it can use; the rest of the line is skipped
# without being held in memory, and a stream without line ends cannot fill the memory.
MAX_LINE_BYTES = 1 << 20


def read_text_lines(stream: BinaryIO, name: str = "<stdin>", max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of a byte stream as text, lazily, one per "\n" (a final line without one counts; "\r\n" ends a
    line too; a UTF-8 byte-order mark at the start is dropped). Never fails on content: bytes that are not UTF-8
    become U+FFFD and a line longer than `max_line_bytes` is cut there, each with a warning naming `name` and the
    line; other Unicode line breaks (U+2028, form feed, ...) are text inside the line."""
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


def translate_stream(
    model,
    tokenizer,
    source: BinaryIO,
    sink: BinaryIO,
    name: str = "<stdin>",
    batch_size: int = 32,
    chunk_size: int | None = None,
    progress: bool = False,
    **generate_kwargs,
) -> int:
    """Translates the lines of the byte stream `source` (`read_text_lines`) into `sink`, UTF-8, one line per line in
    input order, and returns how many. Reads and translates `chunk_size` lines at a time (default 16 batches; one
    line from a terminal, so that each typed line is answered) and flushes each chunk's lines as they are done:
    memory stays flat however long the input, and a reader downstream sees output while input still arrives. From
    a pipe, a chunk also ends where the input pauses: a program that writes a line and waits for its translation
    gets it, however large the chunk."""
    if chunk_size is None:
        chunk_size = 1 if source.isatty() else 16 * batch_size
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
    chunks = translate_chunks(model, tokenizer, lines, batch_size, chunk_size, progress, ready=ready, **generate_kwargs)
    for translations in chunks:
        sink.write("".join(f"{text}\n" for text in translations).encode("utf-8"))
        sink.flush()
        count += len(translations)
    return count


__all__ = ["MAX_LINE_BYTES", "read_text_lines", "translate", "translate_chunks", "translate_stream"]
