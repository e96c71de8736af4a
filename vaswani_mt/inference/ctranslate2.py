"""Translating with a CTranslate2 export (`vaswani-mt-export --format ctranslate2`; the converter is
export/ctranslate2.py): `CTranslate2Model(folder)`, a backend of the `Translator` (backends.py's protocol), searches
with the model's own search (`ctranslate2_search`) and ranks as the paper ranks (`ctranslate2_nbest`: CTranslate2's
hypotheses re-ranked by §6.1's GNMT score; `ranking="ctranslate2"`: its own). The commands take such a folder as
`--model` (`load_ctranslate2`). `ctranslate2_generate` translates batches of our token ids. `ctranslate2` is an
optional dependency (`pip install vaswani-mt[ctranslate2]`), imported when used. How to run it: docs/export.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from vaswani_mt.inference.backends import Batch
from vaswani_mt.inference.loading import ModelFolderError
from vaswani_mt.inference.options import OWN_SEARCH, BackendFacts, Hypothesis, TranslationOptions
from vaswani_mt.model.beam_search_vaswani import gnmt_length_penalty
from vaswani_mt.model.generation_vaswani import PAPER_SEARCH, sentence_limits
from vaswani_mt.model.pipeline_vaswani import single_line
from vaswani_mt.system.messages import error_line

# The generation_config.json keys of the model's search (§6.1), and their names among translate_batch's options.
_SEARCH_OPTIONS = {"num_beams": "beam_size", "length_penalty": "length_penalty"}
_LENGTH_RULE = ("max_len_a", "max_len_b")
# The paper's search in those names: what `ctranslate2_nbest` searches with where a folder saved none.
_PAPER_SEARCH = {_SEARCH_OPTIONS.get(name, name): value for name, value in PAPER_SEARCH.items()}
# CTranslate2 marks the beams a target prefix forces beside the first with a score of -1e10: `score_batch` scores
# them, so that an n-best list still has its K entries, each with its true log-probability.
_FORCED_BEAM = -1.0e9


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
    ((5 + |Y|) / 6)^alpha does at |Y| = n, a translation's expected length (lp = alpha lost more of them: issue 44,
    item 5)."""
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
            if len(tokens) >= limits[i] or score <= _FORCED_BEAM:  # a beam a prefix forced is scored whole too
                cut.append((i, len(row)))
            row.append([tokens, score * (len(tokens) + 1) ** lps[i] + prefix_log_probs[i]])
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
    results = _translate_batch(translator, sources, search, options)
    return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]


RANKINGS = ("paper", "ctranslate2")


def _keywords(ctranslate2) -> frozenset[str]:
    """The keywords a CTranslate2 folder's search takes beside the options' own fields: translate_batch's (read from
    its signature, the first line of its docstring), and `num_beams` (`beams_given`)."""
    signature = ctranslate2.Translator.translate_batch.__doc__.split("\n", 1)[0]
    return frozenset({*re.findall(r"(\w+): ", signature.split("*", 1)[-1]), "num_beams"})


