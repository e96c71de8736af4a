"""Translating with a CTranslate2 export (`vaswani-mt-export --format ctranslate2`; the converter is
export/ctranslate2.py): `CTranslate2Model(folder)`, a backend of the `Translator` (backends.py's protocol), searches
with the model's own search (its generation config) and ranks as the paper ranks (`ctranslate2_nbest`: CTranslate2's
hypotheses re-ranked by §6.1's GNMT score; `ranking="ctranslate2"`: its own). The commands take such a folder as
`--model` (`load_ctranslate2`). `ctranslate2_generate` translates batches of our token ids. `ctranslate2` is an
optional dependency (`pip install vaswani-mt[ctranslate2]`), imported when used. How to run it: docs/export.md.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

from vaswani_mt.inference.backends import Batch, Search
from vaswani_mt.inference.batching import token_budget_batches
from vaswani_mt.inference.loading import ModelFolderError
from vaswani_mt.inference.options import OWN_SEARCH, BackendFacts, Hypothesis, TranslationOptions
from vaswani_mt.model.beam_search_vaswani import gnmt_length_penalty
from vaswani_mt.model.generation_vaswani import PAPER_SEARCH
from vaswani_mt.model.pipeline_vaswani import single_line
from vaswani_mt.system.messages import error_line

# CTranslate2's `intra_threads` where --threads is not given, the one place to set it. None: torch's thread count
# (one per core, or what --threads / OMP_NUM_THREADS set), never more than the cores torch may use: on 2 cores,
# whole commands on the test split took 6.5 s with 2 against 7.9 s with 1 (RESULTS 2026-11-29, issue 66).
THREADS: int | None = None
# Rows of a batch where the options give none: CTranslate2's users' `max_batch_size` (its batches sort by length).
BATCH_SIZE = 64
# CTranslate2 marks the beams a target prefix forces beside the first with a score of -1e10: `score_batch` scores
# them, so that an n-best list still has its K entries, each with its true log-probability.
_FORCED_BEAM = -1.0e9


def ctranslate2_search(folder: str | Path) -> dict:
    """The model's search, from the generation_config.json that `export_model` writes beside the CTranslate2 model,
    in translate_batch's words: `beam_size`, `length_penalty` (GNMT alpha) and the per-sentence length rule
    `max_len_a`, `max_len_b` (at most a·|X| + b tokens, `</s>` included; §6.1: |X| + 50). {} where it has none."""
    path = Path(folder) / "generation_config.json"
    saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    search = {"beam_size": saved.get("num_beams"), "length_penalty": saved.get("length_penalty"),
              "max_len_a": saved.get("max_len_a"), "max_len_b": saved.get("max_len_b")}  # fmt: skip
    return {name: value for name, value in search.items() if value is not None}


def _limits(sources: list[list[str]], search: Mapping, options: dict) -> list[int]:
    """Each source's `max_decoding_length`: `options`' own (taken out of them), else `search`'s length rule
    (`Search.limits`, less the `</s>` CTranslate2 does not count: a translation cut there has `limit - 1` tokens in
    both), else CTranslate2's default, 256."""
    given = options.pop("max_decoding_length", None)
    if given is None and search.get("max_len_b") is not None:
        rule = TranslationOptions(max_len_a=search.get("max_len_a"), max_len_b=search["max_len_b"])
        return [limit - 1 for limit in Search(rule).limits(None, [len(tokens) for tokens in sources])]
    return [256 if given is None else given] * len(sources)


def _candidates(beam: int, patience: float) -> int:
    """CTranslate2's `beam_size · patience` hypotheses, rounded as its `get_max_candidates` rounds (half up)."""
    return max(1, math.floor(beam * patience + 0.5)) if beam > 1 else 1


