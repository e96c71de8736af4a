"""Terminology constraints for the paper's beam search: phrases that must appear in a sentence's translation.

Dynamic beam allocation (Post & Vilar, 2018), vectorized over the batch as Hu et al. (2019) and fairseq's
`LexicallyConstrainedBeamSearch`. A hypothesis's *bank* is how many constraint tokens it has met (including those of
the one it is inside of); the hypotheses that go on are taken round-robin over the banks, highest first (`allocate`);
each step also considers, for every beam, the next token of each unmet constraint and its own best token. EOS is
barred while a constraint is unmet, unless nothing but EOS is left (the length limit): the hypothesis ends unmet.

A constraint is one phrase of token ids or several alternatives (`phrase_forms`), met when any appears; `ordered`
ones must be met in the given order. Phrases are matched against each hypothesis's last tokens at every step, so a
phrase that overlaps itself is found wherever it ends. Self-contained, shipped as Hub remote code with the model.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)

ORDERS = ("unordered", "ordered")


def encode_with_offsets(tokenizer, text: str, target: bool = False, add_special_tokens: bool = True) -> dict:
    """`{"input_ids": [...], "offset_mapping": [(start, end), ...]}` of `text`, the source side's tokens or, with
    `target`, the target side's (`text_target`; the same for a joint vocabulary). Offsets are characters of `text`,
    (0, 0) for added special tokens. A fast tokenizer gives them itself; a SentencePiece one without a fast form
    (`MarianTokenizer`: two SentencePiece models, source and target, over one vocabulary) gives them through its
    model's piece offsets, with the ids that tokenizer gives."""
    if tokenizer.is_fast:
        side = {"text_target": text} if target else {"text": text}
        encoding = tokenizer(**side, add_special_tokens=add_special_tokens, return_offsets_mapping=True, verbose=False)
        return {"input_ids": encoding["input_ids"], "offset_mapping": encoding["offset_mapping"]}
    spm = getattr(tokenizer, "spm_target" if target else "spm_source", None)
    if spm is None:
        raise TypeError(f"{type(tokenizer).__name__} gives no character offsets: use a fast tokenizer or a Marian one")
    codes, rest = tokenizer.remove_language_code(text)  # a multilingual model's leading >>xx<< is a token of its own
    shift = len(text) - len(rest)
    char_of_byte, position = {}, 0
    for index, character in enumerate(rest):
        char_of_byte[position] = index
        position += len(character.encode("utf-8"))
    char_of_byte[position] = len(rest)
    pieces = _spm_pieces(spm, rest)
    tokens = codes + [piece.piece for piece in pieces]
    offsets = [(0, shift)] * len(codes)
    offsets += [(shift + char_of_byte[piece.begin], shift + char_of_byte[piece.end]) for piece in pieces]
    ids = tokenizer.convert_tokens_to_ids(tokens)
    if add_special_tokens:
        with_specials = tokenizer.build_inputs_with_special_tokens(ids)
        offsets += [(0, 0)] * (len(with_specials) - len(ids))  # Marian's: `</s>` after the text
        ids = with_specials
    return {"input_ids": ids, "offset_mapping": offsets}


def _spm_pieces(spm, text: str):
    """SentencePiece's pieces of `text`, each with its `piece` and its UTF-8 byte span (`begin`, `end`) in `text`:
    `out_type="proto"` from sentencepiece 0.2.1 on, "immutable_proto" before (which 0.2.1 refuses)."""
    try:
        return spm.encode(text, out_type="proto").pieces
    except (ValueError, TypeError, RuntimeError):
        return spm.encode(text, out_type="immutable_proto").pieces


def target_ids(tokenizer, texts: str | list[str]) -> list:
    """The target side's token ids of `texts` (one text or a list), without special tokens."""
    return tokenizer(text_target=texts, add_special_tokens=False)["input_ids"]


