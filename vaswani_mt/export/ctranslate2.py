"""CTranslate2, the C++ engine users pick for fast Marian decoding: the conversion of a Marian folder written by
`marian.save_marian` (`to_ctranslate2`, through CTranslate2's own Transformers converter) and translating with the
result: `CTranslate2Model(folder).translate(sentences)` with the model's own search, ranked as the paper ranks
(`ctranslate2_nbest`: CTranslate2's hypotheses re-ranked by §6.1's GNMT score); the commands take such a folder
as `--model` through `load_ctranslate2`. Under it `ctranslate2_translate` and, for batches of our token ids,
`ctranslate2_generate`, with the search given and CTranslate2's own ranking. `ctranslate2` is an optional
dependency (`pip install vaswani-mt[ctranslate2]`), imported when used. How to run it: docs/export.md.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

from vaswani_mt.inference.controls import ControlReport, LineControls, block_kwargs
from vaswani_mt.inference.loading import ModelFolderError
from vaswani_mt.inference.translate import Hypothesis, Sampling, TranslationInterrupted, check_decoding_options
from vaswani_mt.model.beam_search_vaswani import gnmt_length_penalty
from vaswani_mt.model.generation_vaswani import PAPER_SEARCH, sentence_limits
from vaswani_mt.model.pipeline_vaswani import encode_source, single_line
from vaswani_mt.system.messages import error_line

logger = logging.getLogger(__name__)

# The generation_config.json keys of the model's search (§6.1), and their names among translate_batch's options.
_SEARCH_OPTIONS = {"num_beams": "beam_size", "length_penalty": "length_penalty"}
_LENGTH_RULE = ("max_len_a", "max_len_b")
# The paper's search in those names: what `ctranslate2_nbest` searches with where a folder saved none.
_PAPER_SEARCH = {_SEARCH_OPTIONS.get(name, name): value for name, value in PAPER_SEARCH.items()}
# CTranslate2 marks the beams a target prefix forces beside the first with a score of -1e10: not hypotheses.
_FORCED_BEAM = -1.0e9


@contextlib.contextmanager
def _ctranslate2_marian_loader() -> Iterator[None]:
    """CTranslate2's Marian loader assumes OPUS-MT's conventions: `<pad>` is the last token (its row is dropped) and
    the decoder starts from a zero embedding. A vaswani_mt model has `<pad>` = 1 and starts the decoder from the
    trained embedding of `<s>` (fairseq's order), so the conversion uses the loader of the same architecture without
    those two OPUS-MT rules (CTranslate2's BART loader, which reads `decoder_start_token_id` from the config)."""
    from ctranslate2.converters import transformers as ct2_transformers

    class VaswaniMarianLoader(ct2_transformers.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False  # post-LN
            model.config.normalize_embedding = False  # no LayerNorm on the embeddings
            return ct2_transformers.BartLoader.get_model_spec(self, model)

        def set_config(self, config, model, tokenizer):
            ct2_transformers.BartLoader.set_config(self, config, model, tokenizer)

        def set_decoder(self, spec, decoder):
            ct2_transformers.BartLoader.set_decoder(self, spec, decoder)

        def get_vocabulary(self, model, tokenizer):
            return ct2_transformers.BartLoader.get_vocabulary(self, model, tokenizer)

    loaders = ct2_transformers._MODEL_LOADERS
    original = loaders["MarianConfig"]
    loaders["MarianConfig"] = VaswaniMarianLoader()
    try:
        yield
    finally:
        loaders["MarianConfig"] = original


def to_ctranslate2(marian_dir: str | Path, output: str | Path, quantization: str | None = None) -> Path:
    """Converts a Marian folder written by `save_marian` to a CTranslate2 model in `output` (`model.bin`,
    `config.json`, `shared_vocabulary.json`, plus `tokenizer.json` to tokenize with; `export_model` adds our
    generation_config.json, the search `ctranslate2_search` reads). `quantization`: None (the
    weights' float32), "int8", "int8_float32", "float16", ... as CTranslate2 names them."""
    import ctranslate2

    marian_dir, output = Path(marian_dir), Path(output)
    converter = ctranslate2.converters.TransformersConverter(
        str(marian_dir), copy_files=["tokenizer.json", "tokenizer_config.json"]
    )
    with _ctranslate2_marian_loader():
        converter.convert(str(output), quantization=quantization, force=True)
    return output


def ctranslate2_search(folder: str | Path) -> dict:
    """The model's search, from the generation_config.json that `export_model` writes beside the CTranslate2 model:
    `beam_size` and `length_penalty` (translate_batch's names) and the per-sentence length rule `max_len_a`,
    `max_len_b` (at most a·|X| + b tokens, `</s>` included; §6.1: |X| + 50). {} where the folder has none."""
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return {}
    saved = json.loads(path.read_text(encoding="utf-8"))
    search = {theirs: saved[ours] for ours, theirs in _SEARCH_OPTIONS.items() if saved.get(ours) is not None}
    return {**search, **{name: saved[name] for name in _LENGTH_RULE if saved.get(name) is not None}}


def _decoding_limits(sources: list[list[str]], search: Mapping, options: Mapping) -> list[int] | None:
    """Each source's `max_decoding_length` under `search`'s length rule, None without one or where `options` give
    their own: our limit counts `</s>`, which CTranslate2 does not count, so a translation cut at the limit has
    `limit - 1` tokens in both."""
    a, b = (search.get(name) for name in _LENGTH_RULE)
    if b is None or "max_decoding_length" in options:
        return None
    return (sentence_limits(a, b, torch.tensor([len(tokens) for tokens in sources])) - 1).tolist()


def _translate_batch(translator, sources: list[list[str]], search: Mapping | None, options: dict,
                     target_prefix: list[list[str]] | None = None,
                     group_options: Callable[[list[int]], dict] | None = None) -> list:  # fmt: skip
    """`translator.translate_batch(sources, target_prefix)` with `search`'s options under `options`. With a length
    rule (and no `max_decoding_length` in `options`) the sentences of one limit (`_decoding_limits`) go together, as
    translate_batch takes one limit per call; `group_options(group)`, options of the call that translates the
    sentences `group` (indices)."""
    search = dict(search or {})
    limits = _decoding_limits(sources, search, options)
    options = {**{k: v for k, v in search.items() if k not in _LENGTH_RULE}, **options}
    groups = [list(range(len(sources)))] if limits is None else [
        [i for i, own in enumerate(limits) if own == limit] for limit in sorted(set(limits))
    ]  # fmt: skip
    results: list = [None] * len(sources)
    for group in groups:
        own = {} if limits is None else {"max_decoding_length": limits[group[0]]}
        own.update(group_options(group) if group_options is not None else {})
        prefixes = None if target_prefix is None else [target_prefix[i] for i in group]
        found = translator.translate_batch([sources[i] for i in group], prefixes, **{**options, **own})
        for i, result in zip(group, found, strict=True):
            results[i] = result
    return results


def ctranslate2_nbest(
    translator, sources: list[list[str]], search: Mapping | None = None, target_prefix: list[list[str]] | None = None,
    patience: float = 1.0, **options,
) -> list[list[tuple[list[str], float, float]]]:  # fmt: skip
    """The hypotheses CTranslate2's beam search finds for each of `sources` (token lists ending in `</s>`), best
    first as our search ranks them (§6.1): `(tokens, log P(Y|X), score)` with `score = log P / ((5 + |Y|) / 6)^alpha`
    (`gnmt_length_penalty`), |Y| the tokens with `</s>`, log P counting `</s>` and the target prefix (`target_prefix`:
    a token list per source, [] for none; the tokens start with it). The search is `search`'s
    (`ctranslate2_search`; the paper's beam, alpha and |X| + 50 where it has none); translate_batch's `options` win.

    CTranslate2 returns its own `score = log P' / |Y|^lp` (`finalize_hypothesis_score`, src/decoding.cc of
    CTranslate2 4.x; lp its `length_penalty`), where |Y| counts `</s>` (translations are searched with
    `include_eos_in_hypotheses`) and the prefix, and log P' leaves the prefix out (its forced tokens score 0). So
    log P = score · (len(tokens) + 1)^lp + log P(prefix), the prefix's from `score_batch`; a hypothesis cut at the
    length limit has no `</s>` and is scored whole by `score_batch`, which adds it, as our search ends one there.

    Which hypotheses it finds does not depend on lp unless lp is 0 (and the coverage penalty too: then it stops once
    the top beam ends, which for alpha = 0 is the best by log P). Otherwise it stops once `beam · patience`
    hypotheses have ended (fairseq's rule; ours goes on while a running one could still win: `patience` > 1 sees
    more, slower) and keeps that many, the best by its score where more ended at the last step. So that these are
    the best by ours, each call's lp is alpha · n / (5 + n), n its mean source length: |Y|^lp then grows as GNMT's
    ((5 + |Y|) / 6)^alpha does at |Y| = n, a translation's expected length (lp = alpha lost more of them:
    benchmarks/ctranslate2_backend.py)."""
    search = {**_PAPER_SEARCH, **(search or {})}
    beam = options.pop("beam_size", search["beam_size"])
    alpha = options.pop("length_penalty", search["length_penalty"])
    kept = max(1, round(beam * patience)) if beam > 1 else 1
    options = {"beam_size": beam, "patience": patience, "num_hypotheses": kept, "return_scores": True,
               "min_decoding_length": 0, "max_input_length": 0, **options}  # fmt: skip
    limits = _decoding_limits(sources, search, options) or [options.get("max_decoding_length", 256)] * len(sources)
    lps = [0.0] * len(sources)

    def group_length_penalty(group: list[int]) -> dict:
        length = sum(len(sources[i]) for i in group) / len(group)
        for i in group:
            lps[i] = alpha * length / (5.0 + length)
        return {"length_penalty": lps[group[0]]}

    results = _translate_batch(translator, sources, search, options, target_prefix, group_length_penalty)
    prefixes = target_prefix or [[] for _ in sources]
    prefix_log_probs = [0.0] * len(sources)
    prefixed = [i for i, prefix in enumerate(prefixes) if prefix]
    if prefixed:
        scored = translator.score_batch([sources[i] for i in prefixed], [prefixes[i] for i in prefixed],
                                        max_input_length=0)  # fmt: skip
        for i, result in zip(prefixed, scored, strict=True):
            prefix_log_probs[i] = sum(result.log_probs[:-1])  # the prefix's tokens, not the </s> scored after them
    found: list[list[list]] = []
    cut = []  # (sentence, hypothesis) cut at the limit
    for i, result in enumerate(results):
        row = []
        for tokens, score in zip(result.hypotheses, result.scores, strict=True):
            if len(tokens) >= limits[i]:
                cut.append((i, len(row)))
            row.append([tokens, score * (len(tokens) + 1) ** lps[i] + prefix_log_probs[i]])
        found.append(row)
    if cut:
        scored = translator.score_batch([sources[i] for i, _ in cut], [found[i][k][0] for i, k in cut],
                                        max_input_length=0)  # fmt: skip
        for (i, k), result in zip(cut, scored, strict=True):
            found[i][k][1] = sum(result.log_probs)
    ranked = []
    for row in found:
        real = [hypothesis for hypothesis in row if hypothesis[1] > _FORCED_BEAM] or row
        scored_row = [(tokens, log_prob, log_prob / gnmt_length_penalty(len(tokens) + 1, alpha))
                      for tokens, log_prob in real]  # fmt: skip
        ranked.append(sorted(scored_row, key=lambda hypothesis: hypothesis[2], reverse=True))
    return ranked


def ctranslate2_generate(
    translator, input_ids, attention_mask, tokenizer, search: Mapping | None = None, **options
) -> list[list[int]]:
    """The target ids of the best hypothesis of each sentence of a padded batch of our source ids (without the start
    token and `</s>`), searched as `search` says (`ctranslate2_search`; None: CTranslate2's defaults) unless
    `options` (translate_batch's) say otherwise."""
    sources = [
        tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist())
        for ids, mask in zip(input_ids, attention_mask, strict=True)
    ]
    results = _translate_batch(translator, sources, search, options)
    return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]


def ctranslate2_translate(
    translator, tokenizer, sentences: Sequence[str], search: Mapping | None = None, **options
) -> list[str]:
    """Translates `sentences` with a CTranslate2 model: with `search = ctranslate2_search(folder)`, the model's search
    (its beam size and length penalty, and each sentence's own limit of |X| + 50 tokens); `options` are
    translate_batch's and win. Sources are read as `translate()` reads them (`pipeline_vaswani.encode_source`: cut
    at the tokenizer's `model_max_length`, <unk> named in a warning) and a blank one gives "".

    CTranslate2 divides a hypothesis's log-probability by |Y|^alpha where ours divides by GNMT's ((5 + |Y|) / 6)^alpha,
    so beam search with alpha > 0 may rank some hypotheses otherwise (`ctranslate2_nbest` and `CTranslate2Model`
    re-rank them as ours); greedy search gives our tokens."""
    limit = tokenizer.model_max_length if 0 < (tokenizer.model_max_length or 0) < 10**9 else 1024
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    sources = [tokenizer.convert_ids_to_tokens(encode_source(tokenizer, sentences[i], limit)) for i in todo]
    results = _translate_batch(translator, sources, search, {"max_input_length": 0, **options}) if todo else []
    translations = [""] * len(sentences)
    for i, result in zip(todo, results, strict=True):
        ids = tokenizer.convert_tokens_to_ids(result.hypotheses[0])
        translations[i] = single_line(tokenizer.decode(ids, skip_special_tokens=True))  # as translate() decodes
    return translations


# generate()'s names for the search options the models' functions take, and translate_batch's; and those that concern
# constraints alone, which a CTranslate2 folder refuses (so they change nothing here).
_GENERATE_NAMES = {"num_beams": "beam_size", "length_penalty": "length_penalty", "max_len_a": "max_len_a",
                   "max_len_b": "max_len_b"}  # fmt: skip
_CONSTRAINT_ONLY = ("constrained_length_penalty", "constraint_order")


# Options of our search that read our model's attention or change when a search stops: none has a CTranslate2
# equivalent but early_stopping=True, which is CTranslate2's own rule (stop once beam · patience have finished).
OWN_SEARCH_ONLY = ("alignments", "alignment_method", "markup", "early_stopping")


def check_ctranslate2_options(*, constraints: bool = False, sampling: bool = False, models: int = 1,
                              **options) -> None:  # fmt: skip
    """ValueError, one line, for what a CTranslate2 folder cannot do as vaswani_mt's own search does: terminology
    constraints (dynamic beam allocation), sampling (ours draws each line from a seed of its own), ensembles, and
    `options` (keyword: value, None for not given) that only our search has."""
    instead = "translate the vaswani_mt folder it came from"
    if constraints:
        raise ValueError(
            "constraints (--constraints) need vaswani_mt's own search: a CTranslate2 folder takes target prefixes "
            f"(--target_prefix_file), --block_file and --disable_unk only; {instead}"
        )
    if sampling:
        raise ValueError(f"sampling (--sampling) needs vaswani_mt's own search (a seeded draw per line); {instead}")
    if models > 1:
        raise ValueError(f"an ensemble (several --model) needs vaswani_mt's own models: a CTranslate2 folder "
                         f"translates alone; {instead}")  # fmt: skip
    for name, value in options.items():
        if value is None or (name == "early_stopping" and value in (True, "true")):
            continue
        if name == "early_stopping":
            raise ValueError(
                f"early_stopping={value!r} (--early_stopping {str(value).lower()}) needs vaswani_mt's own search: "
                "CTranslate2 stops a sentence once beam_size hypotheses have ended (true)"
            )
        raise ValueError(f"{name} (--{name}) needs vaswani_mt's own model, not a CTranslate2 folder; {instead}")


class CTranslate2Model:
    """A CTranslate2 export ready to translate with the model's search, ranked as ours ranks (`ctranslate2_nbest`):
    its `translator` (`ctranslate2.Translator`; `translator_options` such as device="cuda", compute_type="int8",
    intra_threads=2), its `tokenizer`, its `search` (`ctranslate2_search`) and its `generation_config` (the folder's
    generation_config.json, or the paper's search), which the commands check their options against; `patience` as
    `ctranslate2_nbest` takes it. `translate`, `translate_nbest` and `translate_chunks` work as `inference.translate`'s
    functions of those names (one single-line translation per sentence, in input order, blank ones left empty,
    sources cut at the tokenizer's `model_max_length` with a warning, target prefixes, blocked phrases, `<unk>` kept
    out, a `ControlReport`); a stream (`streams.translate_stream`) calls `translate_chunks`. No progress bar."""

    def __init__(self, folder: str | Path, patience: float = 1.0, **translator_options):
        import ctranslate2
        from transformers import AutoTokenizer, GenerationConfig

        self.translator = ctranslate2.Translator(str(folder), **{"device": "cpu", **translator_options})
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.search = ctranslate2_search(folder)
        if (Path(folder) / "generation_config.json").is_file():
            self.generation_config = GenerationConfig.from_pretrained(folder)
        else:
            self.generation_config = GenerationConfig(**PAPER_SEARCH, early_stopping="never")
        self.patience = patience
        limit = self.tokenizer.model_max_length
        self.max_source_tokens = limit if 0 < (limit or 0) < 10**9 else 1024

    def translate(self, sentences: Sequence[str], batch_size: int | None = 32, progress: bool = False, *,
                  ranking: str = "paper", **options) -> list[str]:  # fmt: skip
        """The translations of `sentences`. `ranking="paper"`: CTranslate2's hypotheses re-ranked by §6.1's GNMT
        score (`ctranslate2_nbest`), `options` as `inference.translate.translate` takes them (`max_tokens`,
        `target_prefixes`, `block`, `disable_unk`, `report`, and `num_beams`, `length_penalty`, `max_len_a`,
        `max_len_b`) or translate_batch's (`beam_size=1`, `repetition_penalty`, ...), which win over the model's
        search. `ranking="ctranslate2"`: `ctranslate2_translate`, CTranslate2's own ranking (log P / |Y|^alpha), with
        translate_batch's options only. `progress` is taken for `translate`'s signature and shows nothing."""
        if ranking == "ctranslate2":
            return ctranslate2_translate(self.translator, self.tokenizer, sentences, self.search, **options)
        if ranking != "paper":
            raise ValueError(f"ranking must be 'paper' or 'ctranslate2', not {ranking!r}")
        return self._translate_lines(sentences, 1, batch_size, None, **options)

    def translate_nbest(self, sentences: Sequence[str], nbest: int, batch_size: int | None = 32,
                        progress: bool = False, **options) -> list[list[Hypothesis]]:  # fmt: skip
        """`translate` keeping the `nbest` best `Hypothesis`es of each sentence (`nbest` <= the beam size), best
        first, with log P(Y|X) and the GNMT score; an empty sentence gets `nbest` empty ones scored 0."""
        return self._translate_lines(sentences, 1, batch_size, nbest, **options)

    def translate_chunks(
        self, lines: Iterable[str], batch_size: int | None = 32, chunk_size: int = 512, progress: bool = False,
        ready: Callable[[], bool] | None = None, *, target_prefixes: Iterable[str] | None = None,
        nbest: int | None = None, **options,
    ) -> Iterator[list]:  # fmt: skip
        """`translate` (with `nbest`: `translate_nbest`) of an iterable of any length, `chunk_size` lines at a time,
        as `inference.translate.translate_chunks`: `ready()` ends a chunk where the input pauses; `target_prefixes`
        are read along with the lines (ValueError where they end first); warnings number lines across chunks."""
        from vaswani_mt.inference.translate import next_chunk  # the same chunks as ours

        if (batch_size is not None and batch_size < 1) or chunk_size < 1:
            raise ValueError(f"batch_size and chunk_size must be at least 1, got {batch_size} and {chunk_size}")
        prefixes = None if target_prefixes is None else iter(target_prefixes)
        lines, done = iter(lines), 0
        while chunk := next_chunk(lines, chunk_size, ready):
            own = None
            if prefixes is not None:
                own = list(itertools.islice(prefixes, len(chunk)))
                if len(own) < len(chunk):
                    raise ValueError(f"the target prefixes end before input line {done + 1 + len(own)}")
            yield self._translate_lines(chunk, done + 1, batch_size, nbest, target_prefixes=own, **options)
            done += len(chunk)

    def _translate_lines(
        self, sentences: Sequence[str], first_line: int, batch_size: int | None, nbest: int | None, *,
        max_tokens: int | None = None, sampling: Sampling | None = None, constraints=None,
        target_prefixes: Sequence[str] | None = None, block: Sequence[str] = (), disable_unk: bool = False,
        report: ControlReport | None = None, **options,
    ) -> list:  # fmt: skip
        """The translations (with `nbest`: n-best lists) of `sentences`, numbered from `first_line` in warnings."""
        own_only = {name: options.pop(name) for name in OWN_SEARCH_ONLY if name in options}
        check_ctranslate2_options(constraints=constraints is not None, sampling=sampling is not None, **own_only)
        if target_prefixes is not None and len(target_prefixes) != len(sentences):
            raise ValueError(f"{len(target_prefixes)} target_prefixes for {len(sentences)} sentences: give one per "
                             "sentence")  # fmt: skip
        if batch_size is None and max_tokens is None:
            raise ValueError("batch_size=None (no limit on rows) needs max_tokens")
        options = {name: value for name, value in options.items() if name not in _CONSTRAINT_ONLY}
        ours = {name: options.pop(name) for name in list(options) if name in _GENERATE_NAMES}
        search = {**self.search, **{_GENERATE_NAMES[name]: value for name, value in ours.items() if value is not None}}
        controls = None if target_prefixes is None else LineControls(None, target_prefixes, report=report)
        check_decoding_options(self.generation_config, nbest, max_tokens, None, controls,
                               num_beams=options.get("beam_size", search.get("beam_size")))  # fmt: skip
        blocked = block_kwargs(self.tokenizer, block, disable_unk)
        blank = [i for i, sentence in enumerate(sentences) if not sentence.strip()]
        if blank:
            logger.warning("%d empty or whitespace-only lines left empty (first: line %d)", len(blank),
                           first_line + blank[0])  # fmt: skip
        results: list = [""] * len(sentences) if nbest is None else [[Hypothesis("", 0.0, 0.0)] * nbest
                                                                     for _ in sentences]  # fmt: skip
        todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
        limit, tokenizer = self.max_source_tokens, self.tokenizer
        encoded = {i: encode_source(tokenizer, sentences[i], limit, where=f"line {first_line + i}: ") for i in todo}
        prepared = {}
        if controls is not None:  # each prefix checked against its line's limit and the blocked phrases, as ours
            controls.refuse_blank(blank, first_line)
            prepared = controls.prepare(self, self.tokenizer, encoded, first_line, {**ours, **blocked})
            todo = [i for i in todo if i in encoded]
        tokens = self.tokenizer.convert_ids_to_tokens
        if blocked.get("bad_words_ids"):
            options.setdefault("suppress_sequences", [tokens(form) for form in blocked["bad_words_ids"]])
        if blocked.get("suppress_tokens"):
            options.setdefault("disable_unk", True)
        if max_tokens is not None:
            options.update(max_batch_size=max_tokens, batch_type="tokens")
        elif batch_size is not None:
            options.setdefault("max_batch_size", batch_size)
        prefixes = [tokens(prepared[i][1]) if i in prepared else [] for i in todo] if prepared else None
        try:
            ranked = ctranslate2_nbest(self.translator, [tokens(encoded[i]) for i in todo], search, prefixes,
                                       self.patience, **options) if todo else []  # fmt: skip
        except TranslationInterrupted as stop:  # no line of this call is done but the blank and refused ones
            stop.done = results[: min(todo, default=len(sentences))]
            raise
        for i, hypotheses in zip(todo, ranked, strict=True):
            found = [Hypothesis(self._text(tokens), log_prob, score) for tokens, log_prob, score in hypotheses]
            results[i] = found[0].text if nbest is None else found[:nbest]
        if controls is not None:
            controls.record(todo, None, first_line, results)
        return results

    def _text(self, tokens: list[str]) -> str:
        """A hypothesis's tokens as `translate()` decodes them: special tokens dropped, one line."""
        ids = self.tokenizer.convert_tokens_to_ids(tokens)
        return single_line(self.tokenizer.decode(ids, skip_special_tokens=True))


def load_ctranslate2(model: str | Path, compute_type: str | None = None, **translator_options):
    """A CTranslate2 export (`export_model(..., "ctranslate2", ...)`) as a `CTranslate2Model` and its tokenizer, what
    the commands translate with when --model names one: `compute_type` is CTranslate2's ("float32", "int8",
    "bfloat16", "auto", ...; None: the type it was saved in). A folder that cannot serve raises `ModelFolderError`,
    one line: a missing tokenizer.json, a bad generation_config.json, no `ctranslate2` package, a compute type this
    machine lacks."""
    from vaswani_mt.inference.loading import check_ctranslate2_folder

    folder = check_ctranslate2_folder(str(model))
    if compute_type is not None:
        translator_options["compute_type"] = compute_type
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise ModelFolderError(f"{model} is a CTranslate2 export: translating with it needs the ctranslate2 package "
                               "(pip install 'vaswani-mt[ctranslate2]')") from None  # fmt: skip
    try:
        engine = CTranslate2Model(folder, **translator_options)
    except (RuntimeError, ValueError, OSError) as error:
        raise ModelFolderError(f"{model}: CTranslate2 cannot load it ({error_line(error)})") from error
    return engine, engine.tokenizer


__all__ = [
    "CTranslate2Model",
    "check_ctranslate2_options",
    "ctranslate2_generate",
    "ctranslate2_nbest",
    "ctranslate2_search",
    "ctranslate2_translate",
    "load_ctranslate2",
    "to_ctranslate2",
]
