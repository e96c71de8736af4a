"""The paper's beam search (§6.1) as hooks into transformers' `generate()`.

"We used beam search with a beam size of 4 and length penalty alpha = 0.6 [...] We set the maximum output length
during inference to input length + 50, but terminate early when possible." transformers' beam search does the
search; what it lacks is hooked in here, kept apart from the architecture as transformers keeps its generation code
apart from its models:

- `PAPER_SEARCH`: the generation config every new model starts with (beam 4, alpha 0.6, `|X| + 50`);
- `gnmt_length_penalty`: the penalty the paper's alpha belongs to (Wu et al., 2016);
- `PerSentenceMaxLength`: each sentence's own `|X| + 50` limit;
- `VaswaniGenerationMixin`: `generate()` with that limit, the GNMT penalty for finished hypotheses, early
  termination bounded with it, and a beam reordering that leaves the encoder-decoder attention cache alone.

Self-contained (torch and transformers only): modeling_vaswani.py imports it relatively, so that `save_pretrained`
copies it next to the model code and a saved folder loads it as Hub remote code.
"""

from __future__ import annotations

import torch
from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import Cache, EncoderDecoderCache

# §6.1's search, the generation config every new model starts with: beam size 4, GNMT length penalty alpha 0.6,
# at most max_len_a * |X| + max_len_b output tokens (fairseq's names) = input length + 50.
PAPER_SEARCH = {"num_beams": 4, "length_penalty": 0.6, "max_len_a": 1, "max_len_b": 50}


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """§6.1 and Wu et al. (2016): `lp(Y) = ((5 + |Y|) / (5 + 1))^alpha`; beam scores are `log P(Y|X) / lp(Y)`."""
    return ((5.0 + length) / 6.0) ** alpha


class PerSentenceMaxLength(LogitsProcessor):
    """§6.1 "maximum output length = input length + 50": each sentence stops at its own `a * |X| + b` tokens.

    transformers' `max_length`/`max_new_tokens` is one limit for the whole batch. At a sentence's last allowed step
    only EOS stays possible; its score is left as the model's own log-probability, so beam scores remain true
    `log P(Y|X)`.
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


class VaswaniGenerationMixin(GenerationMixin):
    """transformers' `GenerationMixin` with the paper's search (§6.1): beam size 4, the GNMT length penalty with
    alpha = 0.6, a maximum output length of each sentence's own input length + 50, and early termination when no
    running hypothesis can still beat the finished ones."""

    def _use_paper_search(self) -> None:
        """Sets the model's generation config to `PAPER_SEARCH`, terminating early only when the bound allows it."""
        for key, value in PAPER_SEARCH.items():
            setattr(self.generation_config, key, value)
        self.generation_config.early_stopping = "never"
        # These are our own settings, not copies of the model config: without this, loading drops max_len_a/b.
        self.generation_config._from_model_config = False

    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, logits_processor=None, **kwargs):
        """`GenerationMixin.generate` with the paper's defaults: 4 beams, GNMT length penalty with alpha 0.6 and a
        maximum output length of each sentence's own input length + 50.

        The per-sentence limit `max_len_a * |X| + max_len_b` (fairseq's names; the generation config holds a=1,
        b=50; `max_len_b=None` turns it off) applies unless `max_length` or `max_new_tokens` is passed to this call,
        or `max_new_tokens` is set in the `generation_config` passed to it. It replaces a `max_length` that the
        model's generation config holds (Seq2SeqTrainer writes transformers' default, 20, there), so transformers
        does not warn that both are set. Overriding `generate` is the one hook: transformers' length limits are one
        number for the whole batch.
        """
        gen_config = generation_config if generation_config is not None else self.generation_config
        max_len_a = kwargs.pop("max_len_a", getattr(gen_config, "max_len_a", None))
        max_len_b = kwargs.pop("max_len_b", getattr(gen_config, "max_len_b", None))
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        explicit_length = "max_length" in kwargs or "max_new_tokens" in kwargs
        if generation_config is not None and generation_config.max_new_tokens is not None:
            explicit_length = True
        if max_len_b is not None and not explicit_length and input_ids is not None:
            mask = kwargs.get("attention_mask")
            source_lengths = mask.sum(-1) if mask is not None else input_ids.ne(self.config.pad_token_id).sum(-1)
            limits = (float(max_len_a or 0) * source_lengths + max_len_b).long().clamp(min=1)
            # The batch's longest limit bounds the search; `max_length=None` clears any `max_length` of the
            # generation configs in this call only, so `max_new_tokens` is the one length limit and nothing clashes.
            kwargs["max_new_tokens"] = int(limits.max())
            kwargs["max_length"] = None
            eos = gen_config.eos_token_id if gen_config.eos_token_id is not None else self.config.eos_token_id
            eos = eos[0] if isinstance(eos, list) else eos
            logits_processor = LogitsProcessorList(list(logits_processor or []))
            logits_processor.append(PerSentenceMaxLength(limits, eos))
        return super().generate(
            inputs, generation_config=generation_config, logits_processor=logits_processor, **kwargs
        )

    def _reorder_cache(self, cache: Cache, beam_idx: torch.Tensor) -> Cache:
        """Beam search's reordering after each step, for self-attention only: every beam of a sentence holds the
        same encoder-decoder attention keys and values (beams only move within their sentence), so reordering
        those, as transformers' own reordering does, would copy the whole encoder cache at every step for nothing."""
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache

    def _update_finished_beams(self, **kwargs):
        """Scores finished hypotheses with the GNMT penalty `log P(Y|X) / ((5 + |Y|) / 6)^alpha` (§6.1) instead of
        transformers' `log P(Y|X) / |Y|^alpha`, which has no other penalty. |Y| counts generated tokens with the final
        EOS and without the decoder start token."""
        # transformers passes every argument by keyword (generation/utils.py, `_beam_search`).
        length = kwargs["cur_len"] + 1 - kwargs["decoder_prompt_len"]
        kwargs["topk_log_probs"] = kwargs["topk_log_probs"] / gnmt_length_penalty(length, kwargs["length_penalty"])
        kwargs["length_penalty"] = 0.0  # transformers then divides by |Y|^0 = 1
        return super()._update_finished_beams(**kwargs)

    @staticmethod
    def _check_early_stop_heuristic(
        is_early_stop_heuristic_unsatisfied: torch.Tensor,
        running_beam_scores: torch.Tensor,
        beam_scores: torch.Tensor,
        is_sent_finished: torch.Tensor,
        cur_len: int,
        max_length: int,
        decoder_prompt_len: int,
        early_stopping: bool | str,
        length_penalty: float,
    ) -> torch.Tensor:
        """Early termination (§6.1) with the GNMT penalty: a sentence is done when even the best running hypothesis,
        scored with the largest penalty it could still reach, cannot beat the worst finished one (tensor2tensor's
        bound; exact with `early_stopping="never"`). transformers' own bound uses its `|Y|^alpha` penalty."""
        if early_stopping == "never" and length_penalty > 0.0:
            best_length = max_length - decoder_prompt_len
        else:
            best_length = cur_len - decoder_prompt_len
        best_running = running_beam_scores[:, :1] / gnmt_length_penalty(best_length, length_penalty)
        worst_finished = torch.where(is_sent_finished, torch.min(beam_scores, dim=1, keepdim=True)[0], -1.0e9)
        return is_early_stop_heuristic_unsatisfied & torch.any(best_running > worst_finished, dim=-1, keepdim=True)


__all__ = ["PAPER_SEARCH", "PerSentenceMaxLength", "VaswaniGenerationMixin", "gnmt_length_penalty"]
