"""§6.1's beam search, the loop `generate()` (generation_vaswani.py) runs for `num_beams > 1`: beam 4, GNMT alpha
0.6, "terminate early when possible". A file of its own so that generation_vaswani.py stays the generation API
(defaults, per-sentence limits, refused options); on transformers' public API only (the model's `forward`, `Cache`,
`LogitsProcessor`), so that a later transformers cannot skip a private hook in silence. Imports torch, transformers
and its siblings only, so that `save_pretrained` copies it as Hub remote code.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import EncoderDecoderCache, StaticCache
from transformers.generation import GenerateBeamEncoderDecoderOutput
from transformers.modeling_outputs import BaseModelOutput

from .constraints_vaswani import DynamicBeamAllocation, LexicalConstraints
from .processors_vaswani import ROW_WISE_PROCESSORS, logits_processors


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """§6.1 and Wu et al. (2016): `lp(Y) = ((5 + |Y|) / (5 + 1))^alpha`; beam scores are `log P(Y|X) / lp(Y)`."""
    return ((5.0 + length) / 6.0) ** alpha


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


# Scores that are not log-probabilities, finite (not -inf) so that adding one or multiplying it by 0 stays a number.
# A hypothesis never to be chosen while a real one is left: an empty finished slot, a copy of the first beam at the
# first step, a candidate that ended (it cannot go on) or one that may not finish.
_DEAD = -1.0e9
# Real scores are above it; a candidate that continues a _DEAD hypothesis is below.
_ALIVE_ABOVE = -1.0e8


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
    constrained: tuple[torch.Tensor, float] | None = None,
) -> torch.Tensor:
    """Early termination (§6.1 "terminate early when possible"), per sentence: whether the best running hypothesis,
    scored with the largest GNMT penalty it could still reach (at `longest` generated tokens, with
    `early_stopping="never"` and alpha > 0: tensor2tensor's bound, exact; else at its current length, `generated`,
    transformers' heuristic), still beats the worst of the finished ones; a sentence that cannot stays done.
    `constrained`: (rows (B, 1), their alpha), sentences scored with an alpha of their own."""

    def best_running_score(alpha: float) -> torch.Tensor:
        best_length = longest if early_stopping == "never" and alpha > 0.0 else generated
        return running_scores[:, :1] / gnmt_length_penalty(best_length, alpha)

    best_running = best_running_score(alpha)
    if constrained is not None:
        best_running = torch.where(constrained[0], best_running_score(constrained[1]), best_running)
    worst_finished = torch.where(is_finished, torch.min(finished_scores, dim=1, keepdim=True)[0], _DEAD)
    return improvable & torch.any(best_running > worst_finished, dim=-1, keepdim=True)


def settled(settle: tuple[torch.Tensor, float, int], running_scores: torch.Tensor, finished_scores: torch.Tensor,
            is_finished: torch.Tensor, generated: int, longest: int) -> torch.Tensor:  # fmt: skip
    """(B, 1) whether what a sentence of `settle` ((rows (B, 1), their alpha, the hypotheses returned)) returns is
    settled: its `returned`-th finished hypothesis (by `finished_scores`, best first) beats the best running one
    (`running_scores`, log P(Y|X)) at any length that one may still reach (with alpha > 0 the GNMT penalty at
    `longest`, tensor2tensor's exact bound; else at `generated`, as log P only falls). Such a sentence is done:
    anything it could still finish ranks after what it returns (`constrained_stopping="best"`). `beam_search`
    passes the longest length with `early_stopping="never"` only, as `can_improve` reads it; otherwise the current
    one (transformers' heuristic: 33% fewer rows for one term a line, 2026-11-29)."""
    rows, alpha, returned = settle
    best = running_scores / gnmt_length_penalty(longest if alpha > 0.0 else generated, alpha)
    return rows & is_finished[:, returned - 1 : returned] & (best <= finished_scores[:, returned - 1 : returned])


def _gather(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """`tensor[b, indices[b, k], ...]`: the beams `indices` picks in each sentence."""
    while indices.dim() < tensor.dim():
        indices = indices.unsqueeze(-1)
    return torch.take_along_dim(tensor, indices, dim=1)


class _Setup(NamedTuple):
    """What stays fixed through one search."""

    num_beams: int
    keep: int  # the plain step's candidates: enough that `num_beams` go on however many end with an EOS
    eos: torch.Tensor
    max_length: int  # tokens with the decoder start
    alpha: float
    early_stopping: bool | str
    stopping_criteria: StoppingCriteriaList | None
    # (B, 1) sentences with constraints and the alpha they are scored with (`constrained_length_penalty`), or None
    constrained: tuple[torch.Tensor, float] | None = None
    # (B, 1) sentences with constraints, their alpha and the hypotheses returned, with `constrained_stopping="best"`
    settle: tuple[torch.Tensor, float, int] | None = None


class _Beams(NamedTuple):
    """The running hypotheses, (B, K, ...): token ids from the decoder start (pad after), log P(Y|X), and for each
    generated token the flat beam it came from (`beam_indices`, -1 after)."""

    sequences: torch.Tensor
    scores: torch.Tensor
    origins: torch.Tensor


class _Candidates(NamedTuple):
    """A step's candidates, (B, N, ...): running hypotheses one token longer. `beams`: the running beam each
    continues; `tokens`: its new token; `ends`: whether it ends there (EOS, the length limit, a stopping criterion)."""

    sequences: torch.Tensor
    scores: torch.Tensor
    origins: torch.Tensor
    beams: torch.Tensor
    tokens: torch.Tensor
    ends: torch.Tensor

    def going_on(self) -> torch.Tensor:
        """Their scores as running hypotheses: one that ended cannot go on."""
        return self.scores + self.ends.to(torch.float32) * _DEAD

    def alive(self) -> torch.Tensor:
        """Whether each continues a live hypothesis with a token it may take."""
        return self.scores > _ALIVE_ABOVE

    def take(self, chosen: torch.Tensor) -> _Beams:
        """The running hypotheses that the `chosen` (B, K) candidates become."""
        return _Beams(_gather(self.sequences, chosen), _gather(self.going_on(), chosen), _gather(self.origins, chosen))


class _Finished(NamedTuple):
    """The best finished hypotheses, (B, K, ...): sequences, GNMT scores (§6.1), the keys that rank them (the scores,
    or under constraints unmet ones last), origins as `_Beams`', `done`: a hypothesis, not an empty slot, and each
    one's log P(Y|X) (what n-best lists report, kept here so that they need no per-step scores of every row)."""

    sequences: torch.Tensor
    scores: torch.Tensor
    keys: torch.Tensor
    origins: torch.Tensor
    done: torch.Tensor
    log_probs: torch.Tensor


def _start(batch: int, config: GenerationConfig, eos: torch.Tensor, device) -> tuple[_Beams, _Finished]:
    """The running hypotheses before the first step (the decoder start token alone) and no finished one."""
    num_beams, max_length = config.num_beams, config.max_length
    pad = config.pad_token_id if config.pad_token_id is not None else int(eos[0])
    sequences = torch.full((batch, num_beams, max_length), pad, dtype=torch.long, device=device)
    sequences[:, :, 0] = config.decoder_start_token_id
    scores = torch.zeros(batch, num_beams, device=device)
    scores[:, 1:] = _DEAD  # only the first beam's tokens count at the first step: no k copies of one token
    origins = torch.full((batch, num_beams, max_length - 1), -1, dtype=torch.int32, device=device)
    empty = torch.full((batch, num_beams), _DEAD, device=device)
    done = torch.zeros(batch, num_beams, dtype=torch.bool, device=device)
    finished = _Finished(sequences.clone(), empty, empty.clone(), origins.clone(), done, empty.clone())
    return _Beams(sequences, scores, origins), finished


class _Decoder:
    """The model's decoder over the running hypotheses, a token a step: the KV cache (reordered as beams move),
    torch.compile from the second step, the next token's log-probabilities, and the per-step outputs asked for.
    `sentences`: the batch's sentences it decodes, in the order of its rows (all of them until some leave)."""

    def __init__(self, model, config: GenerationConfig, input_ids, attention_mask, encoder_outputs, processors,
                 target_prefix: torch.Tensor | None):  # fmt: skip
        dict_out = config.return_dict_in_generate
        self.want = {name: dict_out and bool(getattr(config, name)) for name in
                     ("output_scores", "output_logits", "output_attentions", "output_hidden_states")}  # fmt: skip
        self.extra = {name: True for name in ("output_attentions", "output_hidden_states") if self.want[name]}
        if encoder_outputs is None:
            encoder_outputs = model.get_encoder()(input_ids, attention_mask=attention_mask, **self.extra)
        self.encoder_outputs = encoder_outputs
        # Every beam of a sentence reads the same encoder states (and encoder-decoder keys and values).
        states = encoder_outputs[0].repeat_interleave(config.num_beams, dim=0).clone()
        self.expanded = BaseModelOutput(last_hidden_state=states)
        self.mask = attention_mask.repeat_interleave(config.num_beams, dim=0).clone()
        self.model, self.config, self.processors, self.target_prefix = model, config, processors, target_prefix
        self.device = input_ids.device
        self.use_cache = config.use_cache is not False
        self.cache = _new_cache(model, config, config.max_length, self.mask.shape[1]) if self.use_cache else None
        # The first step's beams are all the decoder start: one row a sentence, its cache then copied to each beam (as
        # CTranslate2), where the cache grows (dynamic) and no per-step output needs every row.
        self.first_alone = self.use_cache and self.cache is None and not self.extra and config.num_beams > 1
        self.forward = model
        self.scores, self.logits, self.self_attentions, self.cross_attentions, self.hidden = [], [], [], [], []
        self.batch = input_ids.shape[0]
        self.sentences = torch.arange(self.batch, device=self.device)

    def next_log_probs(self, sequences: torch.Tensor, generated: int, restrict) -> torch.Tensor:
        """(B * K, V) log P of the `generated`-th token after each running hypothesis (`sequences`, (B, K, ...)):
        the model's, through the logits processors, the target prefix and `restrict` (the choice's)."""
        flat, beams = sequences[:, :, :generated].reshape(-1, generated), self.config.num_beams
        alone = generated == 1 and self.first_alone
        outputs = self.forward(
            attention_mask=self.mask[::beams] if alone else self.mask,
            decoder_input_ids=flat[::beams] if alone else flat[:, -1:].clone() if self.use_cache else flat,
            encoder_outputs=BaseModelOutput(last_hidden_state=self.encoder_outputs[0]) if alone else self.expanded,
            cache=self.cache, use_cache=self.use_cache, return_dict=True, **self.extra,
        )  # fmt: skip
        self.cache = _cache_of(outputs) if self.use_cache else None
        if alone:  # each sentence's keys and values copied to its beams
            self.cache.reorder_cache(torch.arange(self.batch, device=self.device).repeat_interleave(beams))
        if generated == 2 and self.cache is not None and getattr(self.config, "compile_config", None) is not None:
            self.forward = _compiled(self.model, self.config.compile_config)  # a cache of 1 would be a graph of its own
        logits = outputs.logits[:, -1, :].to(dtype=torch.float32, device=self.device)  # log_softmax: a new tensor
        logits = logits.repeat_interleave(beams, dim=0) if alone else logits
        processed = self.processors(flat, torch.nn.functional.log_softmax(logits, dim=-1))
        log_probs = restrict(self.prefixed(processed, generated))
        if self.want["output_logits"]:
            self.logits.append(logits.clone())
        if self.want["output_scores"]:
            self.scores.append((log_probs.clone(), self.sentences))  # the rows of the sentences still searched
        if self.want["output_attentions"]:
            self.self_attentions.append(outputs.decoder_attentions)
            self.cross_attentions.append(outputs.cross_attentions)
        if self.want["output_hidden_states"]:
            self.hidden.append(outputs.decoder_hidden_states)
        return log_probs

    def prefixed(self, log_probs: torch.Tensor, generated: int) -> torch.Tensor:
        """`log_probs` with every token but the target prefix's `generated`-th made impossible, in its rows."""
        if self.target_prefix is None or generated > self.target_prefix.shape[1]:
            return log_probs
        forced = self.target_prefix[:, generated - 1].repeat_interleave(self.config.num_beams)
        others = torch.arange(log_probs.shape[-1], device=self.device) != forced[:, None]
        return log_probs.masked_fill((forced >= 0)[:, None] & others, -float("inf"))

    def scores_so_far(self) -> tuple | None:
        """The steps' scores, each (batch * num_beams, V) as transformers returns them (None unless `output_scores`):
        the rows of a sentence that had left the batch are -inf (its hypotheses had all finished: `beam_indices` is
        -1 there, so `compute_transition_scores` reads none of them)."""
        if not self.want["output_scores"]:
            return None
        return tuple(self._whole_batch(step, sentences) for step, sentences in self.scores)

    def _whole_batch(self, step: torch.Tensor, sentences: torch.Tensor) -> torch.Tensor:
        """`step` (the rows of `sentences`' beams) in the whole batch's rows."""
        if sentences.numel() == self.batch:
            return step
        beams = self.config.num_beams
        rows = (sentences[:, None] * beams + torch.arange(beams, device=sentences.device)).reshape(-1)
        whole = step.new_full((self.batch * beams, step.shape[-1]), -float("inf"))
        return whole.index_copy_(0, rows, step)

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Moves the cache's keys and values with the beams (`beam_idx`: the flat beam each one continues)."""
        if self.cache is not None:
            self.model.reorder_beam_cache(self.cache, beam_idx)

    def keep_sentences(self, going: torch.Tensor, beam_idx: torch.Tensor) -> None:
        """Decodes on only the sentences `going` (indices of its current ones), its beams moved as `reorder` moves
        them (`beam_idx`: the flat beam each of theirs continues): every per-row tensor shrinks to their rows."""
        rows = going[:, None] * self.config.num_beams + torch.arange(self.config.num_beams, device=self.device)
        rows = rows.reshape(-1)
        self.sentences = self.sentences[going]
        self.expanded = BaseModelOutput(last_hidden_state=self.expanded.last_hidden_state.index_select(0, rows))
        self.mask = self.mask.index_select(0, rows)
        if self.target_prefix is not None:
            self.target_prefix = self.target_prefix[going]
        for processor in self.processors:
            if hasattr(processor, "keep_sentences"):
                processor.keep_sentences(going)
        if self.cache is not None:
            # All of the cache, the encoder-decoder part too (`reorder_beam_cache` leaves that, the same for every
            # beam of a sentence): beams stay within their sentence, so that keeps each going sentence's own rows.
            self.cache.reorder_cache(beam_idx)


def _sentences_can_leave(config: GenerationConfig, decoder: _Decoder,
                         stopping_criteria: StoppingCriteriaList | None) -> bool:  # fmt: skip
    """Whether finished sentences may leave the batch, as in fairseq's `SequenceGenerator`: not where something needs
    every row at every step: per-step outputs (of shape (batch * num_beams, ...)) but the scores (`scores_so_far`
    puts them back in the whole batch's rows), a stopping criterion (it may keep state per row), a logits processor
    with state per row that it cannot shrink (`keep_sentences`), a static cache or a compiled forward of fixed shapes
    (one compiled with `dynamic=True` on the dynamic cache lets them leave)."""
    compile_config = getattr(config, "compile_config", None)
    if compile_config is not None and getattr(compile_config, "dynamic", None) is not True:
        return False
    if any(wanted for name, wanted in decoder.want.items() if name != "output_scores") or stopping_criteria:
        return False
    if getattr(config, "cache_implementation", None) not in (None, "dynamic"):
        return False
    return all(type(p) in ROW_WISE_PROCESSORS or callable(getattr(p, "keep_sentences", None))
               for p in decoder.processors)  # fmt: skip


def _rows(state: tuple, index: torch.Tensor) -> tuple:
    """`_Beams` or `_Finished` of the sentences `index`."""
    return type(state)(*(tensor[index] for tensor in state))


def _put(store: _Finished, sentences: torch.Tensor, finished: _Finished) -> _Finished:
    """`store` (the whole batch's) with the rows of `sentences` replaced by `finished`'s."""
    return _Finished(*(whole.index_copy(0, sentences, part) for whole, part in zip(store, finished, strict=True)))


def _continuations(running: _Beams, beams: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor, generated: int,
                   setup: _Setup, decoder: _Decoder) -> _Candidates:  # fmt: skip
    """The candidates that continue the running `beams` (B, N) with `tokens` (B, N) as their `generated`-th token,
    of log P(Y|X) `scores` (B, N), and whether each ends there."""
    sequences = _gather(running.sequences, beams)
    sequences[:, :, generated] = tokens
    origins = _gather(running.origins, beams)
    offsets = decoder.sentences.view(-1, 1) * setup.num_beams  # flat beams of the whole batch, as transformers'
    origins[:, :, generated - 1] = (beams + offsets).to(origins.dtype)
    ends = torch.isin(tokens, setup.eos) | (generated + 1 >= setup.max_length)
    if setup.stopping_criteria:
        flat = sequences[:, :, : generated + 1].reshape(-1, generated + 1)
        ends = ends | setup.stopping_criteria(flat, decoder.scores_so_far()).view(beams.shape)
    return _Candidates(sequences, scores, origins, beams, tokens, ends)


def _top_continuations(totals: torch.Tensor, running: _Beams, generated: int, setup: _Setup,
                       decoder: _Decoder) -> _Candidates:  # fmt: skip
    """§6.1's beam step: the best `keep` continuations of each sentence's beams by log P(Y|X) (`totals`, (B, K, V))."""
    vocab = totals.shape[-1]
    scores, indices = torch.topk(totals.reshape(totals.shape[0], -1), k=setup.keep)
    return _continuations(running, indices // vocab, indices % vocab, scores, generated, setup, decoder)


def _with_proposals(candidates: _Candidates, proposals, running: _Beams, generated: int, setup: _Setup,
                    decoder: _Decoder) -> _Candidates:  # fmt: skip
    """`candidates`, then those a choice proposes ((beams, tokens, scores) as `_continuations` takes them; None:
    none)."""
    if proposals is None:
        return candidates
    extra = _continuations(running, *proposals, generated, setup, decoder)
    return _Candidates(*(torch.cat(pair, dim=1) for pair in zip(candidates, extra, strict=True)))


class _PlainChoice:
    """§6.1's choice of what goes on and what finishes: the `num_beams` best candidates that did not end go on, and
    those that ended among the best `num_beams` may finish. The interface `beam_search` asks of a choice
    (constraints_vaswani.DynamicBeamAllocation, which keeps this one for sentences without constraints, has it too)."""

    def __init__(self, num_beams: int, keep: int):
        self.num_beams, self.keep = num_beams, keep

    def restrict(self, log_probs: torch.Tensor) -> torch.Tensor:
        return log_probs

    def propose(self, totals: torch.Tensor, candidates: _Candidates) -> None:
        return None  # no candidates beyond the beam step's

    def choose(self, candidates: _Candidates, generated: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, K) the candidates that go on and (B, N) those that may finish, of the beam step's (the first `keep`;
        any after them are a proposal's)."""
        chosen = torch.topk(candidates.going_on()[:, : self.keep], k=self.num_beams)[1]
        best = torch.arange(candidates.ends.shape[1], device=candidates.ends.device) < self.num_beams
        return chosen, candidates.ends & best

    def rank_finished(self, scores: torch.Tensor) -> torch.Tensor:
        return scores

    def keep_finished(self, best: torch.Tensor) -> None:
        return None

    def keep_sentences(self, going: torch.Tensor) -> None:
        return None  # no state per sentence

    def constraints_met(self, returned: int, warn: bool) -> None:
        return None


def _finishing_scores(candidates: _Candidates, finishing: torch.Tensor, finished: _Finished,
                      improvable: torch.Tensor, generated: int, setup: _Setup) -> torch.Tensor:  # fmt: skip
    """§6.1's GNMT scores of the candidates, `log P(Y|X) / lp(|Y|)` with |Y| = `generated` (EOS included), _DEAD
    added for those that may not finish: not `finishing`, of a sentence that cannot improve, or (early_stopping=True)
    of a sentence whose finished slots are all taken."""
    normalised = candidates.scores / gnmt_length_penalty(generated, setup.alpha)
    if setup.constrained is not None:
        rows, alpha = setup.constrained
        normalised = torch.where(rows, candidates.scores / gnmt_length_penalty(generated, alpha), normalised)
    full = torch.all(finished.done, dim=-1, keepdim=True) & (setup.early_stopping is True)
    return normalised + full.to(torch.float32) * _DEAD + (~improvable).to(torch.float32) * _DEAD + (~finishing) * _DEAD


def _merge_finished(finished: _Finished, candidates: _Candidates, scores: torch.Tensor, keys: torch.Tensor,
                    finishing: torch.Tensor, num_beams: int) -> tuple[_Finished, torch.Tensor]:  # fmt: skip
    """The best `num_beams` by key of the finished hypotheses and the candidates (`scores`, `keys`: their finishing
    scores and ranks), and where each came from (indices into the finished, then the candidates)."""
    merged_keys = torch.cat((finished.keys, keys), dim=1)
    best = torch.topk(merged_keys, k=num_beams)[1]

    def merged(ours: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
        return _gather(torch.cat((ours, theirs), dim=1), best)

    return _Finished(
        sequences=merged(finished.sequences, candidates.sequences), scores=merged(finished.scores, scores),
        keys=_gather(merged_keys, best), origins=merged(finished.origins, candidates.origins),
        done=merged(finished.done, finishing), log_probs=merged(finished.log_probs, candidates.scores),
    ), best  # fmt: skip


def _with_constraints(setup: _Setup, config: GenerationConfig, rows: torch.Tensor) -> _Setup:
    """`setup` for a search with constraints (`rows` (B, 1): the sentences that have some): their own alpha where
    `constrained_length_penalty` differs, and with `constrained_stopping="best"` (or none) the rule of `settled`."""
    alpha = getattr(config, "constrained_length_penalty", None)
    alpha = setup.alpha if alpha is None else float(alpha)
    if alpha != setup.alpha:
        setup = setup._replace(constrained=(rows, alpha))
    if getattr(config, "constrained_stopping", None) in (None, "best"):
        setup = setup._replace(settle=(rows, alpha, config.num_return_sequences))
    return setup


def _still_improvable(improvable: torch.Tensor, running: _Beams, finished: _Finished, generated: int,
                      setup: _Setup) -> torch.Tensor:  # fmt: skip
    """(B, 1) the sentences still searched after this step: those that `can_improve`, not `settled`, and with
    `early_stopping=True` (fairseq's rule) not yet holding `num_beams` finished hypotheses."""
    best = running.scores.amax(-1, keepdim=True)
    improvable = can_improve(
        improvable=improvable, running_scores=best, finished_scores=finished.keys, is_finished=finished.done,
        generated=generated, longest=setup.max_length - 1, early_stopping=setup.early_stopping, alpha=setup.alpha,
        constrained=setup.constrained)  # fmt: skip
    if setup.settle is not None:  # the bound at the longest length only where the plain one is (`can_improve`)
        longest = setup.max_length - 1 if setup.early_stopping == "never" else generated
        improvable = improvable & ~settled(setup.settle, best, finished.keys, finished.done, generated, longest)
    if setup.early_stopping is True:  # a sentence with `num_beams` finished ones is done now
        improvable = improvable & ~finished.done.all(dim=-1, keepdim=True)
    return improvable


def _leave(left: _Finished, running: _Beams, finished: _Finished, improvable: torch.Tensor, setup: _Setup, choice,
           decoder: _Decoder, beam_idx: torch.Tensor):  # fmt: skip
    """The sentences that cannot improve leave the batch: their finished hypotheses go to `left` as they are, and
    every per-sentence state (running beams, finished ones, constraint rows, the choice's, the decoder's with its
    cache moved by `beam_idx`) keeps only the sentences still searched. Returns the new (left, running, finished,
    improvable, setup)."""
    going = improvable[:, 0].nonzero()[:, 0]
    left = _put(left, decoder.sentences, finished)
    if setup.constrained is not None:
        setup = setup._replace(constrained=(setup.constrained[0][going], setup.constrained[1]))
    if setup.settle is not None:
        setup = setup._replace(settle=(setup.settle[0][going], *setup.settle[1:]))
    choice.keep_sentences(going)
    decoder.keep_sentences(going, beam_idx[going].reshape(-1))
    return left, _rows(running, going), _rows(finished, going), improvable[going], setup


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
    sentence has no constraint: vacuously met) and `constraints_placed` (per returned hypothesis, per constraint of
    its sentence, the (first, last) positions of its tokens among the generated ones, or None: unmet), and sentences
    without constraints get exactly what they get without them. `target_prefix` ((batch, Lp), -1 after a row's
    prefix; a row of -1 is no prefix): tokens each output starts with, their log-probabilities counted.

    A sentence that can no longer improve (with `early_stopping=True`: once `num_beams` hypotheses have finished,
    fairseq's rule) leaves the batch, as in fairseq's `SequenceGenerator`: its rows of the running beams, encoder
    states, cache and per-sentence controls go, so that later steps decode only the sentences still searched; its
    finished hypotheses are kept, and the output is the batch's in its order. Unless something needs every row at
    every step (`_sentences_can_leave`: per-step outputs but the scores, stopping criteria, fixed shapes). With
    `return_dict_in_generate`, `sequences_log_probs` holds each returned hypothesis' log P(Y|X)."""
    batch, device, num_beams = input_ids.shape[0], input_ids.device, config.num_beams
    eos = torch.tensor([config.eos_token_id] if isinstance(config.eos_token_id, int) else config.eos_token_id,
                       device=device)  # fmt: skip
    setup = _Setup(num_beams=num_beams, keep=max(2, 1 + eos.numel()) * num_beams, eos=eos,
                   max_length=config.max_length, alpha=float(config.length_penalty),
                   early_stopping=config.early_stopping, stopping_criteria=stopping_criteria)  # fmt: skip
    processors = logits_processors(config, eos, device, logits_processor)
    decoder = _Decoder(model, config, input_ids, attention_mask, encoder_outputs, processors, target_prefix)
    plain = _PlainChoice(num_beams, setup.keep)
    choice = plain if constraints is None else DynamicBeamAllocation(constraints, plain, eos)
    setup = setup if constraints is None else _with_constraints(setup, config, choice.constrained)
    running, finished = _start(batch, config, eos, device)
    # Sentences that cannot improve leave the batch (their finished hypotheses kept here) unless every row must stay.
    left = finished if _sentences_can_leave(config, decoder, stopping_criteria) else None
    improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)
    generated = 1  # the token this step chooses: the first after the decoder start, then the second, ...
    while True:
        log_probs = decoder.next_log_probs(running.sequences, generated, choice.restrict)
        totals = log_probs.view(-1, num_beams, log_probs.shape[-1]) + running.scores[:, :, None]  # log P(Y|X)
        top = _top_continuations(totals, running, generated, setup, decoder)
        candidates = _with_proposals(top, choice.propose(totals, top), running, generated, setup, decoder)
        chosen, finishing = choice.choose(candidates, generated)
        finishing_scores = _finishing_scores(candidates, finishing, finished, improvable, generated, setup)
        keys = choice.rank_finished(finishing_scores)
        finished, best = _merge_finished(finished, candidates, finishing_scores, keys, finishing, num_beams)
        choice.keep_finished(best)
        running = candidates.take(chosen)
        improvable = _still_improvable(improvable, running, finished, generated, setup)
        done = not improvable.any() or (finished.done.all() and config.early_stopping is True) or candidates.ends.all()
        # The flat beam each running one continues, in the decoder's rows.
        beam_idx = _gather(candidates.beams, chosen) + torch.arange(chosen.shape[0], device=device)[:, None] * num_beams
        if left is None or done or improvable.all():
            decoder.reorder(beam_idx.reshape(-1))
        else:
            left, running, finished, improvable, setup = _leave(left, running, finished, improvable, setup, choice,
                                                                decoder, beam_idx)  # fmt: skip
        if done:
            break
        generated += 1
    if left is not None:
        finished = _put(left, decoder.sentences, finished)
    return _output(finished, decoder, choice, config)


def _output(finished: _Finished, decoder: _Decoder, choice, config: GenerationConfig):
    """What transformers' `generate()` returns for beam search: each sentence's best `num_return_sequences`, cut
    after the longest, or with `return_dict_in_generate` a `GenerateBeamEncoderDecoderOutput` (under constraints
    with `constraints_met`, an attribute, not a field: to_tuple() stays transformers')."""
    batch, returned, dict_out = finished.scores.shape[0], config.num_return_sequences, config.return_dict_in_generate
    origins = finished.origins[:, :returned].reshape(batch * returned, -1)
    longest = int((origins + 1).bool().sum(dim=1).max())  # generated tokens of the longest returned hypothesis
    sequences = finished.sequences[:, :returned].reshape(batch * returned, -1)[:, : 1 + longest]
    constraints_met = choice.constraints_met(returned, warn=not dict_out)
    if not dict_out:
        return sequences
    want, encoder_outputs = decoder.want, decoder.encoder_outputs
    fields = {
        "sequences": sequences,
        "sequences_scores": finished.scores[:, :returned].reshape(batch * returned) if config.output_scores else None,
        "scores": decoder.scores_so_far(),
        "logits": tuple(decoder.logits) if want["output_logits"] else None,
        "beam_indices": origins[:, :longest],
        "encoder_attentions": encoder_outputs.get("attentions") if want["output_attentions"] else None,
        "encoder_hidden_states": encoder_outputs.get("hidden_states") if want["output_hidden_states"] else None,
        "decoder_attentions": tuple(decoder.self_attentions) if want["output_attentions"] else None,
        "cross_attentions": tuple(decoder.cross_attentions) if want["output_attentions"] else None,
        "decoder_hidden_states": tuple(decoder.hidden) if want["output_hidden_states"] else None,
    }
    names = GenerateBeamEncoderDecoderOutput.__dataclass_fields__
    fields.update({name: decoder.cache for name in ("cache", "past_key_values") if name in names})
    output = GenerateBeamEncoderDecoderOutput(**fields)
    # Each returned hypothesis' log P(Y|X), as the search summed it (an attribute, as `constraints_met`).
    output.sequences_log_probs = finished.log_probs[:, :returned].reshape(batch * returned)
    if constraints_met is not None:  # and where the search placed each constraint's tokens in each hypothesis
        output.constraints_met = constraints_met
        output.constraints_placed = choice.constraints_placed(sequences, returned)
    return output


__all__ = ["beam_search", "can_improve", "gnmt_length_penalty", "settled"]