class CTranslate2Model:
    """A CTranslate2 export as a `Translator` backend: its `translator` (`ctranslate2.Translator`;
    `translator_options` such as device="cuda", compute_type="int8", intra_threads=2), its `tokenizer`, its `search`
    (`ctranslate2_search`) and its `generation_config` (the folder's generation_config.json, or the paper's search),
    which options are checked against. `ranking`: "paper" (`ctranslate2_nbest`, GNMT, with `patience`) or
    "ctranslate2" (its own score, log P / |Y|^alpha). It takes target prefixes, blocked phrases and `<unk>` kept out;
    not constraints, sampling, alignments or ensembles (`TranslationOptions.check`)."""

    def __init__(self, folder: str | Path, patience: float = 1.0, ranking: str = "paper", **translator_options):
        import ctranslate2
        from transformers import AutoTokenizer, GenerationConfig

        if ranking not in RANKINGS:
            raise ValueError(f"ranking must be 'paper' or 'ctranslate2', not {ranking!r}")
        self.translator = ctranslate2.Translator(str(folder), **{"device": "cpu", **translator_options})
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.search_options = ctranslate2_search(folder)
        if (Path(folder) / "generation_config.json").is_file():
            self.generation_config = GenerationConfig.from_pretrained(folder)
        else:
            self.generation_config = GenerationConfig(**PAPER_SEARCH, early_stopping="never")
        self.patience, self.ranking = patience, ranking
        limit = self.tokenizer.model_max_length
        self.max_source_tokens = limit if 0 < (limit or 0) < 10**9 else 1024
        self.facts = BackendFacts(f"the CTranslate2 folder {folder}", self.generation_config.num_beams or 1,
                                  tuple(OWN_SEARCH), nbest_lists=ranking == "paper",
                                  keywords=_keywords(ctranslate2))  # fmt: skip

    def search(self, batch: Batch, options: TranslationOptions) -> tuple[list, None]:
        """The batch's translations (n-best lists with `options.nbest`) by CTranslate2, ranked by `ranking`."""
        request, tokens = batch.search, self.tokenizer.convert_ids_to_tokens
        given = {"beam_size": options.beams_given, "length_penalty": options.length_penalty,
                 "max_len_a": options.max_len_a, "max_len_b": options.max_len_b}  # fmt: skip
        search = {**self.search_options, **{name: value for name, value in given.items() if value is not None}}
        kwargs = {name: value for name, value in options.generate_kwargs.items() if name != "num_beams"}
        if options.max_new_tokens is not None:  # the same count: tokens generated, </s> among them
            kwargs["max_decoding_length"] = options.max_new_tokens
        prefixes = None if request.prefixes is None else [tokens(prefix) for prefix in request.prefixes]
        if request.blocked:
            kwargs["suppress_sequences"] = [tokens(list(form)) for form in request.blocked]
        if request.unk is not None:
            kwargs["disable_unk"] = True
        if options.max_tokens is not None:
            kwargs.update(max_batch_size=options.max_tokens, batch_type="tokens")
        sources = [tokens(ids) for ids in batch.ids]
        if self.ranking == "ctranslate2":
            found = _translate_batch(self.translator, sources, search, {"max_input_length": 0, **kwargs}, prefixes)
            texts = [self._text(result.hypotheses[0]) for result in found]
            return (texts if options.nbest is None else [[Hypothesis(t, 0.0, 0.0)] for t in texts]), None
        ranked = ctranslate2_nbest(self.translator, sources, search, prefixes, self.patience, **kwargs)
        lists = [[Hypothesis(self._text(t), log_prob, score) for t, log_prob, score in row] for row in ranked]
        if options.nbest is None:
            return [row[0].text for row in lists], None
        return [row[: options.nbest] for row in lists], None

    def _text(self, tokens: list[str]) -> str:
        """A hypothesis's tokens as our search's are decoded: special tokens dropped, one line."""
        ids = self.tokenizer.convert_tokens_to_ids(tokens)
        return single_line(self.tokenizer.decode(ids, skip_special_tokens=True))


def load_ctranslate2(model: str | Path, compute_type: str | None = None, models: int = 1,
                     threads: int | None = None) -> CTranslate2Model:  # fmt: skip
    """A CTranslate2 export (`export_model(..., "ctranslate2", ...)`) as a `CTranslate2Model`, what the commands
    translate with when --model names one: `compute_type` is CTranslate2's ("float32", "int8", "bfloat16", "auto",
    ...; None: the type it was saved in), `threads` its `intra_threads`; on this process's GPU where there is one.
    A folder that cannot serve raises `ModelFolderError`, one line: a missing tokenizer.json, a bad
    generation_config.json, no `ctranslate2` package, a compute type this machine lacks, an ensemble (`models` > 1)."""
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


__all__ = ["RANKINGS", "CTranslate2Model", "ctranslate2_generate", "ctranslate2_nbest", "ctranslate2_search",
           "load_ctranslate2"]  # fmt: skip
