"""The backends a `Translator` searches with, behind one protocol (`Backend`): one thing each, the translations of one
batch of encoded sources with the batch's controls. `TorchBackend` runs our model (or an ensemble of them) at a
compute type; `inference.ctranslate2.CTranslate2Model` runs a CTranslate2 export. Everything per line (blank lines,
cut sources, controls and their report, batching, alignment and markup stages) is the translator's, above them.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.modeling_outputs import BaseModelOutput

from vaswani_mt.inference.alignments import align_outputs, supervised_head, with_placed
from vaswani_mt.inference.ensemble import VaswaniEnsemble
from vaswani_mt.inference.options import BackendFacts, Hypothesis, Sampling, TranslationOptions
from vaswani_mt.model.beam_search_vaswani import gnmt_length_penalty
from vaswani_mt.model.generation_vaswani import sentence_limits
from vaswani_mt.model.pipeline_vaswani import default_max_source_tokens, single_line


class Search(NamedTuple):
    """What a backend is asked to search, one value of ours for every backend: the `options` (beams, penalties,
    limits, n-best, sampling, alignments wanted), the token ids no translation contains (`blocked` phrases' forms;
    `unk`, <unk>'s id where it is kept out), and a batch's controls, per row: the forms of its `terms` (in `order`)
    and its `prefixes` ids (None: no row has any). Each backend reads it in its own terms."""

    options: TranslationOptions
    blocked: tuple = ()
    unk: int | None = None
    terms: list | None = None
    order: str = "unordered"
    prefixes: list | None = None

    def limits(self, config, source_tokens: Iterable[int]) -> list[int]:
        """Tokens each translation of sources of `source_tokens` tokens may have, `</s>` counted, as our `generate()`
        limits them: `max_new_tokens`; `max_length` less the decoder start; §6.1's `max_len_a · |X| + max_len_b`
        (`sentence_limits`: the options', else the model's `config`, its generation config); else the config's
        `max_length`. The one rule: a line's room for its controls (controls.py) and CTranslate2's limits."""
        kwargs, lengths = self.options.search_kwargs(), list(source_tokens)
        if kwargs.get("max_new_tokens") is not None:
            return [int(kwargs["max_new_tokens"])] * len(lengths)
        if kwargs.get("max_length") is not None:
            return [int(kwargs["max_length"]) - 1] * len(lengths)
        a = kwargs.get("max_len_a", getattr(config, "max_len_a", None))
        b = kwargs.get("max_len_b", getattr(config, "max_len_b", None))
        if b is None:
            return [int(config.max_length) - 1] * len(lengths)
        return sentence_limits(a, b, torch.tensor(lengths)).tolist()

    def generate_kwargs(self) -> dict:
        """The request as `generate()`'s keywords (our models' search)."""
        kwargs = self.options.search_kwargs()
        if self.blocked:
            kwargs["bad_words_ids"] = [list(form) for form in self.blocked]
        if self.unk is not None:
            kwargs["suppress_tokens"] = [self.unk]
        if self.terms is not None:
            kwargs.update(constraints=self.terms, constraint_order=self.order)
        if self.prefixes is not None:
            kwargs["target_prefix"] = self.prefixes
        return kwargs


class Batch(NamedTuple):
    """One batch of a chunk: source `ids` (each ending in `</s>`, cut to the limit), their input `lines` (0-based, for
    seeded sampling), their `sources` (texts, for alignments) and its `search` (`Search`)."""

    ids: list[list[int]]
    lines: list[int]
    sources: list[str]
    search: Search


class Backend(Protocol):
    """What a `Translator` needs of an engine: its `tokenizer`, its search's defaults (`generation_config`), the
    longest source it takes (`max_source_tokens`), the facts `TranslationOptions.check` reads (`facts`), and
    `search(batch, options)`: per row a text (or with `options.nbest` a list of `Hypothesis`, best first) and, with
    constraints, which terms each row's best translation met (else None)."""

    tokenizer: object
    generation_config: object
    max_source_tokens: int
    facts: BackendFacts

    def search(self, batch: Batch, options: TranslationOptions) -> tuple[list, object]: ...


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


def _decoder_layers(config) -> int:
    """The decoder's depth: ours (`num_decoder_layers`) or a transformers seq2seq model's (`decoder_layers`, Marian)."""
    return int(getattr(config, "num_decoder_layers", None) or getattr(config, "decoder_layers", 0))


