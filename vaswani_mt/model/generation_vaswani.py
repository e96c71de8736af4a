"""The paper's search (§6.1) behind transformers' `generate()`, on its public API.

"We used beam search with a beam size of 4 and length penalty alpha = 0.6 [...] We set the maximum output length
during inference to input length + 50, but terminate early when possible." `generate()` starts from these settings,
gives each sentence its own length limit, refuses the options the search does not implement, and runs `beam_search`
(beam_search_vaswani.py) for `num_beams > 1`, with terminology constraints (constraints_vaswani.py) and forced target
prefixes; greedy search and sampling are transformers' own. Self-contained (torch and transformers only), so that
`save_pretrained` copies it as Hub remote code.
"""

from __future__ import annotations

import copy

import torch
from transformers import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import EncoderDecoderCache

from .beam_search_vaswani import beam_search
from .constraints_vaswani import search_controls

# §6.1's search, the generation config every new model starts with: beam size 4, GNMT length penalty alpha 0.6,
# at most max_len_a * |X| + max_len_b output tokens (fairseq's names) = input length + 50.
PAPER_SEARCH = {"num_beams": 4, "length_penalty": 0.6, "max_len_a": 1, "max_len_b": 50}
# "Terminate early when possible" names no rule. fairseq's (a sentence is done once `num_beams` hypotheses have
# finished: early_stopping=True) loses no BLEU to the exact bound ("never") on test or dev, in 0.4x its decoder steps
# (benchmarks/RESULTS.md, 2026-11-26 stopping rules). A saved generation_config.json keeps the rule it was saved with.
PAPER_STOPPING = True
# When a sentence with terms is done (`constrained_stopping`): "best", the default, also once no running hypothesis
# can beat its `num_return_sequences`-th finished one, at any length it may still reach under early_stopping="never"
# (so it returns what "beam" returns, in fewer steps: RESULTS.md, 2026-11-28 the constrained search), at its current
# length otherwise, as the plain rule reads it (2026-11-29 bf16 and prepared weights: 0.67x the rows, BLEU equal);
# "beam", by `early_stopping` alone (with True: once `num_beams` hypotheses that meet its terms have finished, as
# fairseq's constrained search).
CONSTRAINED_STOPPING = ("best", "beam")


def _constrained_stopping(kwargs: dict, gen_config: GenerationConfig) -> str:
    """This call's `constrained_stopping` (taken out of `kwargs`), else the saved one, else the default ("best")."""
    rule = kwargs.pop("constrained_stopping", getattr(gen_config, "constrained_stopping", None))
    if rule not in (None, *CONSTRAINED_STOPPING):
        raise ValueError(f"constrained_stopping must be one of {', '.join(CONSTRAINED_STOPPING)}, not {rule!r}")
    return rule or CONSTRAINED_STOPPING[0]


def sentence_limits(max_len_a: float | None, max_len_b: int, source_lengths: torch.Tensor) -> torch.Tensor:
    """§6.1's per-sentence output limit, fairseq's `max_len_a * |X| + max_len_b` generated tokens (EOS included)."""
    return (float(max_len_a or 0) * source_lengths + max_len_b).long().clamp(min=1)


