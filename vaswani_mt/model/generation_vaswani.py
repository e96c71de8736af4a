"""The paper's beam search (§6.1), ours, on transformers' public API.

"We used beam search with a beam size of 4 and length penalty alpha = 0.6 [...] We set the maximum output length
during inference to input length + 50, but terminate early when possible." Written against transformers' public
API only (the model's `forward`, `Cache`, `GenerationConfig`, `LogitsProcessor`), not by overriding private methods
of `GenerationMixin` that a later transformers may rename (the GNMT penalty would then silently fall back to
`|Y|^alpha`). `generate()` runs `beam_search` for `num_beams > 1`, with terminology constraints
(constraints_vaswani.py) and forced target prefixes; greedy search and sampling are transformers' own.
Self-contained (torch and transformers only), so that `save_pretrained` copies it as Hub remote code.
"""

from __future__ import annotations

import copy

import torch
from transformers import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import EncoderDecoderCache, StaticCache
from transformers.generation import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    GenerateBeamEncoderDecoderOutput,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import logging

from .constraints_vaswani import LexicalConstraints, allocate, search_controls

logger = logging.get_logger(__name__)

# §6.1's search, the generation config every new model starts with: beam size 4, GNMT length penalty alpha 0.6,
# at most max_len_a * |X| + max_len_b output tokens (fairseq's names) = input length + 50.
PAPER_SEARCH = {"num_beams": 4, "length_penalty": 0.6, "max_len_a": 1, "max_len_b": 50}


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """§6.1 and Wu et al. (2016): `lp(Y) = ((5 + |Y|) / (5 + 1))^alpha`; beam scores are `log P(Y|X) / lp(Y)`."""
    return ((5.0 + length) / 6.0) ** alpha


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


# Generation options that change the search in ways `beam_search` does not implement: refused with beams, not ignored.
_UNSUPPORTED_WITH_BEAMS = {
    "do_sample": False, "num_beam_groups": 1, "diversity_penalty": 0.0, "sequence_bias": None, "guidance_scale": None,
    "encoder_repetition_penalty": 1.0, "encoder_no_repeat_ngram_size": 0, "exponential_decay_length_penalty": None,
    "remove_invalid_values": False, "low_memory": None, "max_time": None, "stop_strings": None,
    "prefix_allowed_tokens_fn": None,
}  # fmt: skip


def _cache_of(outputs):
    """The KV cache a forward returned (transformers 5.24 renamed the field `past_key_values` to `cache`)."""
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else getattr(outputs, "past_key_values", None)


def _new_cache(model, config: GenerationConfig, max_length: int, source_length: int):
    """The KV cache the search starts with: None (the decoder makes a dynamic one), or with
    `cache_implementation="static"` a preallocated `StaticCache`, which torch.compile'd decoding needs."""
    if getattr(config, "cache_implementation", None) in (None, "dynamic"):
        return None
    if config.cache_implementation != "static":
        raise ValueError(f"the paper's beam search takes cache_implementation 'static' or none, not "
                         f"{config.cache_implementation!r}")  # fmt: skip
    return EncoderDecoderCache(StaticCache(config=model.config, max_cache_len=max_length),
                               StaticCache(config=model.config, max_cache_len=source_length))  # fmt: skip


def _compiled(model, compile_config):
    """`model`'s forward compiled with `torch.compile` and the options of a transformers `CompileConfig`, once per
    model and options."""
    options = {k: getattr(compile_config, k) for k in ("fullgraph", "dynamic", "backend", "mode", "options")}
    key = repr(sorted(options.items()))
    compiled = model.__dict__.setdefault("_vaswani_compiled_forwards", {})
    if key not in compiled:
        compiled[key] = torch.compile(model.__call__, **options)
    return compiled[key]