def phrase_forms(tokenizer, phrase: str) -> list[list[int]]:
    """The token ids of `phrase`, target text, as it is tokenized inside a sentence (after a word) and at a
    sentence's start, each distinct form once: both count as the phrase. Raises ValueError (one line) for an empty
    phrase or one with characters outside the vocabulary, naming them."""
    text = " ".join(phrase.split())
    if not text:
        raise ValueError("an empty constraint")
    initial = encode_with_offsets(tokenizer, text, target=True, add_special_tokens=False)
    unk = tokenizer.unk_token_id
    if unk is not None and unk in initial["input_ids"]:
        spans = zip(initial["input_ids"], initial["offset_mapping"], strict=True)
        unknown = sorted({text[start:end] for token, (start, end) in spans if token == unk})
        raise ValueError(f"{text!r} has {'a character' if len(unknown) == 1 else 'characters'} outside the vocabulary: "
                         + " ".join(repr(c) for c in unknown))  # fmt: skip
    forms = [list(initial["input_ids"])]
    # Inside a sentence: the phrase's tokens after a context word, that word's own tokens taken off the front.
    context, inside = target_ids(tokenizer, ["a", "a " + text])
    if inside[: len(context)] == context and inside[len(context) :] not in forms:
        forms.append(list(inside[len(context) :]))
    return forms


def _alternatives(constraint) -> list[list[int]]:
    """A constraint as a list of token-id phrases: one phrase (a list of ints) or several (a list of such lists)."""
    if isinstance(constraint, torch.Tensor):
        constraint = constraint.tolist()
    if len(constraint) and all(isinstance(t, int) for t in constraint):
        return [list(constraint)]
    return [[int(t) for t in (p.tolist() if isinstance(p, torch.Tensor) else p)] for p in constraint]


