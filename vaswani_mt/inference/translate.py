"""Batched translation with `generate()` (the paper's search by default, §6.1): a list of sentences, or an iterable
of any length a chunk at a time (byte streams: `streams.py`).

Any text gets exactly one single-line translation, in input order (`pipeline_vaswani.encode_source`'s rules).
Options, on streams too: n-best lists (`translate_nbest`, `format_nbest`), seeded sampling (`Sampling`) and
token-budget batches (`max_tokens`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.modeling_outputs import BaseModelOutput

from vaswani_mt.inference.alignments import (
    DEFAULT_METHOD,
    KINDS,
    align_outputs,
    check_method,
    empty_aligned,
    format_aligned_line,
)
from vaswani_mt.inference.batching import token_budget_batches
from vaswani_mt.inference.controls import (
    ControlReport,
    LineControls,
    block_kwargs,
    split_constrained_line,
    warn_no_tabs,
)
from vaswani_mt.model.beam_search_vaswani import gnmt_length_penalty
from vaswani_mt.model.pipeline_vaswani import default_max_source_tokens, encode_source, single_line

logger = logging.getLogger(__name__)


class TranslationInterrupted(BaseException):
    """Stops a translation where it is, as KeyboardInterrupt does (a BaseException: no `except Exception` on the way
    swallows it); `streams.stopping_on_signals` raises it on SIGINT or SIGTERM. Out of `translate`, `translate_nbest`
    or a chunk of `translate_chunks`, `done` holds the translations of the lines before the first one not translated
    yet, in input order (batches run in length order: the lines translated after that one are dropped)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.done = signum, []


class Hypothesis(NamedTuple):
    """One translation of an n-best list: its `text`, `log_prob` (log P(Y|X), EOS included) and `score`, what the
    search ranks by: `log_prob / ((5 + |Y|) / 6)^alpha` (§6.1's GNMT penalty), for any search."""

    text: str
    log_prob: float
    score: float


@dataclass(frozen=True)
class Sampling:
    """Sampling instead of search, for back-translation (Edunov et al., 2018): each token is drawn from the model's
    distribution divided by `temperature`, among the `top_k` most likely tokens (None or 0: all) and the fewest whose
    probability reaches `top_p` (1: all). Each input line draws from its own random stream, seeded by `seed` and its
    position in the input, so that its sample does not depend on its batch."""

    seed: int = 1
    top_k: int | None = None
    top_p: float = 1.0
    temperature: float = 1.0

    def __post_init__(self):
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top-k must be 0 (all tokens) or more, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if not self.temperature > 0:
            raise ValueError(f"the temperature must be above 0, got {self.temperature}")


class _SeededSampler(LogitsProcessor):
    """`Sampling` inside greedy search, by the Gumbel-max trick: `argmax(scores + G)`, with G standard Gumbel noise,
    is a draw from `softmax(scores)`. Each row's noise comes from a generator seeded by its line (transformers'
    `do_sample` draws all rows from one global generator)."""

    def __init__(self, sampling: Sampling, lines: Sequence[int]):
        warpers = [TemperatureLogitsWarper(sampling.temperature)] if sampling.temperature != 1 else []
        if sampling.top_k:
            warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1:
            warpers.append(TopPLogitsWarper(sampling.top_p))
        self.warpers = LogitsProcessorList(warpers)
        self.generators = [torch.Generator().manual_seed(_line_seed(sampling.seed, line)) for line in lines]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = self.warpers(input_ids, scores)
        uniform = torch.stack([torch.rand(scores.shape[-1], generator=g, dtype=torch.float64) for g in self.generators])
        noisy = scores + (-torch.log(-torch.log(uniform))).to(scores.device, scores.dtype)
        # Tokens left out get the lowest finite score, not -inf: at a sentence's last step PerSentenceMaxLength keeps
        # only EOS's score, and EOS must then win even where top-k or top-p left it out.
        return noisy.nan_to_num(neginf=torch.finfo(noisy.dtype).min)