def _logits_processors(config: GenerationConfig, eos: torch.Tensor, device, user: LogitsProcessorList | None):
    """transformers' processors for the options `beam_search` takes, in the order `generate()` applies them, then
    the caller's."""
    processors = LogitsProcessorList()
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    if config.no_repeat_ngram_size:
        processors.append(NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
    if config.bad_words_ids is not None:
        processors.append(NoBadWordsLogitsProcessor(config.bad_words_ids, eos))
    if config.min_length:
        processors.append(MinLengthLogitsProcessor(config.min_length, eos, device=device))
    if config.min_new_tokens:
        processors.append(MinNewTokensLengthLogitsProcessor(1, config.min_new_tokens, eos, device=device))
    if config.forced_bos_token_id is not None:
        processors.append(ForcedBOSTokenLogitsProcessor(config.forced_bos_token_id))
    if config.forced_eos_token_id is not None:
        processors.append(ForcedEOSTokenLogitsProcessor(config.max_length, config.forced_eos_token_id, device=device))
    if config.suppress_tokens is not None:
        processors.append(SuppressTokensLogitsProcessor(config.suppress_tokens, device=device))
    if config.begin_suppress_tokens is not None:
        begin = 1 if config.forced_bos_token_id is None else 2
        processors.append(SuppressTokensAtBeginLogitsProcessor(config.begin_suppress_tokens, begin, device=device))
    processors.extend(user or [])
    return processors


def can_improve(
    *,
    improvable: torch.Tensor,
    running_scores: torch.Tensor,
    finished_scores: torch.Tensor,
    is_finished: torch.Tensor,
    generated: int,
    longest: int,
    early_stopping: bool | str,
    alpha: float,
) -> torch.Tensor:
    """Early termination (§6.1 "terminate early when possible"), per sentence: whether the best running hypothesis,
    scored with the largest GNMT penalty it could still reach (at `longest` generated tokens, with
    `early_stopping="never"` and alpha > 0: tensor2tensor's bound, exact; else at its current length, `generated`,
    transformers' heuristic), still beats the worst of the finished ones; a sentence that cannot stays done."""
    best_length = longest if early_stopping == "never" and alpha > 0.0 else generated
    best_running = running_scores[:, :1] / gnmt_length_penalty(best_length, alpha)
    worst_finished = torch.where(is_finished, torch.min(finished_scores, dim=1, keepdim=True)[0], -1.0e9)
    return improvable & torch.any(best_running > worst_finished, dim=-1, keepdim=True)


def _gather(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """`tensor[b, indices[b, k], ...]`: the beams `indices` picks in each sentence."""
    while indices.dim() < tensor.dim():
        indices = indices.unsqueeze(-1)
    return torch.take_along_dim(tensor, indices, dim=1)


@torch.no_grad()
def beam_search(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    config: GenerationConfig,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    encoder_outputs=None,
    constraints: LexicalConstraints | None = None,
    target_prefix: torch.Tensor | None = None,
):
    """§6.1's beam search over `model` (a `VaswaniGenerationMixin`): `config.num_beams` hypotheses per sentence,
    each step's top `2 * num_beams` continuations (so that `num_beams` go on when some end with EOS), finished ones
    scored `log P(Y|X) / ((5 + |Y|) / 6)^alpha` (|Y| counts the generated tokens with EOS), at most
    `config.max_length` tokens with the decoder start, and a sentence done once no running hypothesis can beat its
    worst finished one (`can_improve`). Returns what transformers' `generate()` returns for beam search: the ids,
    or with `return_dict_in_generate` a `GenerateBeamEncoderDecoderOutput`.

    `constraints` (`constraints_vaswani.LexicalConstraints`): phrases each output must contain (dynamic beam
    allocation); the output then has `constraints_met` ((batch * num_return_sequences, C) booleans, True where a
    sentence has no constraint: vacuously met), and sentences without constraints get exactly what they get without
    them. `target_prefix` ((batch, Lp), -1 after a row's
    prefix; a row of -1 is no prefix): tokens each output starts with, their log-probabilities counted."""
    num_beams, alpha = config.num_beams, float(config.length_penalty)
    batch, device = input_ids.shape[0], input_ids.device
    eos = torch.tensor([config.eos_token_id] if isinstance(config.eos_token_id, int) else config.eos_token_id,
                       device=device)  # fmt: skip
    keep = max(2, 1 + eos.numel()) * num_beams
    max_length = config.max_length
    dict_out = config.return_dict_in_generate
    want = {name: dict_out and bool(getattr(config, name)) for name in
            ("output_scores", "output_logits", "output_attentions", "output_hidden_states")}  # fmt: skip
    extra = {name: True for name in ("output_attentions", "output_hidden_states") if want[name]}
    if encoder_outputs is None:
        encoder_outputs = model.get_encoder()(input_ids, attention_mask=attention_mask, **extra)
    # Every beam of a sentence reads the same encoder states (and encoder-decoder keys and values).
    expanded = BaseModelOutput(last_hidden_state=encoder_outputs[0].repeat_interleave(num_beams, dim=0))
    mask = attention_mask.repeat_interleave(num_beams, dim=0)
    processors = _logits_processors(config, eos, device, logits_processor)
    pad = config.pad_token_id if config.pad_token_id is not None else int(eos[0])

    cur_len = prompt_len = 1
    running = torch.full((batch, num_beams, max_length), pad, dtype=torch.long, device=device)
    running[:, :, 0] = config.decoder_start_token_id
    finished = running.clone()
    running_scores = torch.zeros(batch, num_beams, device=device)
    running_scores[:, 1:] = -1e9  # only the first beam's tokens count at the first step: no k copies of one token
    finished_scores = torch.full((batch, num_beams), -1e9, device=device)
    is_finished = torch.zeros(batch, num_beams, dtype=torch.bool, device=device)
    improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)
    hits = torch.zeros(batch, num_beams, dtype=torch.bool, device=device)
    running_origins = torch.full((batch, num_beams, max_length - prompt_len), -1, dtype=torch.int32, device=device)
    finished_origins = running_origins.clone()
    top_mask = torch.arange(keep, device=device) < num_beams
    offsets = torch.arange(batch, device=device).view(-1, 1) * num_beams
    scores, raw, self_attentions, cross_attentions, hidden = [], [], [], [], []
    use_cache = config.use_cache is not False
    if constraints is not None:
        running_met, running_partial = constraints.initial_state(num_beams)
        finished_met = running_met.clone()
        constrained = constraints.rows[:, None]
        beam_of = torch.arange(num_beams, device=device)
    finished_keys = finished_scores.clone()  # what ranks finished hypotheses: met constraints first, then score
    cache = _new_cache(model, config, max_length, mask.shape[1]) if use_cache else None
    step = model

    while True:
        flat = running[:, :, :cur_len].reshape(batch * num_beams, cur_len)
        outputs = step(
            attention_mask=mask, decoder_input_ids=flat[:, -1:] if use_cache else flat, encoder_outputs=expanded,
            cache=cache, use_cache=use_cache, return_dict=True, **extra,
        )  # fmt: skip
        cache = _cache_of(outputs) if use_cache else None
        if cur_len == prompt_len and cache is not None and getattr(config, "compile_config", None) is not None:
            step = _compiled(model, config.compile_config)  # after the first step, as transformers compiles
        logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32, device=device)
        log_probs = processors(flat, torch.nn.functional.log_softmax(logits, dim=-1))
        if target_prefix is not None and cur_len - prompt_len < target_prefix.shape[1]:
            forced = target_prefix[:, cur_len - prompt_len].repeat_interleave(num_beams)
            others = torch.arange(log_probs.shape[-1], device=device) != forced[:, None]
            log_probs = log_probs.masked_fill((forced >= 0)[:, None] & others, -float("inf"))
        if constraints is not None:
            log_probs = _bar_eos(log_probs, ~constraints.satisfied(running_met).reshape(-1), eos)
        if want["output_logits"]:
            raw.append(logits.clone())
        if want["output_scores"]:
            scores.append(log_probs.clone())
        if want["output_attentions"]:
            self_attentions.append(outputs.decoder_attentions)
            cross_attentions.append(outputs.cross_attentions)
        if want["output_hidden_states"]:
            hidden.append(outputs.decoder_hidden_states)
        del outputs

        # The best `keep` continuations of all beams of each sentence, by log P(Y|X) so far.
        log_probs = log_probs.view(batch, num_beams, -1) + running_scores[:, :, None]
        vocab = log_probs.shape[-1]
        top_scores, top_indices = torch.topk(log_probs.reshape(batch, -1), k=keep)
        from_beam = top_indices // vocab
        top_sequences = _gather(running, from_beam)
        top_sequences[:, :, cur_len] = top_indices % vocab
        top_origins = _gather(running_origins, from_beam)
        top_origins[:, :, cur_len - prompt_len] = (from_beam + offsets).to(top_origins.dtype)

        hits = torch.isin(top_sequences[:, :, cur_len], eos) | (cur_len + 1 >= max_length)
        if stopping_criteria:
            flat_top = top_sequences[:, :, : cur_len + 1].reshape(batch * keep, -1)
            hits |= stopping_criteria(flat_top, tuple(scores) if want["output_scores"] else None).view(batch, keep)

        # The `num_beams` best that go on: those that did not just end.
        going_on = top_scores + hits.to(torch.float32) * -1.0e9
        chosen = torch.topk(going_on, k=num_beams)[1]
        ended = hits & top_mask[None, :]  # those that just ended among the top `num_beams`
        if constraints is not None:
            # More candidates (each beam's next constraint tokens and its own best token), taken by bank
            # (constraints_vaswani.allocate); sentences without constraints keep exactly the choice above.
            nxt, pursue = constraints.next_tokens(running_met, running_partial)
            nxt = nxt.reshape(batch, -1)
            extra_beams = torch.cat((beam_of.repeat_interleave(constraints.P), beam_of)).expand(batch, -1)
            best_scores, best_tokens = log_probs.max(-1)
            extra_tokens = torch.cat((nxt, best_tokens), dim=1)
            nxt_scores = torch.take_along_dim(log_probs, nxt.view(batch, num_beams, -1), dim=-1)
            extra_scores = torch.cat(
                (nxt_scores.masked_fill(~pursue, -float("inf")).reshape(batch, -1), best_scores), 1
            )
            tokens = torch.cat((top_indices % vocab, extra_tokens), dim=1)
            from_beam = torch.cat((from_beam, extra_beams), dim=1)
            all_scores = _without_repeats(torch.cat((top_scores, extra_scores), dim=1), from_beam * vocab + tokens)
            top_scores = torch.cat((top_scores, all_scores[:, keep:].masked_fill(~constrained, -float("inf"))), 1)
            top_sequences = _gather(running, from_beam)
            top_sequences[:, :, cur_len] = tokens
            top_origins = _gather(running_origins, from_beam)
            top_origins[:, :, cur_len - prompt_len] = (from_beam + offsets).to(top_origins.dtype)
            extra_hits = torch.isin(tokens[:, keep:], eos) | (cur_len + 1 >= max_length)
            if stopping_criteria:
                flat_extra = top_sequences[:, keep:, : cur_len + 1].reshape(-1, cur_len + 1)
                extra_hits |= stopping_criteria(flat_extra, tuple(scores) if want["output_scores"] else None).view(
                    batch, -1)  # fmt: skip
            hits = torch.cat((hits, extra_hits), dim=1)
            met, partial, banks, satisfied = constraints.advance(
                _window(top_sequences, cur_len, constraints.L), _gather(running_met, from_beam)
            )  # fmt: skip
            usable = ~hits & (top_scores > -1.0e8)
            # Hypotheses that can no longer fit their missing constraint tokens before the limit go last.
            left = constraints.room[:, None] - (cur_len + 1 - prompt_len)
            feasible = constraints.total[:, None] - banks <= left
            chosen = torch.where(constrained, allocate(top_scores, banks, usable, num_beams, feasible), chosen)
            going_on = top_scores + hits.to(torch.float32) * -1.0e9
            ended = torch.where(constrained, hits & (top_scores > -1.0e8),
                                torch.nn.functional.pad(ended, (0, hits.shape[1] - keep)))  # fmt: skip
            running_met, running_partial = _gather(met, chosen), _gather(partial, chosen)
        running, running_scores, running_origins = (
            _gather(top_sequences, chosen), _gather(going_on, chosen), _gather(top_origins, chosen)
        )  # fmt: skip

        # Those that just ended, scored with the GNMT penalty, against the finished ones.
        candidate = top_scores / gnmt_length_penalty(cur_len + 1 - prompt_len, alpha)
        candidate = (
            candidate
            + (torch.all(is_finished, dim=-1, keepdim=True) & (config.early_stopping is True)).to(torch.float32)
            * -1.0e9
        )
        candidate = candidate + (~improvable).to(torch.float32) * -1.0e9
        candidate = candidate + (~ended) * -1.0e9
        merged_scores = torch.cat((finished_scores, candidate), dim=1)
        # With constraints, a hypothesis that ended with one unmet ranks after all that met theirs.
        key = candidate if constraints is None else candidate - 1.0e5 * (~satisfied).to(torch.float32)
        merged_keys = torch.cat((finished_keys, key), dim=1)
        best = torch.topk(merged_keys, k=num_beams)[1]
        finished = _gather(torch.cat((finished, top_sequences), dim=1), best)
        finished_scores, finished_keys = _gather(merged_scores, best), _gather(merged_keys, best)
        if constraints is not None:
            finished_met = _gather(torch.cat((finished_met, met), dim=1), best)
        finished_origins = _gather(torch.cat((finished_origins, top_origins), dim=1), best)
        is_finished = _gather(torch.cat((is_finished, ended), dim=1), best)

        if cache is not None:
            model.reorder_beam_cache(cache, running_origins[..., cur_len - prompt_len].reshape(-1))
        cur_len += 1

        improvable = can_improve(
            improvable=improvable, running_scores=running_scores.amax(-1, keepdim=True), finished_scores=finished_keys,
            is_finished=is_finished, generated=cur_len - prompt_len, longest=max_length - prompt_len,
            early_stopping=config.early_stopping, alpha=alpha,
        )  # fmt: skip
        if not (improvable.any() and not (is_finished.all() and config.early_stopping is True) and not hits.all()):
            break

    returned = config.num_return_sequences
    sequences = finished[:, :returned].reshape(batch * returned, -1)
    sequence_scores = finished_scores[:, :returned].reshape(batch * returned)
    origins = finished_origins[:, :returned].reshape(batch * returned, -1)
    generated = int((origins + 1).bool().sum(dim=1).max())
    sequences, origins = sequences[:, : prompt_len + generated], origins[:, :generated]
    constraints_met = None
    if constraints is not None:
        # A slot without a constraint (a sentence with fewer, or none) is met: vacuously true.
        constraints_met = (finished_met | ~constraints.valid[:, None])[:, :returned].reshape(batch * returned, -1)
        unmet = constraints.rows & ~constraints.satisfied(finished_met)[:, 0]
        if unmet.any() and not dict_out:
            logger.warning(
                "%d of %d sentences could not meet their constraints within the length limit: their best hypotheses "
                "are returned (return_dict_in_generate=True gives constraints_met)", int(unmet.sum()),
                int(constraints.rows.sum()),
            )  # fmt: skip
    if not dict_out:
        return sequences
    fields = {
        "sequences": sequences,
        "sequences_scores": sequence_scores if config.output_scores else None,
        "scores": tuple(scores) if want["output_scores"] else None,
        "logits": tuple(raw) if want["output_logits"] else None,
        "beam_indices": origins,
        "encoder_attentions": encoder_outputs.get("attentions") if want["output_attentions"] else None,
        "encoder_hidden_states": encoder_outputs.get("hidden_states") if want["output_hidden_states"] else None,
        "decoder_attentions": tuple(self_attentions) if want["output_attentions"] else None,
        "cross_attentions": tuple(cross_attentions) if want["output_attentions"] else None,
        "decoder_hidden_states": tuple(hidden) if want["output_hidden_states"] else None,
    }
    names = GenerateBeamEncoderDecoderOutput.__dataclass_fields__
    fields.update({name: cache for name in ("cache", "past_key_values") if name in names})
    output = GenerateBeamEncoderDecoderOutput(**fields)
    if constraints_met is not None:
        output.constraints_met = constraints_met  # an attribute, not a field: to_tuple() stays transformers'
    return output