class PerSentenceMaxLength(LogitsProcessor):
    """§6.1 "maximum output length = input length + 50": each sentence stops at its own `a * |X| + b` tokens.

    (transformers' `max_length` is one limit for the whole batch.) At a sentence's last allowed step only EOS stays
    possible, its score left as the model's, so beam scores remain true `log P(Y|X)`.
    """

    def __init__(self, max_lengths: torch.Tensor, eos_token_id: int):
        self.max_lengths = max_lengths  # generated tokens allowed per sentence, EOS included
        self.eos_token_id = eos_token_id
        self.prompt_length: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        generated = input_ids.shape[1] - self.prompt_length
        limits = self.max_lengths.to(scores.device).repeat_interleave(scores.shape[0] // self.max_lengths.shape[0])
        at_limit = generated + 1 >= limits
        if at_limit.any():
            eos_scores = scores[:, self.eos_token_id].clone()
            scores = scores.masked_fill(at_limit[:, None], -float("inf"))
            scores[:, self.eos_token_id] = torch.where(at_limit, eos_scores, scores[:, self.eos_token_id])
        return scores

    def keep_sentences(self, going: torch.Tensor) -> None:
        """Only the sentences `going` (indices of the current ones) are searched on: the beam search's finished
        sentences leave the batch."""
        self.max_lengths = self.max_lengths[going.to(self.max_lengths.device)]


# Generation options that change the search in ways `beam_search` does not implement: refused with beams, not ignored.
_UNSUPPORTED_WITH_BEAMS = {
    "do_sample": False, "num_beam_groups": 1, "diversity_penalty": 0.0, "sequence_bias": None, "guidance_scale": None,
    "encoder_repetition_penalty": 1.0, "encoder_no_repeat_ngram_size": 0, "exponential_decay_length_penalty": None,
    "remove_invalid_values": False, "low_memory": None, "max_time": None, "stop_strings": None,
    "prefix_allowed_tokens_fn": None,
}  # fmt: skip


class VaswaniGenerationMixin(GenerationMixin):
    """transformers' `GenerationMixin` with the paper's search (§6.1) from `generate()`: beam 4, GNMT alpha 0.6,
    each sentence's input length + 50, a sentence done once 4 hypotheses have finished (`PAPER_STOPPING`; or, with
    early_stopping="never", once no running hypothesis can win: `beam_search`)."""

    def _use_paper_search(self) -> None:
        """Sets the model's generation config to `PAPER_SEARCH`, stopping by `PAPER_STOPPING`."""
        # A new config rather than transformers' own: that one is derived from the model config and saved marked so,
        # and loading a config so marked drops the keys GenerationConfig does not know, max_len_a/b among them.
        derived = self.generation_config.to_diff_dict()
        settings = {
            key: value for key, value in derived.items() if not key.startswith("_") and key != "transformers_version"
        }
        self.generation_config = GenerationConfig(**{**settings, **PAPER_SEARCH, "early_stopping": PAPER_STOPPING})

    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        stopping_criteria: StoppingCriteriaList | None = None,
        **kwargs,
    ):
        """`GenerationMixin.generate` with the paper's defaults (§6.1); `num_beams > 1` runs `beam_search`.

        The per-sentence limit `max_len_a * |X| + max_len_b` (a=1, b=50; `max_len_b=None` turns it off) applies
        unless this call passes `max_length` or `max_new_tokens`, or its `generation_config` sets `max_new_tokens`.
        It replaces a `max_length` in the model's generation config (Seq2SeqTrainer writes transformers' 20 there).
        """
        gen_config = generation_config if generation_config is not None else self.generation_config
        controls = {name: kwargs.pop(name) for name in ("constraints", "constraint_order", "target_prefix")
                    if name in kwargs}  # fmt: skip
        limits = None
        # The constrained sentences' own alpha (evaluation/terminology.py): this call's, else the saved one, unless
        # this call sets `length_penalty` alone (then that one is every sentence's).
        saved_alpha = None if "length_penalty" in kwargs else getattr(gen_config, "constrained_length_penalty", None)
        constrained_alpha = kwargs.pop("constrained_length_penalty", saved_alpha)
        constrained_stopping = _constrained_stopping(kwargs, gen_config)
        max_len_a = kwargs.pop("max_len_a", getattr(gen_config, "max_len_a", None))
        max_len_b = kwargs.pop("max_len_b", getattr(gen_config, "max_len_b", None))
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        explicit_length = "max_length" in kwargs or "max_new_tokens" in kwargs
        if generation_config is not None and generation_config.max_new_tokens is not None:
            explicit_length = True
        logits_processor = LogitsProcessorList(list(logits_processor or []))
        if max_len_b is not None and not explicit_length and input_ids is not None:
            mask = kwargs.get("attention_mask")
            source_lengths = mask.sum(-1) if mask is not None else input_ids.ne(self.config.pad_token_id).sum(-1)
            limits = sentence_limits(max_len_a, max_len_b, source_lengths)
            # The batch's longest limit bounds the search; `max_length=None` (this call only) leaves it the one limit.
            kwargs["max_new_tokens"] = int(limits.max())
            kwargs["max_length"] = None
            eos = gen_config.eos_token_id if gen_config.eos_token_id is not None else self.config.eos_token_id
            eos = eos[0] if isinstance(eos, list) else eos
            logits_processor.append(PerSentenceMaxLength(limits, eos))
        config, model_kwargs = self._vaswani_search_config(gen_config, kwargs)
        config.constrained_length_penalty = constrained_alpha  # the constrained sentences' alpha (None: the same)
        config.constrained_stopping = constrained_stopping
        if config.do_sample and (config.num_beams or 1) > 1:
            raise ValueError(
                f"do_sample=True with {config.num_beams} beams (beam sampling) is not the paper's search: sample with "
                "num_beams=1, or search with do_sample=False"
            )
        if config.num_beams is None or config.num_beams <= 1:
            if controls.get("constraints") is not None or controls.get("target_prefix") is not None:
                raise ValueError("constraints and target prefixes need beam search (num_beams > 1), not greedy search "
                                 "or sampling")  # fmt: skip
            return super().generate(
                inputs, generation_config=generation_config, logits_processor=logits_processor or None,
                stopping_criteria=stopping_criteria, **kwargs,
            )  # fmt: skip
        if input_ids is None:
            raise ValueError("the paper's beam search needs input_ids (the source token ids)")
        attention_mask = model_kwargs.pop("attention_mask", None)
        if attention_mask is None:
            attention_mask = input_ids.ne(self.config.pad_token_id).long()
        model_kwargs.pop("input_ids", None)
        encoder_outputs = model_kwargs.pop("encoder_outputs", None)
        for name in ("synced_gpus", "labels"):  # Seq2SeqTrainer's: one process decodes on its own, without targets
            model_kwargs.pop(name, None)
        unknown = sorted(k for k, v in model_kwargs.items() if v is not None)
        if unknown:
            raise ValueError(f"generate() with {config.num_beams} beams does not take {', '.join(unknown)}")
        batch, device = input_ids.shape[0], input_ids.device
        constraints, prefix = search_controls(controls, batch, limits, config.max_length, device)
        output = beam_search(self, input_ids, attention_mask, config, logits_processor, stopping_criteria,
                             encoder_outputs=encoder_outputs, constraints=constraints,
                             target_prefix=prefix)  # fmt: skip
        if controls.get("constraints") is not None and constraints is None and config.return_dict_in_generate:
            # No sentence of the batch has a constraint (the search ran without them): every one is met, vacuously.
            output.constraints_met = torch.ones(batch * config.num_return_sequences, 1, dtype=torch.bool,
                                                device=device)  # fmt: skip
            output.constraints_placed = [[] for _ in range(batch * config.num_return_sequences)]
        return output

    def _vaswani_search_config(self, generation_config: GenerationConfig, kwargs: dict):
        """The generation config of this call (a copy, with the call's options) and the keywords left for the model;
        options `beam_search` does not implement are refused when beams search."""
        config = copy.deepcopy(generation_config)
        model_kwargs = config.update(**{k: v for k, v in kwargs.items() if k != "max_new_tokens"})
        if kwargs.get("max_new_tokens") is not None:
            config.max_new_tokens = kwargs["max_new_tokens"]
        if config.max_new_tokens is not None:
            config.max_length = config.max_new_tokens + 1  # with the decoder start token
        for name in ("eos_token_id", "pad_token_id", "decoder_start_token_id"):
            if getattr(config, name) is None:
                setattr(config, name, getattr(self.config, name, None))
        config.num_return_sequences = config.num_return_sequences or 1
        config.length_penalty = 1.0 if config.length_penalty is None else config.length_penalty
        if config.num_beams and config.num_beams > 1 and not config.do_sample:
            for name, neutral in _UNSUPPORTED_WITH_BEAMS.items():
                value = getattr(config, name, neutral)
                if value not in (neutral, None) and not (isinstance(neutral, float) and value == neutral):
                    raise ValueError(f"generate() with {config.num_beams} beams does not take {name}={value!r}")
            if config.num_return_sequences > config.num_beams:
                raise ValueError(
                    f"num_return_sequences ({config.num_return_sequences}) is more than num_beams ({config.num_beams})"
                )
        return config, model_kwargs

    def reorder_beam_cache(self, cache, beam_idx: torch.Tensor) -> None:
        """Moves each beam's self-attention keys and values to the hypothesis that continues it. The encoder-decoder
        cache stays: every beam of a sentence holds the same one, and beams only move within their sentence."""
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)


__all__ = [
    "CONSTRAINED_STOPPING",
    "PAPER_SEARCH",
    "PAPER_STOPPING",
    "PerSentenceMaxLength",
    "VaswaniGenerationMixin",
    "sentence_limits",
]
