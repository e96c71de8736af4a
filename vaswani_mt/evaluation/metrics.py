"""Translation and BLEU: batched `generate()` with the paper's defaults (§6.1), sacreBLEU through `evaluate`, and
the paper's own scoring (tokenized BLEU with compound splitting) beside it.

`evaluate.load("sacrebleu")` fetches its script from the Hugging Face Hub, which is not reachable offline, so the
metric is defined here as an `evaluate.Metric` around the sacreBLEU library: the same computation and the same
signature string, with no download.
"""

from __future__ import annotations

import codecs
import functools
import itertools
import logging
import os
import re
import select
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import BinaryIO

import datasets
import evaluate
import sacrebleu
import torch

from vaswani_mt.inference.loading import ModelFolderError, load_for_inference  # re-exported: the scripts' import

logger = logging.getLogger(__name__)


class SacreBLEU(evaluate.Metric):
    """Corpus BLEU with sacreBLEU's defaults (13a tokenisation, exp smoothing), one reference per sentence."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="sacreBLEU corpus BLEU (Post, 2018)",
            citation="@inproceedings{post-2018-call, title={A Call for Clarity in Reporting {BLEU} Scores}}",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references):
        bleu = sacrebleu.metrics.BLEU()
        streams = [list(stream) for stream in zip(*references, strict=True)]
        result = bleu.corpus_score(list(predictions), streams)
        chrf = sacrebleu.metrics.CHRF()
        return {
            "score": result.score,
            "signature": str(bleu.get_signature()),
            "bp": result.bp,
            "precisions": result.precisions,
            "sys_len": result.sys_len,
            "ref_len": result.ref_len,
            "chrf": chrf.corpus_score(list(predictions), streams).score,
        }


def bleu(predictions: Sequence[str], references: Sequence[str]) -> dict:
    """sacreBLEU of `predictions` against one reference each; `score`, `signature`, `chrf` and the details."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} translations but {len(references)} references")
    return SacreBLEU().compute(predictions=list(predictions), references=[[r] for r in references])


COMPOUND_SPLIT_LABEL = "tokenized BLEU, compound-split (tensor2tensor get_ende_bleu.sh)"
# perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' reads bytes: its \S is anything but ASCII whitespace, as here with
# re.ASCII. Both match left to right without overlap: "a-b-c" becomes "a ##AT##-##AT## b-c" (the match took the b).
_COMPOUND = re.compile(r"(\S)-(\S)", re.ASCII)


@functools.cache
def _moses_tokenizer(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


def compound_split(text: str, lang: str = "de") -> str:
    """One line as tensor2tensor's `get_ende_bleu.sh` gives it to `multi-bleu.perl`: Moses `tokenizer.perl -l LANG`
    with its default escaping (`&` -> `&amp;`, `"` -> `&quot;`, `'` -> `&apos;`, `<`, `>`, `|`, `[`, `]`), then
    every `X-Y` compound as `X ##AT##-##AT## Y`. sacremoses ports tokenizer.perl as it was before November 2018 (a
    sentence-final `Art.` or `5.` stays whole; the perl script splits it since), as in 2017: sacremoses 0.2.0 gave
    the lines of tokenizer.perl of December 2016 exactly, on 4,000 sentences of the built-in corpus and 12 hard ones."""
    tokenized = _moses_tokenizer(lang).tokenize(text, escape=True, return_str=True)
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def compound_split_bleu(predictions: Sequence[str], references: Sequence[str], lang: str = "de") -> dict:
    """The paper's BLEU (PAPER.md, "How the paper's BLEU was computed"): both sides through `compound_split`, then
    `multi-bleu.perl`'s corpus BLEU over whitespace tokens (case-sensitive, n = 1-4, no smoothing), computed by
    sacreBLEU with `tokenize="none"`. Not comparable with sacreBLEU (on newstest2014 0.7-1.5 above it).

    The script as it stood when the paper appeared (tensor2tensor, June 2017); the unicode punctuation step added to
    it in April 2018 is not applied. Returns `score`, `label`, `signature` (method and versions), `bp`,
    `precisions`, `sys_len`, `ref_len` and the split lines (`hypotheses`, `references`).
    """
    import sacremoses

    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} translations but {len(references)} references")
    hypotheses = [compound_split(text, lang) for text in predictions]
    split_references = [compound_split(text, lang) for text in references]
    metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    result = metric.corpus_score(hypotheses, [split_references])
    return {
        "score": result.score,
        "label": COMPOUND_SPLIT_LABEL,
        "signature": f"moses:{lang}|escape:yes|compound:##AT##|sacremoses:{sacremoses.__version__}|"
        f"{metric.get_signature()}",
        "bp": result.bp,
        "precisions": result.precisions,
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
        "hypotheses": hypotheses,
        "references": split_references,
    }


def score_translations(predictions: Sequence[str], references: Sequence[str], target_lang: str = "de") -> dict:
    """`bleu` (sacreBLEU, chrF) plus the paper's compound-split BLEU as `compound_split_bleu` with its
    `compound_split_signature`."""
    scores = bleu(predictions, references)
    paper = compound_split_bleu(predictions, references, target_lang)
    return {**scores, "compound_split_bleu": paper["score"], "compound_split_signature": paper["signature"]}


def _translate_batches(
    model, tokenizer, sentences: Sequence[str], batch_size: int, limit: int, generate_kwargs: dict,
    first_line: int = 1, on_batch=None,
) -> list[str]:  # fmt: skip
    """`translate` of `sentences`, numbered from `first_line` in warnings; `on_batch(n)` after each batch of n."""
    from vaswani_mt.model.pipeline_vaswani import _single_line, encode_source

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
            results[i] = _single_line(text)  # one line, whoever reads it
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
    from vaswani_mt.model.pipeline_vaswani import default_max_source_tokens

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
    from vaswani_mt.model.pipeline_vaswani import default_max_source_tokens

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


@torch.no_grad()
def token_nll(model, tokenizer, sources: Sequence[str], references: Sequence[str], batch_size: int = 64) -> float:
    """Mean negative log-likelihood (nats per target token, `</s>` included, no label smoothing) of `references`
    given `sources` under teacher forcing; `exp` of it is the perplexity. Works for any seq2seq model whose
    forward builds its decoder inputs from `labels` (ours, MarianMTModel)."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(sources), batch_size):
        batch = tokenizer(
            list(sources[start : start + batch_size]),
            text_target=list(references[start : start + batch_size]),
            padding=True,
            return_tensors="pt",
        ).to(model.device)
        labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).logits
        total += float(
            torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")
        )
        count += int(labels.ne(-100).sum())
    return total / max(count, 1)


def evaluate_bleu(
    model, tokenizer, sources: Sequence[str], references: Sequence[str], *, target_lang: str = "de", **kwargs
) -> dict:
    """Translates `sources` and scores them against `references` (`score_translations`: sacreBLEU, chrF and the
    compound-split BLEU, whose Moses tokenizer takes `target_lang`); the result also holds the `translations`."""
    translations = translate(model, tokenizer, sources, **kwargs)
    return {**score_translations(translations, references, target_lang), "translations": translations}


__all__ = [
    "COMPOUND_SPLIT_LABEL",
    "MAX_LINE_BYTES",
    "ModelFolderError",
    "SacreBLEU",
    "bleu",
    "compound_split",
    "compound_split_bleu",
    "evaluate_bleu",
    "load_for_inference",
    "read_text_lines",
    "score_translations",
    "token_nll",
    "translate",
    "translate_chunks",
    "translate_stream",
]