def _bar_eos(log_probs: torch.Tensor, unmet: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """EOS impossible for the rows (`unmet`) of hypotheses with a constraint still to meet, unless EOS is all that
    is left to them (a sentence's length limit), where they end unmet."""
    others = log_probs.index_fill(-1, eos, -float("inf"))
    bar = unmet & (others.amax(-1) > -float("inf"))
    return log_probs.index_copy(-1, eos, log_probs.index_select(-1, eos).masked_fill(bar[:, None], -float("inf")))


def _without_repeats(scores: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`scores` (B, N) with each candidate whose key (beam * vocab + token) came earlier in its row made -inf."""
    ordered, order = torch.sort(keys, dim=-1, stable=True)
    repeat = torch.nn.functional.pad(ordered[:, 1:] == ordered[:, :-1], (1, 0))
    return scores.masked_fill(torch.zeros_like(repeat).scatter(1, order, repeat), -float("inf"))


def _window(sequences: torch.Tensor, cur_len: int, size: int) -> torch.Tensor:
    """The last `size` tokens of each hypothesis (B, N, max_length) up to position `cur_len`, -2 before the start."""
    start = cur_len + 1 - size
    if start >= 0:
        return sequences[:, :, start : cur_len + 1]
    return torch.nn.functional.pad(sequences[:, :, : cur_len + 1], (-start, 0), value=-2)


class VaswaniGenerationMixin(GenerationMixin):
    """transformers' `GenerationMixin` with the paper's search (§6.1) from `generate()`: beam 4, GNMT alpha 0.6,
    each sentence's input length + 50, early termination when no running hypothesis can win (`beam_search`)."""

    def _use_paper_search(self) -> None:
        """Sets the model's generation config to `PAPER_SEARCH`, terminating early only when the bound allows it."""
        for key, value in PAPER_SEARCH.items():
            setattr(self.generation_config, key, value)
        self.generation_config.early_stopping = "never"
        # These are our own settings, not copies of the model config: without this, loading drops max_len_a/b.
        self.generation_config._from_model_config = False

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
    "PAPER_SEARCH",
    "PerSentenceMaxLength",
    "VaswaniGenerationMixin",
    "beam_search",
    "can_improve",
    "gnmt_length_penalty",
    "sentence_limits",
]
