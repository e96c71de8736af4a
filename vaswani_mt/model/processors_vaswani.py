"""transformers' logits processors for the options the paper's beam search (beam_search_vaswani.py) takes, in the
order `generate()` applies them. Self-contained, shipped as Hub remote code with the model."""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)


def logits_processors(config: GenerationConfig, eos: torch.Tensor, device, user: LogitsProcessorList | None):
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


# The processors `logits_processors` builds: each reads its own rows only, and keeps no state per row.
ROW_WISE_PROCESSORS = (
    RepetitionPenaltyLogitsProcessor, NoRepeatNGramLogitsProcessor, NoBadWordsLogitsProcessor, MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor, ForcedBOSTokenLogitsProcessor, ForcedEOSTokenLogitsProcessor,
    SuppressTokensLogitsProcessor, SuppressTokensAtBeginLogitsProcessor,
)  # fmt: skip


__all__ = ["ROW_WISE_PROCESSORS", "logits_processors"]