def _translate(translator, sources: list[list[str]], limits: list[int], options: dict,
               prefixes: list[list[str]] | None = None) -> list:  # fmt: skip
    """`translator.translate_batch(sources, prefixes, **options)` with each sentence's own `max_decoding_length`
    (`limits`), in one call at the longest of them, then again at its own limit for each sentence whose search
    reached its own last step. Exact: the limit enters CTranslate2's search only as a sentence's last step
    (`is_last_step`, src/decoding.cc), so until then its search is the same under any longer limit; and a sentence
    leaves once `num_hypotheses` = beam·patience hypotheses have ended (greedy: its one), the last of them among those
    returned, so a sentence whose hypotheses all have fewer than `limit - 1` tokens left before its own last step.
    Where that rule does not hold (length penalty 0 stops at the top beam, fewer hypotheses, coverage penalty,
    sampling, alternatives), one call per limit."""
    options = {"max_input_length": 0, **options}
    beam = options.get("beam_size", 2)
    wanted = _candidates(beam, options.get("patience", 1))
    stops_alike = beam == 1 or (options.get("num_hypotheses", 1) == wanted and options.get("length_penalty", 1) != 0
                                and not options.get("coverage_penalty"))  # fmt: skip
    one_call = stops_alike and options.get("sampling_topk", 1) == 1 and not options.get("return_alternatives")
    results: list = [None] * len(sources)

    def run(rows: list[int], limit: int) -> None:
        chosen = None if prefixes is None else [prefixes[i] for i in rows]
        found = translator.translate_batch([sources[i] for i in rows], chosen, **options, max_decoding_length=limit)
        for i, result in zip(rows, found, strict=True):
            results[i] = result

    todo = list(range(len(sources)))
    if one_call and todo:
        longest = max(limits)
        run(todo, longest)
        todo = [i for i in todo if limits[i] < longest and max(map(len, results[i].hypotheses)) >= limits[i] - 1]
    for limit in sorted({limits[i] for i in todo}):
        run([i for i in todo if limits[i] == limit], limit)
    return results


def ctranslate2_nbest(
    translator, sources: list[list[str]], search: Mapping | None = None, target_prefix: list[list[str]] | None = None,
    patience: float = 1.0, **options,
) -> list[list[tuple[list[str], float, float]]]:  # fmt: skip
    """The hypotheses CTranslate2's beam search finds for each of `sources` (token lists ending in `</s>`), best
    first as our search ranks them (§6.1): `(tokens, log P(Y|X), score)` with `score = log P / ((5 + |Y|) / 6)^alpha`
    (`gnmt_length_penalty`), |Y| the tokens with `</s>`, log P counting `</s>` and the target prefix (`target_prefix`:
    a token list per source, [] for none; the tokens start with it). The search is `search`'s
    (`ctranslate2_search`; the paper's beam, alpha and |X| + 50 where it has none); translate_batch's `options` win,
    `max_batch_size` (with `batch_type`) batching as its own does: sorted by length, a call per batch (0: one).

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
    ((5 + |Y|) / 6)^alpha does at |Y| = n, a translation's expected length (lp = alpha lost more of them: issue 44,
    item 5)."""
    paper = {"beam_size": PAPER_SEARCH["num_beams"], "length_penalty": PAPER_SEARCH["length_penalty"],
             "max_len_a": PAPER_SEARCH["max_len_a"], "max_len_b": PAPER_SEARCH["max_len_b"]}  # fmt: skip
    search = {**paper, **(search or {})}
    beam = options.pop("beam_size", search["beam_size"])
    alpha = options.pop("length_penalty", search["length_penalty"])
    limits = _limits(sources, search, options)
    rows, tokens = options.pop("max_batch_size", 0), options.pop("batch_type", "examples") == "tokens"
    lengths = [len(source) for source in sources]
    # Longest first, as CTranslate2 sorts: `rows` tokens a batch, or `rows` sentences (0: one batch).
    budget, most = (rows, None) if rows and tokens else (sys.maxsize, rows or max(1, len(sources)))
    batches = token_budget_batches(lengths, budget, most)
    ranked: list = [None] * len(sources)
    for batch in batches:
        prefixes = None if target_prefix is None else [target_prefix[i] for i in batch]
        found = _ranked(translator, [sources[i] for i in batch], [limits[i] for i in batch], beam, alpha, patience,
                        prefixes, dict(options))  # fmt: skip
        for i, row in zip(batch, found, strict=True):
            ranked[i] = row
    return ranked