class LexicalConstraints:
    """The constraints of a batch as tensors: for sentence b, constraint c, and its phrases p (every alternative of
    every constraint, P per sentence at most, L tokens at most). Sentences without constraints have none (and the
    search gives them exactly what it gives without this object)."""

    def __init__(self, constraints: Sequence[Sequence], order: str = "unordered", device=None):
        if order not in ORDERS:
            raise ValueError(f"constraint order must be one of {', '.join(ORDERS)}, not {order!r}")
        self.ordered = order == "ordered"
        rows = [[_alternatives(c) for c in (sentence or [])] for sentence in constraints]
        for b, sentence in enumerate(rows):
            for c, alternatives in enumerate(sentence):
                if not alternatives or any(len(p) == 0 for p in alternatives):
                    raise ValueError(f"sentence {b}: constraint {c + 1} is empty")
        batch = len(rows)
        self.C = max(1, max((len(s) for s in rows), default=0))
        self.P = max(1, max((sum(len(c) for c in s) for s in rows), default=0))
        self.L = max(1, max((len(p) for s in rows for c in s for p in c), default=0))
        left = torch.zeros(batch, self.P, self.L, dtype=torch.long)
        right = torch.full((batch, self.P, self.L), -1, dtype=torch.long)
        length = torch.zeros(batch, self.P, dtype=torch.long)
        owner = torch.zeros(batch, self.P, self.C)
        weight = torch.zeros(batch, self.C, dtype=torch.long)
        for b, sentence in enumerate(rows):
            p = 0
            for c, alternatives in enumerate(sentence):
                weight[b, c] = min(len(a) for a in alternatives)
                for phrase in alternatives:
                    left[b, p, : len(phrase)] = torch.tensor(phrase)
                    right[b, p, self.L - len(phrase) :] = torch.tensor(phrase)
                    length[b, p], owner[b, p, c] = len(phrase), 1.0
                    p += 1
        to = {"device": device}
        self.left, self.right, self.length = left.to(**to), right.to(**to), length.to(**to)
        self.owner, self.weight = owner.to(**to), weight.to(**to)
        self.valid, self.phrase_valid = self.weight > 0, self.length > 0  # (B, C), (B, P): constraint, phrase exists
        self.phrase_owner = owner.argmax(-1).to(**to)  # (B, P)
        self.total = self.weight.sum(-1)  # (B,): constraint tokens to meet, the highest bank
        self.rows = self.valid.any(-1)  # (B,): sentences with constraints
        self.room = torch.full_like(self.total, 2**31)  # (B,) tokens before EOS; generate() sets each sentence's

    # What the tensors above hold per sentence (dim 0): all but C, P, L and `ordered`.
    _PER_SENTENCE = ("left", "right", "length", "owner", "weight", "valid", "phrase_valid", "phrase_owner", "total",
                     "rows", "room")  # fmt: skip

    def select(self, sentences: torch.Tensor) -> LexicalConstraints:
        """The constraints of the sentences `sentences` (indices into this batch's), as a batch of their own."""
        selected = copy.copy(self)
        for name in self._PER_SENTENCE:
            setattr(selected, name, getattr(self, name)[sentences])
        return selected

    def satisfied(self, met: torch.Tensor) -> torch.Tensor:
        """(B, N) whether hypotheses that met `met` (B, N, C) met all of their sentence's constraints."""
        return (met | ~self.valid[:, None]).all(-1)

    def initial_state(self, beams: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(met, partial) of the hypotheses at the start: (B, K, C) no constraint met; (B, K, P) no phrase begun."""
        batch = self.left.shape[0]
        met = torch.zeros(batch, beams, self.C, dtype=torch.bool, device=self.left.device)
        return met, torch.zeros(batch, beams, self.P, dtype=torch.long, device=self.left.device)

    def _allowed(self, met: torch.Tensor) -> torch.Tensor:
        """(..., C) the constraints a hypothesis may meet next: unmet, and with `ordered` all before them met."""
        if not self.ordered:
            return ~met
        before = torch.cumprod(met.long(), dim=-1)
        allowed = torch.cat((torch.ones_like(before[..., :1]), before[..., :-1]), dim=-1).bool()
        return allowed & ~met

    def next_tokens(self, met: torch.Tensor, partial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For each running hypothesis (met, partial: (B, K, C), (B, K, P)), the token that would take each phrase one
        further ((B, K, P)) and whether that phrase is one to pursue (its constraint may be met next)."""
        tokens = torch.take_along_dim(self.left[:, None], partial.clamp(max=self.L - 1)[..., None], dim=-1)[..., 0]
        owner = self.phrase_owner[:, None].expand_as(partial)
        pursue = torch.take_along_dim(self._allowed(met), owner, dim=-1) & self.phrase_valid[:, None]
        return tokens, pursue

    def advance(self, window: torch.Tensor, parent_met: torch.Tensor):
        """The state after a token, for candidates (B, N) whose last `L` tokens (the new one last; -2 before the
        decoder start) are `window` (B, N, L) and whose parents had met `parent_met` (B, N, C): returns met
        (B, N, C), partial (B, N, P): the tokens of each phrase's start that the window ends with (short of the
        whole phrase), bank (B, N) and satisfied (B, N)."""
        phrases = self.right[:, None]  # (B, 1, P, L)
        ends = ((window[:, :, None, :] == phrases) | (phrases == -1)).all(-1) & self.phrase_valid[:, None]
        hit = torch.einsum("bnp,bpc->bnc", ends.float(), self.owner) > 0
        met = parent_met | (hit & self._allowed(parent_met))
        if self.ordered:  # a phrase ending where the one before it ends too: that one opens the way
            met = met | (hit & self._allowed(met))
        partial = torch.zeros(*window.shape[:2], self.P, dtype=torch.long, device=window.device)
        for j in range(1, self.L):
            start = self.left[:, None, :, :j]  # (B, 1, P, j)
            matched = (window[:, :, None, self.L - j :] == start).all(-1) & (j < self.length)[:, None]
            partial = torch.where(matched, j, partial)
        # Progress on the constraints still to meet: the tokens of the one furthest inside, short of its whole.
        inside = (partial[..., None] * self.owner[:, None].long()).amax(2)  # (B, N, C)
        inside = torch.minimum(inside, (self.weight - 1).clamp(min=0)[:, None]) * self._allowed(met)
        bank = ((met & self.valid[:, None]) * self.weight[:, None]).sum(-1) + inside.amax(-1)
        return met, partial, bank, self.satisfied(met)


def allocate(scores: torch.Tensor, banks: torch.Tensor, usable: torch.Tensor, beams: int,
             feasible: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Dynamic beam allocation: the indices (B, beams) of the candidates that go on, taken round-robin over banks:
    the best of the highest bank, the best of the next bank, ..., then each bank's second best, and so on. `usable`
    marks candidates that may go on; the others (ended, impossible, or dead beams' copies) fill what is left.
    Candidates not `feasible` (too few tokens left before the length limit for the constraint tokens they miss)
    come after the feasible ones, so that near the limit the beam fills with hypotheses that can still meet all."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True)[1]
    banks, usable = torch.take_along_dim(banks, order, dim=-1), torch.take_along_dim(usable, order, dim=-1)
    late = torch.zeros_like(usable) if feasible is None else ~torch.take_along_dim(feasible, order, dim=-1)
    top = int(banks.max()) + 1 if banks.numel() else 1
    first = usable & ~late
    one_hot = torch.nn.functional.one_hot(banks.clamp(min=0), top) * first[..., None]
    rank = (one_hot.cumsum(1) * one_hot).sum(-1) - 1  # a candidate's place among its bank's feasible usable ones
    after = top * banks.shape[1] + torch.arange(banks.shape[1], device=banks.device)  # past every round, by score
    key = torch.where(first, rank * top + (top - 1 - banks), torch.where(usable, after, 2 * after))
    chosen = torch.topk(-key, k=beams, dim=-1)[1]
    return torch.take_along_dim(order, chosen, dim=-1)


# Subtracted from the ranking key of a finished hypothesis with an unmet constraint: it ranks after every one that met
# all of theirs (GNMT scores of real hypotheses are far above -1e5), yet before the empty slots.
_UNMET_PENALTY = 1.0e5


class DynamicBeamAllocation:
    """Dynamic beam allocation as `beam_search`'s choice of what goes on and what finishes: the interface of its plain
    choice (`plain`, beam_search_vaswani), which sentences without constraints keep, exactly. Holds each running
    hypothesis's constraint state (`met`, `partial`) and each finished one's (`finished_met`), for the sentences
    still searched (`sentences`, until some leave the batch: all of `batch`'s)."""

    def __init__(self, constraints: LexicalConstraints, plain, eos: torch.Tensor):
        self.batch = self.constraints = constraints
        self.plain, self.eos = plain, eos
        self.constrained = constraints.rows[:, None]  # (B, 1)
        self.met, self.partial = constraints.initial_state(plain.num_beams)
        self.finished_met = self.met.clone()
        self.sentences = torch.arange(constraints.rows.shape[0], device=constraints.rows.device)
        self.left_met = self.finished_met  # the whole batch's `finished_met`, where sentences that left keep theirs
        self.candidate_met = self.candidate_satisfied = None  # the last `choose`'s candidates', for the finishing

    def restrict(self, log_probs: torch.Tensor) -> torch.Tensor:
        """(B * K, V) log-probabilities with EOS barred for hypotheses with a constraint still to meet (in place)."""
        return _bar_eos(log_probs, ~self.constraints.satisfied(self.met).reshape(-1), self.eos)

    def propose(self, totals: torch.Tensor, candidates):
        """DBA's extra candidates, as (beams, tokens, scores), each (B, K * P + K): for every beam, the next token of
        each phrase it may pursue and its own best token, scored by `totals` (B, K, V), log P(Y|X) of each beam's
        continuations. -inf where one repeats an earlier candidate or its sentence has no constraint."""
        batch, beams, vocab = totals.shape
        phrase_tokens, pursue = self.constraints.next_tokens(self.met, self.partial)  # (B, K, P)
        beam_of = torch.arange(beams, device=totals.device)
        extra_beams = torch.cat((beam_of.repeat_interleave(self.constraints.P), beam_of)).expand(batch, -1)
        best_scores, best_tokens = totals.max(-1)
        extra_tokens = torch.cat((phrase_tokens.reshape(batch, -1), best_tokens), dim=1)
        phrase_scores = torch.take_along_dim(totals, phrase_tokens, dim=-1).masked_fill(~pursue, -float("inf"))
        extra_scores = torch.cat((phrase_scores.reshape(batch, -1), best_scores), dim=1)
        every_beam = torch.cat((candidates.beams, extra_beams), dim=1)
        every_token = torch.cat((candidates.tokens, extra_tokens), dim=1)
        repeated = _repeated(every_beam * vocab + every_token)[:, candidates.beams.shape[1] :]
        scores = extra_scores.masked_fill(repeated, -float("inf")).masked_fill(~self.constrained, -float("inf"))
        return extra_beams, extra_tokens, scores

    def choose(self, candidates, generated: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The candidates that go on (B, K), taken by bank (`allocate`), and those that may finish (B, N): every one
        that ended and is alive. `generated`: the candidates' tokens after the decoder start (the column of the
        new one)."""
        window = _window(candidates.sequences, generated, self.constraints.L)
        parent_met = torch.take_along_dim(self.met, candidates.beams[..., None], dim=1)
        met, partial, banks, satisfied = self.constraints.advance(window, parent_met)
        # Hypotheses that can no longer fit their missing constraint tokens before the limit go last.
        feasible = self.constraints.total[:, None] - banks <= self.constraints.room[:, None] - generated
        usable = ~candidates.ends & candidates.alive()
        allocated = allocate(candidates.scores, banks, usable, self.plain.num_beams, feasible)
        plain_chosen, plain_finishing = self.plain.choose(candidates, generated)
        chosen = torch.where(self.constrained, allocated, plain_chosen)
        finishing = torch.where(self.constrained, candidates.ends & candidates.alive(), plain_finishing)
        self.met = torch.take_along_dim(met, chosen[..., None], dim=1)
        self.partial = torch.take_along_dim(partial, chosen[..., None], dim=1)
        self.candidate_met, self.candidate_satisfied = met, satisfied
        return chosen, finishing

    def rank_finished(self, scores: torch.Tensor) -> torch.Tensor:
        """The keys that rank the candidates' finishing `scores` (B, N): a hypothesis with a constraint unmet goes
        after all that met theirs."""
        return scores - _UNMET_PENALTY * (~self.candidate_satisfied).to(torch.float32)

    def keep_finished(self, best: torch.Tensor) -> None:
        """Follows the finished set's merge (`best` (B, K): indices into the finished, then the candidates)."""
        merged = torch.cat((self.finished_met, self.candidate_met), dim=1)
        self.finished_met = torch.take_along_dim(merged, best[..., None], dim=1)

    def keep_sentences(self, going: torch.Tensor) -> None:
        """Searches on only the sentences `going` (indices of the current ones); the others' finished state stays."""
        self.left_met = self.left_met.index_copy(0, self.sentences, self.finished_met)
        self.sentences = self.sentences[going]
        self.constraints = self.batch.select(self.sentences)
        self.constrained = self.constrained[going]
        self.met, self.partial, self.finished_met = self.met[going], self.partial[going], self.finished_met[going]

    def constraints_met(self, returned: int, warn: bool) -> torch.Tensor:
        """(B * returned, C) whether each returned hypothesis met each constraint; a slot without a constraint (a
        sentence with fewer, or none) is met, vacuously. `warn`: log how many sentences' best did not meet all."""
        finished_met = self.left_met.index_copy(0, self.sentences, self.finished_met)
        if warn:
            unmet = self.batch.rows & ~self.batch.satisfied(finished_met)[:, 0]
            if unmet.any():
                logger.warning(
                    "%d of %d sentences could not meet their constraints within the length limit: their best "
                    "hypotheses are returned (return_dict_in_generate=True gives constraints_met)",
                    int(unmet.sum()), int(self.batch.rows.sum()),
                )  # fmt: skip
        met = finished_met | ~self.batch.valid[:, None]
        return met[:, :returned].reshape(-1, met.shape[-1])

    def constraints_placed(self, sequences: torch.Tensor, returned: int) -> list[list[tuple[int, int] | None]]:
        """Where each returned hypothesis (`sequences` (B * returned, T), from the decoder start) placed each of its
        sentence's constraints: (first, last) positions among its generated tokens (0: the first after the decoder
        start), None for one unmet. The search's own matching (`advance`) replayed along the hypothesis: the tokens
        that met the constraint when it was met. Run once, on the returned hypotheses only, after the search."""
        batch = self.batch
        rows = sequences.reshape(-1, returned, sequences.shape[-1])
        met = torch.zeros(*rows.shape[:2], batch.C, dtype=torch.bool, device=rows.device)
        last = torch.full(met.shape, -1, dtype=torch.long, device=rows.device)
        for column in range(1, rows.shape[-1]):
            now = batch.advance(_window(rows, column, batch.L), met)[0]
            last = torch.where(now & ~met, column - 1, last)
            met = now
        lengths, owners, left = batch.length.tolist(), batch.phrase_owner.tolist(), batch.left.tolist()
        counts, tokens, last = batch.valid.sum(-1).tolist(), rows[:, :, 1:].tolist(), last.tolist()
        placed = []
        for b, hypotheses in enumerate(tokens):
            for k, generated in enumerate(hypotheses):
                spans = []
                for c in range(counts[b]):
                    end = last[b][k][c]
                    # The longest of the constraint's phrases that ends there (the one the search matched).
                    size = max((n for p, n in enumerate(lengths[b]) if owners[b][p] == c and 0 < n <= end + 1
                                and generated[end + 1 - n : end + 1] == left[b][p][:n]), default=0)  # fmt: skip
                    spans.append((end + 1 - size, end) if end >= 0 and size else None)
                placed.append(spans)
        return placed


def _bar_eos(log_probs: torch.Tensor, unmet: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """EOS impossible for the rows (`unmet`) of hypotheses with a constraint still to meet, unless EOS is all that
    is left to them (a sentence's length limit), where they end unmet. In place, on the EOS columns only: the best
    token that is not EOS is among the best `len(eos) + 1`, so no copy of the whole row is made."""
    if not unmet.any():
        return log_probs
    values, tokens = log_probs.topk(min(eos.numel() + 1, log_probs.shape[-1]), dim=-1)
    others = values.masked_fill(torch.isin(tokens, eos), -float("inf")).amax(-1)
    bar = unmet & (others > -float("inf"))
    log_probs[:, eos] = log_probs[:, eos].masked_fill(bar[:, None], -float("inf"))
    return log_probs


def _repeated(keys: torch.Tensor) -> torch.Tensor:
    """(B, N) whether each candidate's key (beam * vocab + token) came earlier in its row."""
    ordered, order = torch.sort(keys, dim=-1, stable=True)
    repeat = torch.nn.functional.pad(ordered[:, 1:] == ordered[:, :-1], (1, 0))
    return torch.zeros_like(repeat).scatter(1, order, repeat)


def _window(sequences: torch.Tensor, end: int, size: int) -> torch.Tensor:
    """The last `size` tokens of each hypothesis (B, N, max_length) up to column `end`, -2 before the start."""
    start = end + 1 - size
    if start >= 0:
        return sequences[:, :, start : end + 1]
    return torch.nn.functional.pad(sequences[:, :, : end + 1], (-start, 0), value=-2)


def search_controls(controls: dict, batch: int, limits: torch.Tensor | None, max_length: int, device):
    """The `constraints` and `target_prefix` of a `generate()` call as `beam_search` takes them (None where not
    given), checked: one entry per sentence, and room for a sentence's prefix and constraint tokens before EOS
    within its length limit (ValueError naming the sentence, from 0, otherwise)."""
    constraints, prefix = controls.get("constraints"), controls.get("target_prefix")
    order = controls.get("constraint_order") or "unordered"
    if order not in ORDERS:
        raise ValueError(f"constraint_order must be one of {', '.join(ORDERS)}, not {order!r}")
    for name, value in (("constraints", constraints), ("target_prefix", prefix)):
        if value is not None and len(value) != batch:
            raise ValueError(f"{name} has {len(value)} entries for {batch} sentences: give one per sentence")
    lexical = LexicalConstraints(constraints, order, device) if constraints is not None else None
    if lexical is not None and not lexical.rows.any():
        lexical = None  # no sentence has one: the search without them, exactly
    prefix_tokens = torch.zeros(batch, dtype=torch.long, device=device)
    tensor = None
    if prefix is not None:
        rows = [list(p.tolist() if isinstance(p, torch.Tensor) else (p or [])) for p in prefix]
        width = max((len(r) for r in rows), default=0)
        if width:
            tensor = torch.full((batch, width), -1, dtype=torch.long)
            for b, row in enumerate(rows):
                tensor[b, : len(row)] = torch.tensor(row, dtype=torch.long)
            tensor = tensor.to(device)
            prefix_tokens = (tensor >= 0).sum(-1)
    room = torch.full((batch,), max_length - 1, dtype=torch.long, device=device)
    if limits is not None:
        room = torch.minimum(room, limits.to(device))
    room = room - 1  # tokens before EOS
    need = prefix_tokens + (lexical.total if lexical is not None else 0)
    if (need > room).any():
        b = int((need > room).nonzero()[0])
        parts = [f"a target prefix of {int(prefix_tokens[b])}"] if prefix_tokens[b] else []
        parts += [f"constraints of {int(lexical.total[b])}"] if lexical is not None and lexical.total[b] else []
        raise ValueError(f"sentence {b}: {' and '.join(parts)} tokens, more than the {int(room[b])} its length "
                         "limit leaves before EOS")  # fmt: skip
    if lexical is not None:
        lexical.room = room
    return lexical, tensor


__all__ = ["ORDERS", "DynamicBeamAllocation", "LexicalConstraints", "allocate", "encode_with_offsets", "phrase_forms",
           "search_controls", "target_ids"]  # fmt: skip