def _line_seed(seed: int, line: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{line}".encode(), digest_size=8).digest(), "little")


def _sampling_kwargs(sampling: Sampling, lines: Sequence[int]) -> dict:
    """`generate()` arguments that draw one sample per row, rows numbered by their input `lines` (0-based)."""
    return {
        "num_beams": 1,
        "do_sample": False,
        "logits_processor": LogitsProcessorList([_SeededSampler(sampling, lines)]),
    }


def _nbest_search(
    model, tokenizer, batch, nbest: int, kwargs: dict, align=None
) -> tuple[list[list[Hypothesis]], object]:
    """The `nbest` best hypotheses of each row of `batch`, best first, with their log-probabilities and scores, and
    with constraints, which of them the best hypothesis of each row met (else None); `align(sequences)`, when given,
    makes their texts `AlignedTranslation`s."""
    beams = kwargs.get("num_beams") or model.generation_config.num_beams or 1
    output = model.generate(
        **batch, **kwargs, num_return_sequences=nbest, return_dict_in_generate=True, output_scores=beams > 1,
        output_logits=beams == 1,
    )  # fmt: skip
    if beams > 1:
        # Beam search's scores are log-softmax outputs; a finished beam's steps past its end are 0 here.
        steps = model.compute_transition_scores(output.sequences, output.scores, output.beam_indices)
        log_probs, scores = steps.sum(-1), output.sequences_scores
    else:
        # Greedy search's scores are processed logits (sampling noise): log-probabilities come from the raw logits.
        steps = model.compute_transition_scores(output.sequences, output.logits, normalize_logits=True)
        eos = model.generation_config.eos_token_id
        ends = torch.isin(output.sequences[:, -steps.shape[1] :], torch.tensor(eos, device=steps.device).flatten())
        kept = (ends.cumsum(-1) - ends.long()) == 0
        log_probs = steps.masked_fill(~kept, 0.0).sum(-1)
        alpha = kwargs.get("length_penalty", model.generation_config.length_penalty)
        scores = log_probs / gnmt_length_penalty(kept.sum(-1), alpha if alpha is not None else 1.0)
    if align is None:
        texts = [single_line(text) for text in tokenizer.batch_decode(output.sequences, skip_special_tokens=True)]
    else:
        texts = align(output.sequences)
    found = [
        Hypothesis(text, float(log_prob), float(score))
        for text, log_prob, score in zip(texts, log_probs.tolist(), scores.tolist(), strict=True)
    ]
    met = getattr(output, "constraints_met", None)
    lists = [found[start : start + nbest] for start in range(0, len(found), nbest)]
    return lists, None if met is None else met[::nbest]


def check_decoding_options(
    search, nbest: int | None = None, max_tokens: int | None = None, sampling: Sampling | None = None,
    controls: LineControls | None = None, **generate_kwargs,
) -> None:  # fmt: skip
    """Raises `ValueError` (one line) for options that do not go together: an n-best list longer than the beam,
    sampling with several beams or more than one translation per line, a token budget below 1, constraints or target
    prefixes without beam search. `search`: the model's generation config (its `num_beams` is the default beam), or
    the one a folder saved, read before the model loads."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    beams = generate_kwargs.get("num_beams") or search.num_beams or 1
    if controls is not None and (controls.terms is not None or controls.prefixes is not None):
        what = "constraints" if controls.terms is not None else "target prefixes"
        if sampling is not None:
            raise ValueError(f"{what} need beam search, not sampling")
        if beams <= 1:
            raise ValueError(f"{what} need beam search (num_beams > 1), not greedy search")
    if sampling is not None and beams > 1 and "num_beams" in generate_kwargs:
        raise ValueError(f"sampling draws one translation per line with one beam, not num_beams={beams}")
    if nbest is None:
        return
    if nbest < 1:
        raise ValueError(f"nbest must be at least 1, got {nbest}")
    if sampling is not None and nbest > 1:
        raise ValueError(f"sampling draws one translation per line: nbest must be 1, got {nbest}")
    if sampling is None and nbest > beams:
        raise ValueError(f"nbest={nbest} is more than the beam size ({beams}): the search keeps {beams} hypotheses")


def format_nbest(line_id: int, hypotheses: Sequence[Hypothesis]) -> str:
    """Marian's n-best format, one line (ending in "\\n") per hypothesis, best first:
    `ID ||| translation ||| F0= log-probability ||| score` (with alignments, `translation ||| alignment` in its place,
    as Marian writes them)."""
    return "".join(
        f"{line_id} ||| {format_translation(h.text)} ||| F0= {h.log_prob:.6f} ||| {h.score:.6f}\n" for h in hypotheses
    )


def format_translation(translation: str) -> str:
    """A translation as a command writes it: the text, or for an `AlignedTranslation` Marian's
    `text ||| alignment`."""
    return format_aligned_line(translation) if hasattr(translation, "links") else translation


@dataclass(frozen=True)
class _Decoding:
    """How `_translate_batches` translates, in one object: rows per batch (`batch_size`, None: the token budget
    alone), the longest source (`limit` tokens), `generate()`'s keywords, and the options of `translate`."""

    batch_size: int | None
    limit: int
    generate_kwargs: dict
    nbest: int | None = None
    max_tokens: int | None = None
    sampling: Sampling | None = None
    controls: LineControls | None = None
    alignments: str | None = None  # "hard" or "soft": translations are `AlignedTranslation`s (alignments.py)
    alignment_method: str = DEFAULT_METHOD


def _decoding(model, tokenizer, *, batch_size, max_source_tokens, generate_kwargs, nbest=None, max_tokens=None,
              sampling=None, controls=None, alignments=None, alignment_method=None) -> _Decoding:  # fmt: skip
    """The checked `_Decoding` of a call of `translate`, `translate_nbest` or `translate_chunks` (ValueError, one line,
    for options that do not go together)."""
    check_decoding_options(model.generation_config, nbest, max_tokens, sampling, controls, **generate_kwargs)
    if batch_size is None and max_tokens is None:
        raise ValueError("batch_size=None (no limit on rows) needs max_tokens")
    if alignments is not None and alignments not in KINDS:
        raise ValueError(f"alignments must be one of {', '.join(KINDS)}, not {alignments!r}")
    check_method(alignment_method or DEFAULT_METHOD)
    limit = max_source_tokens or default_max_source_tokens(model, tokenizer)
    return _Decoding(batch_size, limit, generate_kwargs, nbest, max_tokens, sampling, controls, alignments,
                     alignment_method or DEFAULT_METHOD)  # fmt: skip


def _batches(sentences: Sequence[str], todo: list[int], encoded: dict[int, list[int]], decoding: _Decoding,
             first_line: int) -> list[list[int]]:  # fmt: skip
    """The lines `todo` (indices into `sentences`, `encoded` their source ids) in batches: by `max_tokens`, or
    longest first `batch_size` at a time, so that a batch holds sentences of similar length (little padding)."""
    if decoding.max_tokens is None:
        order = sorted(todo, key=lambda i: len(sentences[i]), reverse=True)
        return [order[start : start + decoding.batch_size] for start in range(0, len(order), decoding.batch_size)]
    lengths = [len(encoded[i]) for i in todo]
    batches = [[todo[k] for k in batch] for batch in token_budget_batches(lengths, decoding.max_tokens,
                                                                          decoding.batch_size)]  # fmt: skip
    for batch in batches:
        if len(encoded[batch[0]]) > decoding.max_tokens:
            logger.warning(
                "line %d: %d source tokens, more than max_tokens=%d: translated in a batch of its own",
                first_line + batch[0], len(encoded[batch[0]]), decoding.max_tokens,
            )  # fmt: skip
    return batches


@torch.no_grad()
def _encoded_once(model, tokenizer, batch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(encoder states, mask) of a single model's right-padded `batch`, for its search and its alignment pass; None
    for an ensemble (each member encodes) or left padding."""
    if hasattr(model, "members") or tokenizer.padding_side != "right":
        return None
    states = model.get_encoder()(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    return states, batch["attention_mask"]


def _translate_batch(model, tokenizer, ids: list[list[int]], lines: list[int], decoding: _Decoding, kwargs: dict,
                     sources: Sequence[str] = ()):  # fmt: skip
    """The translations of one batch (source `ids` of input `lines`, 0-based; `sources` their texts, for
    alignments): texts, or with `nbest` lists of `Hypothesis`; and with constraints, which of them each line's
    translation met (else None)."""
    batch = tokenizer.pad({"input_ids": ids}, return_tensors="pt").to(model.device)
    if decoding.sampling is not None:
        kwargs = {**kwargs, **_sampling_kwargs(decoding.sampling, lines)}
    align = None
    if decoding.alignments is not None:
        encoded = _encoded_once(model, tokenizer, batch)
        if encoded is not None:  # the search and the alignment pass share one run of the encoder
            kwargs = {**kwargs, "encoder_outputs": BaseModelOutput(last_hidden_state=encoded[0])}

        def align(sequences):
            return align_outputs(model, tokenizer, sources, ids, sequences, decoding.alignments,
                                 decoding.alignment_method, encoded=encoded)  # fmt: skip

    if decoding.nbest is not None:
        return _nbest_search(model, tokenizer, batch, decoding.nbest, kwargs, align)
    met = None
    output = model.generate(**batch, **kwargs, return_dict_in_generate="constraints" in kwargs)
    if "constraints" in kwargs:  # which constraints each translation met
        output, met = output.sequences, output.constraints_met
    if align is not None:
        return align(output), met
    return [single_line(text) for text in tokenizer.batch_decode(output, skip_special_tokens=True)], met


def _translate_batches(model, tokenizer, sentences: Sequence[str], decoding: _Decoding, first_line: int = 1,
                       on_batch: Callable[[int], object] | None = None) -> list:  # fmt: skip
    """`translate` of `sentences` (with `nbest`: `translate_nbest`), numbered from `first_line` in warnings;
    `on_batch(n)` after each batch of n; `decoding.controls`: the lines' constraints and target prefixes."""
    controls = decoding.controls
    blank = [i for i, sentence in enumerate(sentences) if not sentence.strip()]
    if blank:  # nothing to translate: the line stays empty, so output lines still match input lines
        logger.warning(
            "%d empty or whitespace-only lines left empty (first: line %d)", len(blank), first_line + blank[0]
        )
    # An empty line's n-best list: `nbest` empty translations of probability 1, so that lists stay aligned by line.
    nbest = decoding.nbest
    results: list = [""] * len(sentences) if nbest is None else [[Hypothesis("", 0.0, 0.0)] * nbest for _ in sentences]
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    if controls is not None:
        controls.refuse_blank(blank, first_line)
    where = {i: f"line {first_line + i}: " for i in todo}
    encoded = {i: encode_source(tokenizer, sentences[i], decoding.limit, where=where[i]) for i in todo}
    prepared: dict = {}
    if controls is not None:  # each line's constraints and prefix checked against its own length limit
        prepared = controls.prepare(model, tokenizer, encoded, first_line, decoding.generate_kwargs)
        todo = [i for i in todo if i in encoded]
    finished = set(range(len(sentences))) - set(todo)  # blank and refused lines: their results are final
    try:
        for chunk in _batches(sentences, todo, encoded, decoding, first_line):
            kwargs = decoding.generate_kwargs
            if controls is not None:
                kwargs = {**kwargs, **controls.batch_kwargs(chunk, prepared)}
            lines = [first_line - 1 + i for i in chunk]
            translations, met = _translate_batch(model, tokenizer, [encoded[i] for i in chunk], lines, decoding,
                                                 kwargs, [sentences[i] for i in chunk])  # fmt: skip
            for i, translation in zip(chunk, translations, strict=True):
                results[i] = translation
            if controls is not None:
                controls.record(chunk, met, first_line, results)
            finished.update(chunk)
            if on_batch is not None:
                on_batch(len(chunk))
    except TranslationInterrupted as stop:  # the lines before the first one not translated yet
        stop.done = results[: next((i for i in range(len(sentences)) if i not in finished), len(sentences))]
        raise
    if decoding.alignments is not None:  # empty and refused lines: empty translations without links
        for i, result in enumerate(results):
            if isinstance(result, str) and not hasattr(result, "links"):
                results[i] = empty_aligned(sentences[i], decoding.alignments)
            elif not isinstance(result, str) and not hasattr(result[0].text, "links"):
                results[i] = [h._replace(text=empty_aligned(sentences[i], decoding.alignments)) for h in result]
    return results


@contextlib.contextmanager
def _progress_bar(total: int | None, unit: str, show: bool) -> Iterator:
    """The "translating" bar on stderr (None unless `show`). While it is drawn, log records reach the console through
    the bar's `write`, which clears it, prints the record on a line of its own and draws the bar again below: a
    warning printed straight to stderr would start on the bar's line, after its text."""
    if not show:
        yield None
        return
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = tqdm(total=total, desc="translating", unit=unit, file=sys.stderr)
    # The root logger (ours and the payload's records reach stderr through it) and transformers', which does not
    # pass its records on to the root.
    loggers = [logging.getLogger(), logging.getLogger("transformers")]
    try:
        with logging_redirect_tqdm(loggers, tqdm_class=type(bar)):
            yield bar
    finally:
        bar.close()


@torch.no_grad()
def translate(
    model,
    tokenizer,
    sentences: Sequence[str],
    batch_size: int | None = 32,
    progress: bool = False,
    max_source_tokens: int | None = None,
    *,
    max_tokens: int | None = None,
    sampling: Sampling | None = None,
    constraints: Sequence[Sequence[str]] | None = None,
    constraint_order: str = "unordered",
    target_prefixes: Sequence[str] | None = None,
    block: Sequence[str] = (),
    disable_unk: bool = False,
    report: ControlReport | None = None,
    alignments: str | None = None,
    alignment_method: str | None = None,
    markup: str | None = None,
    **generate_kwargs,
) -> list[str]:
    """Translates `sentences` in batches of similar length (order preserved) with `model.generate`.

    Without `generate_kwargs` this is the paper's search (§6.1). Any text gets exactly one single-line translation;
    empty lines stay empty; a source longer than `max_source_tokens` is cut with a warning.

    `max_tokens`: token-budget batches (fairseq's `--max-tokens`, padding counted; at most `batch_size` rows unless
    None), the same translations as fixed-size ones. `sampling`: a sample per sentence instead of a search.

    Controls (`controls.py`): `constraints`, per sentence the terms its translation must contain (in the order given
    with `constraint_order="ordered"`); `target_prefixes`, per sentence the text its translation starts with ("" for
    none); `block`, phrases no translation may contain; `disable_unk`: no `<unk>`. `report` (`ControlReport`) gets
    the sentences (from 1) whose constraints were not met or whose controls were bad.

    `alignments` ("hard" or "soft"): each translation is an `AlignedTranslation`, a `str` (the same text) with its
    word alignment (alignments.py; `alignment_method`, default `DEFAULT_METHOD`). `markup="xml"`: inline tags,
    entities and placeholders carried through (markup.py). Without either, nothing changes.
    """
    if markup is not None:
        from vaswani_mt.inference.markup import translate_markup

        return translate_markup(
            model, tokenizer, sentences, markup, batch_size=batch_size, progress=progress,
            max_source_tokens=max_source_tokens, max_tokens=max_tokens, sampling=sampling, constraints=constraints,
            constraint_order=constraint_order, target_prefixes=target_prefixes, block=block, disable_unk=disable_unk,
            report=report, alignments=alignments, alignment_method=alignment_method, **generate_kwargs,
        )  # fmt: skip
    controls, generate_kwargs = _controls(
        tokenizer, sentences, generate_kwargs, constraints=constraints, constraint_order=constraint_order,
        target_prefixes=target_prefixes, block=block, disable_unk=disable_unk, report=report,
    )  # fmt: skip
    decoding = _decoding(model, tokenizer, batch_size=batch_size, max_source_tokens=max_source_tokens,
                         generate_kwargs=generate_kwargs, max_tokens=max_tokens, sampling=sampling,
                         controls=controls, alignments=alignments, alignment_method=alignment_method)  # fmt: skip
    return _translate_all(model, tokenizer, sentences, decoding, progress)


def _controls(
    tokenizer, sentences, generate_kwargs: dict, *, constraints=None, constraint_order="unordered",
    target_prefixes=None, block=(), disable_unk=False, report=None,
) -> tuple[LineControls | None, dict]:  # fmt: skip
    """`translate`'s controls: the `LineControls` of its constraints and prefixes (None without), and
    `generate_kwargs` with its blocked phrases and `<unk>`."""
    for name, value in (("constraints", constraints), ("target_prefixes", target_prefixes)):
        if value is not None and len(value) != len(sentences):
            raise ValueError(f"{len(value)} {name} for {len(sentences)} sentences: give one per sentence")
    generate_kwargs = {**generate_kwargs, **block_kwargs(tokenizer, block, disable_unk)}
    if constraints is None and target_prefixes is None:
        return None, generate_kwargs
    return LineControls(constraints, target_prefixes, constraint_order, report), generate_kwargs


@torch.no_grad()
def translate_nbest(
    model,
    tokenizer,
    sentences: Sequence[str],
    nbest: int,
    batch_size: int | None = 32,
    progress: bool = False,
    max_source_tokens: int | None = None,
    *,
    max_tokens: int | None = None,
    sampling: Sampling | None = None,
    **options,
) -> list[list[Hypothesis]]:
    """`translate` keeping the `nbest` best `Hypothesis`es of each sentence's search (`nbest` <= the beam size, 1
    with `sampling`), best first; `[0].text` is what `translate` gives; an empty sentence gets `nbest` empty ones
    scored 0. `options`: `translate`'s controls, `alignments` and `alignment_method` (each text an
    `AlignedTranslation`), and `generate()` keywords."""
    names = ("constraints", "constraint_order", "target_prefixes", "block", "disable_unk", "report")
    aligning = {k: options.pop(k) for k in ("alignments", "alignment_method") if k in options}
    controls, generate_kwargs = _controls(tokenizer, sentences, {k: v for k, v in options.items() if k not in names},
                                          **{k: v for k, v in options.items() if k in names})  # fmt: skip
    decoding = _decoding(model, tokenizer, batch_size=batch_size, max_source_tokens=max_source_tokens,
                         generate_kwargs=generate_kwargs, nbest=nbest, max_tokens=max_tokens, sampling=sampling,
                         controls=controls, **aligning)  # fmt: skip
    return _translate_all(model, tokenizer, sentences, decoding, progress)


def _translate_all(model, tokenizer, sentences: Sequence[str], decoding: _Decoding, progress: bool) -> list:
    """`_translate_batches` of all `sentences`, under a progress bar when `progress`."""
    model.eval()
    with _progress_bar(sum(1 for sentence in sentences if sentence.strip()), "sent", progress) as bar:
        return _translate_batches(model, tokenizer, sentences, decoding, on_batch=None if bar is None else bar.update)


@torch.no_grad()
def translate_chunks(
    model,
    tokenizer,
    lines: Iterable[str],
    batch_size: int | None = 32,
    chunk_size: int = 512,
    progress: bool = False,
    max_source_tokens: int | None = None,
    ready: Callable[[], bool] | None = None,
    *,
    nbest: int | None = None,
    max_tokens: int | None = None,
    sampling: Sampling | None = None,
    constraints: str | None = None,
    target_prefixes: Iterable[str] | None = None,
    block: Sequence[str] = (),
    disable_unk: bool = False,
    report: ControlReport | None = None,
    alignments: str | None = None,
    alignment_method: str | None = None,
    markup: str | None = None,
    **generate_kwargs,
) -> Iterator[list]:
    """`translate` of an iterable of any length, lazily: reads `chunk_size` lines, yields their translations in
    input order, then reads the next chunk; memory is that of one chunk. Warnings number lines from 1 across chunks.

    `ready()`, when given, says whether another line can be read without waiting: a chunk then ends early when the
    input pauses, so a program that writes a line into a pipe and waits gets its answer. `max_tokens` and `sampling`
    as in `translate`, within each chunk. With `nbest`, each line's translation is its list of `Hypothesis`.

    `constraints` ("unordered" or "ordered"): each line is fairseq's `source<TAB>term<TAB>term...`;
    `target_prefixes`: one prefix per line ("" for none), read along with the lines; ValueError where it ends before
    them. `block`, `disable_unk`, `report`, `alignments`, `alignment_method` and `markup` as in `translate`."""
    if (batch_size is not None and batch_size < 1) or chunk_size < 1:
        raise ValueError(f"batch_size and chunk_size must be at least 1, got {batch_size} and {chunk_size}")
    generate_kwargs = {**generate_kwargs, **block_kwargs(tokenizer, block, disable_unk)}
    prefixes = iter(target_prefixes) if target_prefixes is not None else None
    controls = None
    if constraints is not None or prefixes is not None:
        controls = LineControls([] if constraints else None, [] if prefixes is not None else None,
                                constraints or "unordered", report)  # fmt: skip
    if markup is not None:
        from vaswani_mt.inference.markup import check_markup_options

        check_markup_options(markup, alignments, nbest)
        alignments = "hard"
    decoding = _decoding(model, tokenizer, batch_size=batch_size, max_source_tokens=max_source_tokens,
                         generate_kwargs=generate_kwargs, nbest=nbest, max_tokens=max_tokens, sampling=sampling,
                         controls=controls, alignments=alignments, alignment_method=alignment_method)  # fmt: skip
    model.eval()
    lines, done = iter(lines), 0
    with _progress_bar(None, "line", progress) as bar:
        on_batch = None if bar is None else bar.update
        while chunk := next_chunk(lines, chunk_size, ready):
            if controls is not None:
                chunk = _chunk_controls(chunk, controls, prefixes, done + 1)
            if markup is None:
                yield _translate_batches(model, tokenizer, chunk, decoding, first_line=done + 1, on_batch=on_batch)
            else:
                from vaswani_mt.inference.markup import restore_markup, take_out_markup

                plans = take_out_markup(chunk, done + 1)
                texts = [plan.text for plan in plans]
                yield restore_markup(plans, _translate_batches(model, tokenizer, texts, decoding, first_line=done + 1,
                                                               on_batch=on_batch))  # fmt: skip
            if bar is not None:
                bar.update(sum(1 for line in chunk if not line.strip()))  # blank lines count as done too
            done += len(chunk)
    if constraints is not None and not controls.tabbed:
        warn_no_tabs(done)


def _chunk_controls(chunk: list[str], controls: LineControls, prefixes: Iterator[str] | None, first: int) -> list:
    """A chunk's sources, its lines' terms (with constrained input) and prefixes put into `controls`."""
    if controls.terms is not None:
        controls.tabbed += sum("\t" in line for line in chunk)
        chunk, controls.terms = map(list, zip(*map(split_constrained_line, chunk), strict=True))
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


__all__ = [
    "ControlReport",
    "Hypothesis",
    "Sampling",
    "check_decoding_options",
    "format_nbest",
    "format_translation",
    "next_chunk",
    "translate",
    "translate_chunks",
    "translate_nbest",
]