def _ranked(translator, sources: list[list[str]], limits: list[int], beam: int, alpha: float, patience: float,
            target_prefix: list[list[str]] | None, options: dict) -> list[list[tuple]]:  # fmt: skip
    """`ctranslate2_nbest` of one batch, searched in one call (`_translate`): its lp from its mean source length."""
    mean = sum(len(tokens) for tokens in sources) / len(sources)
    lp = alpha * mean / (5.0 + mean)
    options = {"beam_size": beam, "patience": patience, "num_hypotheses": _candidates(beam, patience),
               "return_scores": True, "min_decoding_length": 0, "length_penalty": lp, **options}  # fmt: skip
    results = _translate(translator, sources, limits, options, target_prefix)
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
            if len(tokens) >= limits[i] or score <= _FORCED_BEAM:  # a beam a prefix forced is scored whole too
                cut.append((i, len(row)))
            row.append([tokens, score * (len(tokens) + 1) ** lp + prefix_log_probs[i]])
        found.append(row)
    if cut:
        scored = translator.score_batch([sources[i] for i, _ in cut], [found[i][k][0] for i, k in cut],
                                        max_input_length=0)  # fmt: skip
        for (i, k), result in zip(cut, scored, strict=True):
            found[i][k][1] = sum(result.log_probs)
    ranked = []
    for row in found:  # every row keeps its `num_hypotheses`: an n-best list has K entries
        scored_row = [(tokens, log_prob, log_prob / gnmt_length_penalty(len(tokens) + 1, alpha))
                      for tokens, log_prob in row]  # fmt: skip
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
    search = dict(search or {})
    limits = _limits(sources, search, options)
    options = {**{name: search[name] for name in ("beam_size", "length_penalty") if name in search}, **options}
    results = _translate(translator, sources, limits, options)
    return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]


RANKINGS = ("paper", "ctranslate2")


def _keywords(ctranslate2) -> frozenset[str]:
    """The keywords a CTranslate2 folder's search takes beside the options' own fields: translate_batch's (read from
    its signature, the first line of its docstring), and `num_beams` (`beams_given`)."""
    signature = ctranslate2.Translator.translate_batch.__doc__.split("\n", 1)[0]
    return frozenset({*re.findall(r"(\w+): ", signature.split("*", 1)[-1]), "num_beams"})


class CTranslate2Model:
    """A CTranslate2 export as a `Translator` backend: its `translator` (`ctranslate2.Translator`;
    `translator_options` such as device="cuda", compute_type="int8", intra_threads=2: `THREADS` where not given), its
    `tokenizer` and its `generation_config` (the folder's generation_config.json, or the paper's search), the search
    it runs and options are checked against. `ranking`: "paper" (`ctranslate2_nbest`, GNMT, with `patience`) or
    "ctranslate2" (its own score, log P / |Y|^alpha). It takes target prefixes, blocked phrases and `<unk>` kept out;
    not constraints, sampling, alignments or ensembles (`TranslationOptions.check`). Its batches are CTranslate2's:
    `BATCH_SIZE` rows sorted by source tokens, a translate_batch call each (`_translate`)."""

    def __init__(self, folder: str | Path, patience: float = 1.0, ranking: str = "paper", **translator_options):
        import ctranslate2
        from transformers import AutoTokenizer, GenerationConfig

        if ranking not in RANKINGS:
            raise ValueError(f"ranking must be 'paper' or 'ctranslate2', not {ranking!r}")
        threads = THREADS or torch.get_num_threads()
        translator_options = {"device": "cpu", "intra_threads": threads, **translator_options}
        self.translator = ctranslate2.Translator(str(folder), **translator_options)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        if (Path(folder) / "generation_config.json").is_file():
            self.generation_config = GenerationConfig.from_pretrained(folder)
        else:
            self.generation_config = GenerationConfig(**PAPER_SEARCH, early_stopping="never")
        self.patience, self.ranking = patience, ranking
        limit = self.tokenizer.model_max_length
        self.max_source_tokens = limit if 0 < (limit or 0) < 10**9 else 1024
        self.facts = BackendFacts(f"the CTranslate2 folder {folder}", self.generation_config.num_beams or 1,
                                  tuple(OWN_SEARCH), nbest_lists=ranking == "paper", keywords=_keywords(ctranslate2),
                                  batch_size=BATCH_SIZE, by_tokens=True)  # fmt: skip

    def search(self, batch: Batch, options: TranslationOptions) -> tuple[list, None]:
        """The batch's translations (n-best lists with `options.nbest`) by CTranslate2, ranked by `ranking`: the
        request's beam, alpha and each sentence's length limit (`Search.limits`) as translate_batch takes them."""
        request, tokens, config = batch.search, self.tokenizer.convert_ids_to_tokens, self.generation_config
        beam = options.beams_given or config.num_beams or 1
        alpha = options.length_penalty if options.length_penalty is not None else config.length_penalty
        kwargs = {name: value for name, value in options.generate_kwargs.items() if name != "num_beams"}
        sources = [tokens(ids) for ids in batch.ids]
        # Less the `</s>` our search ends a sentence with at its §6.1 limit, which CTranslate2 does not count; at
        # max_new_tokens both cut.
        limits = [limit - (options.max_new_tokens is None) for limit in request.limits(config, map(len, batch.ids))]
        if "max_decoding_length" in kwargs:
            limits = [kwargs.pop("max_decoding_length")] * len(sources)
        prefixes = None if request.prefixes is None else [tokens(prefix) for prefix in request.prefixes]
        if request.blocked:
            kwargs["suppress_sequences"] = [tokens(list(form)) for form in request.blocked]
        if request.unk is not None:
            kwargs["disable_unk"] = True
        if self.ranking == "ctranslate2":  # its best of beam hypotheses (all of them: `_translate` reads their lengths)
            kwargs = {"beam_size": beam, "length_penalty": alpha, "num_hypotheses": _candidates(beam, 1.0)
                      if alpha != 0 else 1, **kwargs}  # fmt: skip
            texts = [self._text(result.hypotheses[0]) for result in _translate(self.translator, sources, limits,
                                                                                kwargs, prefixes)]  # fmt: skip
            return (texts if options.nbest is None else [[Hypothesis(t, 0.0, 0.0)] for t in texts]), None
        ranked = _ranked(self.translator, sources, limits, beam, alpha, self.patience, prefixes, kwargs)
        if options.nbest is None:  # only the best is decoded
            return [self._text(row[0][0]) for row in ranked], None
        return [[Hypothesis(self._text(t), log_prob, score) for t, log_prob, score in row[: options.nbest]]
                for row in ranked], None  # fmt: skip

    def _text(self, tokens: list[str]) -> str:
        """A hypothesis's tokens as our search's are decoded: special tokens dropped, one line."""
        ids = self.tokenizer.convert_tokens_to_ids(tokens)
        return single_line(self.tokenizer.decode(ids, skip_special_tokens=True))


