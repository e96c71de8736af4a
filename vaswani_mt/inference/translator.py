"""One translator, one path: `Translator(model, tokenizer, options).translate(lines)` or `.translate_iterable(lines)`,
in input order, as CTranslate2's `Translator.translate_batch` / `translate_iterable`.

What every line gets, whatever the backend (backends.py) and the options (options.py), is written here once:
exactly one single-line translation per input line (`pipeline_vaswani.encode_source`'s rules: a blank line stays
blank, a long source is cut with a warning), batches of similar length (or by token budget), per-line controls
(terms, prefixes) checked and reported (`ControlReport`), then the stages after the search, alignments and markup.
What the iterator yields, and what an interrupt leaves (`TranslationInterrupted`), is always the final output.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from vaswani_mt.inference.alignments import AlignedTranslation, empty_aligned
from vaswani_mt.inference.backends import Backend, Batch, Search, TorchBackend
from vaswani_mt.inference.batching import token_budget_batches
from vaswani_mt.inference.controls import ControlReport, LineControls, blocked_ids, split_constrained_line
from vaswani_mt.inference.markup import put_back, take_out_markup
from vaswani_mt.inference.options import Hypothesis, TranslationOptions
from vaswani_mt.model.pipeline_vaswani import encode_source
from vaswani_mt.system.signals import TranslationInterrupted

logger = logging.getLogger(__name__)


class Resume(NamedTuple):
    """Where a stopped run left off: the number of the first line read (`first_line`, from 1: warnings, the report
    and n-best IDs count from it) and the outputs of lines after it that are already `done` (`{line number: output}`,
    `TranslationInterrupted.later`): those are yielded as they are, not translated again. `tabbed`: a line of the
    input this run does not read (in a finished chunk skipped, or another shard's) has a tab, so constrained input
    that has none here is not warned about."""

    first_line: int = 1
    done: Mapping[int, object] = {}
    tabbed: bool = False


def load_backend(model, tokenizer=None, options: TranslationOptions | None = None) -> Backend:
    """The backend of `model`: a folder (or Hub id) of ours, several (an ensemble), a CTranslate2 export folder, our
    model or ensemble with its `tokenizer`, or a backend already made; at `options.compute_type` and
    `options.threads`. A folder that cannot serve raises `ModelFolderError`, one line."""
    from vaswani_mt.inference.ctranslate2 import CTranslate2Model, load_ctranslate2
    from vaswani_mt.inference.loading import is_ctranslate2_folder

    options = options or TranslationOptions()
    folders = [str(model)] if isinstance(model, (str, Path)) else list(model) if isinstance(model, list) else None
    if folders and is_ctranslate2_folder(folders[0]):
        return load_ctranslate2(folders[0], options.compute_type, models=len(folders), threads=options.threads)
    if options.threads is not None:
        import torch

        torch.set_num_threads(options.threads)
    if isinstance(model, (TorchBackend, CTranslate2Model)):
        return model
    if folders:
        from vaswani_mt.inference.ensemble import load_ensemble

        loaded, tokenizer = load_ensemble(folders, compute_type=options.compute_type or "float32")
        return TorchBackend(loaded, tokenizer, name=" + ".join(folders))
    if tokenizer is None:
        raise ValueError("a model object needs its tokenizer: Translator(model, tokenizer, options)")
    return TorchBackend(model, tokenizer, options.compute_type or "float32")


class Translator:
    """Translates lines with one model and one `TranslationOptions` (or its fields as keywords).

    `model`: anything `load_backend` takes. `translate(lines)` gives a list, `translate_iterable(lines)` an iterator,
    both in input order: per line a `str` (with `alignments`, an `AlignedTranslation`; with `markup`, the tags put
    back) or, with `nbest`, a list of `Hypothesis`. Per-line controls come with the lines: `terms` (a list of terms
    per line, each its target text or with its source phrase, terms.py; without it, with `options.constraints`, each
    line is fairseq's `source<TAB>term<TAB>...`) and
    `prefixes` (a target prefix per line, "" for none), read along with them; `report` gets what the controls did.
    With `markup`, a line that is a `directives.Formatted` has its own format directives (a gettext entry's flags).
    """

    def __init__(self, model, tokenizer=None, options: TranslationOptions | None = None, **fields):
        self.options = options.replace(**fields) if options is not None else TranslationOptions(**fields)
        self.backend = load_backend(model, tokenizer, self.options)
        self.tokenizer = self.backend.tokenizer
        self.options.check(self.backend.facts)
        # What the search runs with: markup aligns (hard) to put the tags back.
        self._search = self.options.replace(alignments="hard", markup=None) if self.options.markup else self.options
        # The model's own bans (an imported OPUS-MT model's `<pad>`, its decoder start) stay beside the user's.
        bans = getattr(self.backend.generation_config, "bad_words_ids", None)
        blocked = blocked_ids(self.tokenizer, self.options.block, self.options.disable_unk, model_bans=bans)
        self._request = Search(self._search, *blocked)

    def translate(self, lines: Sequence[str], *, terms: Sequence | None = None, prefixes: Sequence[str] | None = None,
                  report: ControlReport | None = None, progress: bool = False) -> list:  # fmt: skip
        """The translations of `lines`, sorted into batches all together (one chunk)."""
        for name, value in (("terms", terms), ("prefixes", prefixes)):
            if value is not None and len(value) != len(lines):
                raise ValueError(f"{len(value)} {name} for {len(lines)} lines: give one per line")
        chunk = self.options.replace(chunk_size=max(1, len(lines)))
        total = len(lines) if progress else None  # the bar counts blank lines as done too
        return list(self._iterate(chunk, lines, (terms, prefixes), report, None, Resume(), total))

    def translate_iterable(self, lines: Iterable[str], *, terms: Iterable | None = None,
                           prefixes: Iterable[str] | None = None, report: ControlReport | None = None,
                           ready: Callable[[], bool] | None = None, resume: Resume | None = None,
                           progress: bool = False) -> Iterator:  # fmt: skip
        """The translations of `lines`, lazily, `options.chunk_lines()` lines at a time: memory is one chunk's.
        `ready()`, when given, says whether another line can be read without waiting (a chunk ends where the input
        pauses). `resume`: where a stopped run left off (`Resume`)."""
        return self._iterate(self.options, lines, (terms, prefixes), report, ready, resume or Resume(),
                             0 if progress else None)  # fmt: skip

    def _iterate(self, options, lines, per_line: tuple, report, ready, resume, progress: int | None) -> Iterator:
        """`translate_iterable`; `per_line`: (terms, prefixes); `progress`: None, or the bar's total (0: unknown)."""
        lines = iter(lines)
        terms, prefixes = (None if x is None else iter(x) for x in per_line)
        tabbed = terms is None and self.options.constraints is not None
        controls = None
        if tabbed or terms is not None or prefixes is not None:
            order = self.options.constraints or "unordered"
            use_terms = tabbed or terms is not None
            controls = LineControls([] if use_terms else None, [] if prefixes is not None else None, order, report)
            if prefixes is not None:
                self.options.check(self.backend.facts, prefixes=True)
        size, first_line = options.chunk_lines(), resume.first_line
        done = first_line - 1
        with _progress_bar(progress) as bar:
            while chunk := next_chunk(lines, size, ready):
                if controls is not None:
                    chunk = _read_controls(chunk, controls, tabbed, terms, prefixes, done + 1)
                outputs = self._chunk(chunk, done + 1, controls, bar, resume.done, report)
                try:
                    yield from outputs
                except TranslationInterrupted as stop:  # raised here, or thrown in by the reader: the chunk is done
                    stop.done, stop.first = outputs, done + 1
                    raise
                done += len(chunk)
        if tabbed and not controls.tabbed and not resume.tabbed and done >= first_line:
            from vaswani_mt.inference.controls import warn_no_tabs

            warn_no_tabs(done - first_line + 1)

    def _chunk(self, sentences: list[str], first_line: int, controls: LineControls | None, bar,
               stored: Mapping[int, object], report: ControlReport | None = None) -> list:  # fmt: skip
        """The final outputs of one chunk, its lines numbered from `first_line`; those `stored` has are its own;
        `report` gets the lines whose markup could not be put back."""
        plans = None
        if self.options.markup:
            formats = [getattr(line, "formats", None) for line in sentences]  # a `Formatted` line's own
            plans = take_out_markup(sentences, first_line, formats, xml=self.options.markup == "xml")
            if controls is not None and controls.terms is not None:  # forced: the markup put back wraps them whole
                for plan, terms, sources in zip(plans, controls.terms, controls.sources, strict=False):
                    plan.terms, plan.sources = list(terms), list(sources)
        texts = [plan.text for plan in plans] if plans is not None else sentences
        nbest = self.options.nbest
        results: list = [""] * len(texts) if nbest is None else [[Hypothesis("", 0.0, 0.0)] * nbest for _ in texts]
        blank = [i for i, text in enumerate(texts) if not text.strip()]
        if blank:  # nothing to translate: the line stays empty, so output lines still match input lines
            logger.warning("%d empty or whitespace-only lines left empty (first: line %d)", len(blank),
                           first_line + blank[0])  # fmt: skip
        kept = {i: stored[first_line + i] for i in range(len(texts)) if first_line + i in stored}
        todo = [i for i, text in enumerate(texts) if text.strip() and i not in kept]
        limit = self.options.max_source_tokens or self.backend.max_source_tokens
        encoded = {i: encode_source(self.tokenizer, texts[i], limit, where=f"line {first_line + i}: ") for i in todo}
        prepared: dict = {}
        if controls is not None:  # each line's terms and prefix checked against its own length limit
            controls.refuse_blank(blank, first_line)
            prepared = controls.prepare(self.backend, self.tokenizer, encoded, first_line, self._request)
            todo = [i for i in todo if i in encoded]
        finished = set(range(len(texts))) - set(todo)  # blank and refused lines: their results are final
        try:
            for rows in self._batches(texts, todo, encoded, first_line):
                request = self._request if controls is None else self._request._replace(
                    **controls.batch_controls(rows, prepared))  # fmt: skip
                batch = Batch([encoded[i] for i in rows], [first_line - 1 + i for i in rows],
                              [texts[i] for i in rows], request)  # fmt: skip
                found, met = self.backend.search(batch, self._search)
                for i, result in zip(rows, found, strict=True):
                    results[i] = result
                if controls is not None:
                    controls.record(rows, met, first_line, results)
                finished.update(rows)
                if bar is not None:
                    bar.update(len(rows))
        except TranslationInterrupted as stop:
            lead = next((i for i in range(len(texts)) if i not in finished), len(texts))
            final = [kept[i] if i in kept else self._final(texts, plans, results, i, (first_line, report))
                     for i in range(len(texts))]  # fmt: skip
            stop.done, stop.first = final[:lead], first_line
            stop.later = {first_line + i: final[i] for i in sorted(finished) if i > lead}
            raise
        if bar is not None:
            bar.update(len(blank))
        return [kept[i] if i in kept else self._final(texts, plans, results, i, (first_line, report))
                for i in range(len(texts))]  # fmt: skip

    def _final(self, texts: list[str], plans, results: list, i: int, where: tuple = (1, None)):
        """Line i's output after the stages: an empty aligned translation for a blank or refused line, then the
        markup put back; where that fails, the line is its source, reported by number (`where`: the chunk's first
        line and the `ControlReport`, or None) in one line: one line's failure is that line's."""
        result, kind = results[i], self._search.alignments
        if kind is not None:
            if isinstance(result, str) and not isinstance(result, AlignedTranslation):
                result = empty_aligned(texts[i], kind)
            elif isinstance(result, list) and not isinstance(result[0].text, AlignedTranslation):
                result = [h._replace(text=empty_aligned(texts[i], kind)) for h in result]
        if plans is None:
            return result
        output, problem = put_back(plans[i], result)
        first_line, report = where
        if problem == "directives":
            logger.warning("line %d: format directives could not all be placed: put at the end, in source order",
                           first_line + i)  # fmt: skip
        elif problem is not None:
            logger.error("line %d: markup not put back (%s): written as its source", first_line + i, problem)
            if report is not None:
                report.unrestored[first_line + i] = problem
        return output

    def _batches(self, texts: list[str], todo: list[int], encoded: dict, first_line: int) -> list[list[int]]:
        """The lines `todo` in batches: by `max_tokens`, or longest first `batch_size` at a time (the backend's
        size and length where the options give none), so that a batch holds sentences of similar length."""
        options, facts = self.options, self.backend.facts
        if options.max_tokens is None:
            rows = options.batch_size or facts.batch_size
            order = sorted(todo, key=lambda i: len(encoded[i] if facts.by_tokens else texts[i]), reverse=True)
            return [order[start : start + rows] for start in range(0, len(order), rows)]
        lengths = [len(encoded[i]) for i in todo]
        batches = [[todo[k] for k in batch]
                   for batch in token_budget_batches(lengths, options.max_tokens, options.batch_size)]  # fmt: skip
        for batch in batches:
            if len(encoded[batch[0]]) > options.max_tokens:
                logger.warning("line %d: %d source tokens, more than max_tokens=%d: translated in a batch of its own",
                               first_line + batch[0], len(encoded[batch[0]]), options.max_tokens)  # fmt: skip
        return batches


def _read_controls(chunk: list[str], controls: LineControls, tabbed: bool, terms, prefixes, first: int) -> list[str]:
    """A chunk's sources, with its lines' terms (split from tabbed lines, or read along) and prefixes put into
    `controls`; ValueError where the terms or prefixes end before the lines."""
    if tabbed:
        controls.tabbed += sum("\t" in line for line in chunk)
        chunk, given = map(list, zip(*map(split_constrained_line, chunk), strict=True))
        controls.read_terms(given)
    elif terms is not None:
        controls.read_terms([list(t) for t in itertools.islice(terms, len(chunk))])
        if len(controls.terms) < len(chunk):
            raise ValueError(f"the terms end before input line {first + len(controls.terms)}")
    if prefixes is not None:
        controls.prefixes = list(itertools.islice(prefixes, len(chunk)))
        if len(controls.prefixes) < len(chunk):
            raise ValueError(f"the target prefixes end before input line {first + len(controls.prefixes)}")
    return chunk


def next_chunk(lines: Iterator[str], size: int, ready: Callable[[], bool] | None) -> list[str]:
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


@contextlib.contextmanager
def _progress_bar(total: int | None) -> Iterator:
    """The "translating" bar on stderr, of `total` lines (0: unknown; None: no bar). While it is drawn, log records
    reach the console through the bar's `write`, which clears it, prints the record on a line of its own and draws
    the bar again below."""
    if total is None:
        yield None
        return
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = tqdm(total=total or None, desc="translating", unit="line", file=sys.stderr)
    # The root logger (ours and the payload's records reach stderr through it) and transformers', which does not
    # pass its records on to the root.
    loggers = [logging.getLogger(), logging.getLogger("transformers")]
    try:
        with logging_redirect_tqdm(loggers, tqdm_class=type(bar)):
            yield bar
    finally:
        bar.close()


__all__ = ["Resume", "TranslationInterrupted", "Translator", "load_backend", "next_chunk"]