class TorchBackend:
    """Our model, or a `VaswaniEnsemble`, searched by its `generate()` at `compute_type` (inference.compute_types:
    a converted copy, the model given unchanged; "float32": the model itself). `name` names it in messages."""

    def __init__(self, model, tokenizer, compute_type: str = "float32", name: str | None = None):
        from vaswani_mt.inference.compute_types import converted, resolve_compute_type

        compute_type = resolve_compute_type(compute_type, model.device)
        if compute_type != "float32" and model.dtype == torch.float32:
            model = converted(copy.deepcopy(model), compute_type)
        self.model, self.tokenizer, self._cache_kept = model.eval(), tokenizer, False
        self.generation_config = model.generation_config
        self.max_source_tokens = default_max_source_tokens(model, tokenizer)
        members = list(model.members) if isinstance(model, VaswaniEnsemble) else [model]
        self.facts = BackendFacts(
            name or getattr(model, "name_or_path", None) or "the model", model.generation_config.num_beams or 1,
            (), tuple(_decoder_layers(m.config) for m in members),
            all(supervised_head(m.config) for m in members),
        )  # fmt: skip

    def search(self, batch: Batch, options: TranslationOptions) -> tuple[list, object]:
        """The translations of `batch` (with `options.compile_step`, by the compiled decoder step: compiled.py)."""
        from vaswani_mt.inference.compiled import compiling, keep_compile_cache

        if options.compile_step is not None and not self._cache_kept:
            self._cache_kept = bool(keep_compile_cache())  # before the first compile of this process
        with compiling(options.compile_step):
            return self._search(batch, options)

    @torch.no_grad()
    def _search(self, batch: Batch, options: TranslationOptions) -> tuple[list, object]:
        from vaswani_mt.inference.compiled import compile_kwargs

        model, tokenizer = self.model, self.tokenizer
        kwargs = {**batch.search.generate_kwargs(), **compile_kwargs(options.compile_step)}
        inputs = tokenizer.pad({"input_ids": batch.ids}, return_tensors="pt").to(model.device)
        if options.sampling:
            sampler = _SeededSampler(options.sampler, batch.lines)
            kwargs = {**kwargs, "num_beams": 1, "do_sample": False, "logits_processor": LogitsProcessorList([sampler])}
        align = None
        if options.alignments is not None:
            encoded = None
            if not isinstance(model, VaswaniEnsemble) and tokenizer.padding_side == "right":
                # The search and the alignment pass share one run of the encoder (an ensemble's members encode).
                states = model.get_encoder()(inputs["input_ids"], attention_mask=inputs["attention_mask"])
                encoded = states.last_hidden_state, inputs["attention_mask"]
                kwargs = {**kwargs, "encoder_outputs": BaseModelOutput(last_hidden_state=encoded[0])}

            def align(sequences, placed=None):
                aligned = align_outputs(model, tokenizer, batch.sources, batch.ids, sequences, options.alignments,
                                        options.alignment_method or "default", encoded=encoded)  # fmt: skip
                return aligned if placed is None else with_placed(aligned, tokenizer, sequences, placed)

        if options.nbest is not None:
            return self._nbest(inputs, options.nbest, kwargs, align)
        output = model.generate(**inputs, **kwargs, return_dict_in_generate="constraints" in kwargs)
        met = placed = None
        if "constraints" in kwargs:  # which constraints each translation met, and where the search placed them
            placed = getattr(output, "constraints_placed", None)
            output, met = output.sequences, output.constraints_met
        if align is not None:
            return align(output, placed), met
        return [single_line(text) for text in tokenizer.batch_decode(output, skip_special_tokens=True)], met

    def _nbest(self, inputs, nbest: int, kwargs: dict, align) -> tuple[list[list[Hypothesis]], object]:
        """The `nbest` best hypotheses of each row, best first, with their log-probabilities and scores."""
        model = self.model
        beams = kwargs.get("num_beams") or model.generation_config.num_beams or 1
        output = model.generate(
            **inputs, **kwargs, num_return_sequences=nbest, return_dict_in_generate=True, output_scores=beams > 1,
            output_logits=beams == 1,
        )  # fmt: skip
        if beams > 1:
            # The search keeps each hypothesis' log P (so sentences still leave the batch); a model saved before it
            # did: the sum of its steps' (log-softmax outputs; a finished beam's steps past its end are 0 here).
            log_probs, scores = getattr(output, "sequences_log_probs", None), output.sequences_scores
            if log_probs is None:
                steps = model.compute_transition_scores(output.sequences, output.scores, output.beam_indices)
                log_probs = steps.sum(-1)
        else:
            # Greedy search's scores are processed logits (sampling noise): log-probabilities come from the raw logits.
            steps = model.compute_transition_scores(output.sequences, output.logits, normalize_logits=True)
            eos = torch.tensor(model.generation_config.eos_token_id, device=steps.device).flatten()
            ends = torch.isin(output.sequences[:, -steps.shape[1] :], eos)
            kept = (ends.cumsum(-1) - ends.long()) == 0
            log_probs = steps.masked_fill(~kept, 0.0).sum(-1)
            alpha = kwargs.get("length_penalty", model.generation_config.length_penalty)
            scores = log_probs / gnmt_length_penalty(kept.sum(-1), alpha if alpha is not None else 1.0)
        if align is None:
            decoded = self.tokenizer.batch_decode(output.sequences, skip_special_tokens=True)
            texts = [single_line(text) for text in decoded]
        else:
            texts = align(output.sequences, getattr(output, "constraints_placed", None))
        found = [Hypothesis(text, float(log_prob), float(score))
                 for text, log_prob, score in zip(texts, log_probs.tolist(), scores.tolist(), strict=True)]  # fmt: skip
        met = getattr(output, "constraints_met", None)
        lists = [found[start : start + nbest] for start in range(0, len(found), nbest)]
        return lists, None if met is None else met[::nbest]


__all__ = ["Backend", "Batch", "Search", "TorchBackend"]