def load_ctranslate2(model: str | Path, compute_type: str | None = None, models: int = 1,
                     threads: int | None = None) -> CTranslate2Model:  # fmt: skip
    """A CTranslate2 export (`export_model(..., "ctranslate2", ...)`) as a `CTranslate2Model`, what the commands
    translate with when --model names one: `compute_type` is CTranslate2's ("float32", "int8", "bfloat16", "auto",
    ...; None: the type it was saved in), `threads` its `intra_threads` (None: `THREADS`); on this process's GPU
    where there is one. A folder that cannot serve raises `ModelFolderError`, one line: a missing tokenizer.json, a
    bad generation_config.json, no `ctranslate2` package, a compute type this machine lacks, an ensemble (`models` >
    1)."""
    from vaswani_mt.inference.loading import check_ctranslate2_folder

    if models > 1:
        raise ModelFolderError("an ensemble (several --model) needs vaswani_mt's own models: a CTranslate2 folder "
                               "translates alone; translate the vaswani_mt folders they came from")  # fmt: skip
    folder = check_ctranslate2_folder(str(model))
    options = {"compute_type": compute_type} if compute_type is not None else {}
    if threads is not None:
        options["intra_threads"] = threads
    try:
        import ctranslate2
    except ImportError:
        raise ModelFolderError(f"{model} is a CTranslate2 export: translating with it needs the ctranslate2 package "
                               "(pip install 'vaswani-mt[ctranslate2]')") from None  # fmt: skip
    if torch.cuda.is_available() and ctranslate2.get_cuda_device_count() > 0:  # this process's GPU (one per shard)
        options.update(device="cuda", device_index=torch.cuda.current_device())
    try:
        return CTranslate2Model(folder, **options)
    except (RuntimeError, ValueError, OSError) as error:
        raise ModelFolderError(f"{model}: CTranslate2 cannot load it ({error_line(error)})") from error


__all__ = ["BATCH_SIZE", "RANKINGS", "THREADS", "CTranslate2Model", "ctranslate2_generate", "ctranslate2_nbest",
           "ctranslate2_search", "load_ctranslate2"]  # fmt: skip
