"""The translation pipeline of a vaswani_mt model: `pipeline("translation", model=folder, trust_remote_code=True)`.

transformers 5 removed its `translation` task. The model's `save_pretrained` copies this file next to the model code
and names it in config.json (`custom_pipelines`), so it loads as remote code. It answers in the schema of the Hub's
translation widget: `[{"translation_text": ...}]` per input.

Input that the model cannot translate as given is handled with a warning, never a shape error: an empty text
translates to ""; a text longer than `max_source_tokens` (default: `max_position_embeddings`) is cut, its final
`</s>` kept, and a very long one is tokenized only as far as that limit reaches; characters outside the vocabulary
become `<unk>`, named in the warning; lone surrogates become U+FFFD; a line break in a translation becomes a space.
Self-contained (torch and transformers only) so that `save_pretrained` ships it as Hub remote code.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from transformers import Pipeline
from transformers.utils import logging

from .constraints_vaswani import encode_with_offsets, phrase_forms, target_ids

logger = logging.get_logger(__name__)


def default_max_source_tokens(model, tokenizer) -> int:
    """The default longest source: `config.max_position_embeddings`, or the tokenizer's limit if smaller."""
    limits = [getattr(model.config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    limits = [limit for limit in limits if isinstance(limit, int) and 0 < limit < 10**9]
    return min(limits) if limits else 1024


# A long text is tokenized a prefix at a time: `_CHARS_PER_TOKEN[0]` characters per allowed token (at least
# `_FIRST_PREFIX`), then 4 times that, up to `_CHARS_PER_TOKEN[1]`, so that a 1 MB line is not tokenized whole.
_CHARS_PER_TOKEN = (4, 32)
_FIRST_PREFIX = 4096

# Characters that end a line for some reader (`str.splitlines`); a translation never holds one.
_LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")


def single_line(text: str) -> str:
    """`text` stripped, each run of line breaks in it a space: a translation is one line, whoever reads it."""
    return _LINE_BREAKS.sub(" ", text).strip()


# Format directives as inference/directives.py reads plain text (C's, Python's `%(name)s`, the brace forms), compact.
_PLACEHOLDER = re.compile(r"\{[^{}\s]*\}|%(?:\([^()\s]*\)|[1-9]\d*\$)?[-+#0'I]*(?:\*|\d+)?(?:\.(?:\*|\d+)?)?"
                          r"(?:hh|h|ll|l|L|q|j|z|Z|t)?(?:[diouxXeEfFgGaAcspnmr]|<PRI\w+>)")  # fmt: skip


# The tokenizer config's list of the words of the training split's target side that `unusual_pieces` would call
# typos (data/tokenization.py's `record_seen_words` writes it): seen in training, never a typo. A folder without it
# (an imported model, an older run) has the rule alone.
SEEN_WORDS = "seen_words"


def unusual_pieces(tokenizer, term: str) -> str | None:
    """A warning, or None, for a term with a word that looks like a typo: it splits into 3 or more pieces of under
    2.5 characters on average ("Gebäde": ▁Geb ä de) and a word one letter away takes at least 2 pieces fewer, and at
    most 2 ("Gebäude": ▁Gebäude), by an edit inside the word: its first letter and its last two kept, and not by case
    alone. A forced term is forced piece by piece as given, so the user is told (the term is still used). Piece counts
    alone are weak evidence: a real word the tokenizer's training saw rarely splits as finely, and sits one letter
    from a common one at its start ("Hürde", "würde"), its ending ("Gesetze", "Gesetz") or its case ("Zuletzt"); a
    warning on those would be ignored. A word the vocabulary holds whole, or that training saw (`SEEN_WORDS`), is never
    a typo; placeholders (`{0}`, `%s`) are no words."""
    seen = (getattr(tokenizer, "init_kwargs", None) or {}).get(SEEN_WORDS) or ()
    for word in term.split():
        if _PLACEHOLDER.fullmatch(word) or word in seen:
            continue
        pieces = tokenizer.convert_ids_to_tokens(target_ids(tokenizer, " " + word)) if word else []
        if len(pieces) >= 3 and len(word) / len(pieces) < 2.5:
            near = _nearer_word(tokenizer, word, min(2, len(pieces) - 2))
            if near is not None:
                return (f"{word!r} splits into {len(pieces)} short pieces ({' '.join(pieces)}) where {near[0]!r} takes "
                        f"{near[1]}: a typo? Forced as given")  # fmt: skip
    return None


_LETTERS = "abcdefghijklmnopqrstuvwxyzäöüß"


def _nearer_word(tokenizer, word: str, pieces: int) -> tuple[str, int] | None:
    """(a word one edit from `word`, its piece count) where one takes at most `pieces` pieces: a letter left out,
    added, replaced or swapped with the next, inside the word (its first letter and last two kept; not a change of
    case alone), the fewest pieces, then the first in that order; None if none does."""
    letters = sorted(set(_LETTERS + word.lower()))
    last = len(word) - 2  # edits stay within word[1:last]: the first letter and the ending are kept
    near = [word[:i] + word[i + 1 :] for i in range(1, last)]
    near += [word[:i] + word[i + 1] + word[i] + word[i + 2 :] for i in range(1, last - 1)]
    near += [word[:i] + c + word[i:] for i in range(1, last + 1) for c in letters]
    near += [word[:i] + c + word[i + 1 :] for i in range(1, last) for c in letters if c != word[i].lower()]
    near = [candidate for candidate in dict.fromkeys(near) if candidate.strip() and candidate.lower() != word.lower()]
    if not near:
        return None
    encoded = target_ids(tokenizer, [" " + candidate for candidate in near])
    counts = [len(ids) for ids in encoded]
    best = min(range(len(near)), key=lambda k: counts[k])
    return (near[best], counts[best]) if counts[best] <= pieces else None


def _tokenize_prefix(tokenizer, text: str, limit: int):
    """(prefix, encoding with offsets) of the shortest prefix of `text` tried that yields more than `limit` tokens,
    or of `text` itself when it is short. A prefix ends after a space where there is one in its second half, so
    that its tokens are those of the whole text (BPE does not merge across spaces), the last word included."""
    largest = limit * _CHARS_PER_TOKEN[1]
    size = min(max(limit * _CHARS_PER_TOKEN[0], _FIRST_PREFIX), largest)
    while True:
        prefix = text
        if len(text) > size:
            space = text.rfind(" ", size // 2, size)
            prefix = text[: space + 1 if space >= 0 else size]
        encoding = encode_with_offsets(tokenizer, prefix)
        if len(prefix) == len(text) or len(encoding["input_ids"]) > limit or size >= largest:
            return prefix, encoding
        size = min(4 * size, largest)


def _without_lone_surrogates(text: str) -> tuple[str, int]:
    """`text` with each lone surrogate as U+FFFD and each high-low surrogate pair as the character it encodes (what
    a UTF-16 decoder does), and the number of surrogate code points there were; UTF-8 cannot encode them."""
    count = sum(0xD800 <= ord(c) <= 0xDFFF for c in text)
    if count:
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text, count


def encode_source(tokenizer, text: str, limit: int, notes: list[str] | None = None, where: str = "") -> list[int]:
    """Token ids of one source text ending in `</s>`, cut to `limit` tokens with a warning; characters that the
    vocabulary lacks are named in a warning (they become `<unk>` and cannot be translated), lone surrogates become
    U+FFFD. The warnings start with `where` (say "line 7: ") and are also appended to `notes` when it is given."""

    def warn(message: str, *args) -> None:
        logger.warning(where + message, *args)
        if notes is not None:
            notes.append(where + message % args)

    text, surrogates = _without_lone_surrogates(text)
    if "\t" in text:  # most likely fairseq's constrained input, `source<TAB>term`, given without constraints
        warn("a tab in the source text: terms after a tab are constraints only with --constraints (constraints= "
             "in Python); here the whole line is translated as text")  # fmt: skip
    if surrogates:
        warn("%d surrogate code points (not Unicode characters) read as UTF-16: lone ones became U+FFFD", surrogates)
    characters = len(text)
    text, encoding = _tokenize_prefix(tokenizer, text, limit)
    ids = list(encoding["input_ids"])
    unk = tokenizer.unk_token_id
    spans = zip(ids, encoding["offset_mapping"], strict=True)
    unknown = sorted({text[start:end] for token, (start, end) in spans if unk is not None and token == unk} - {"\t"})
    if unknown:  # (a tab has its own warning above)
        warn(
            "%s outside the vocabulary became <unk> and cannot be translated: %s",
            "a character" if len(unknown) == 1 else f"{len(unknown)} characters",
            " ".join(repr(c) for c in unknown[:20]) + (" ..." if len(unknown) > 20 else ""),
        )
    if len(ids) > limit or characters > len(text):
        warn(
            "source of %s cut to the first %d tokens (max_source_tokens; the model is not meant for longer input): "
            "%r...",
            f"{len(ids)} tokens" if characters == len(text) else f"{characters} characters",
            min(limit, len(ids)),
            text[:60],
        )
    if len(ids) > limit:
        eos = tokenizer.eos_token_id
        ids = [*ids[: limit - 1], eos] if ids[-1] == eos else ids[:limit]
    return ids


class TranslationPipeline(Pipeline):
    """Translates text with `model.generate()` (the paper's search, §6.1, by default).

    Args, at construction or per call: `max_source_tokens` (longer sources are cut, with a warning),
    `clean_up_tokenization_spaces`, `batch_size`, and any `generate()` keyword (`num_beams`, `max_new_tokens`,
    `num_return_sequences`, `max_len_b`, ...), passed through. `constraints`: terms every translation must contain
    (terminology constraints, each tokenized as inside a sentence; `constraint_order="ordered"` keeps their order).

    Returns `[{"translation_text": ...}]` for one text and one such dict per text for a list of texts (a list of
    them per text when `num_return_sequences` > 1), as transformers 4's translation pipeline.
    """

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    _pipeline_calls_generate = True

    def _sanitize_parameters(self, max_source_tokens=None, clean_up_tokenization_spaces=None, constraints=None,
                             **generate_kwargs):  # fmt: skip
        preprocess = {} if max_source_tokens is None else {"max_source_tokens": max_source_tokens}
        if constraints is not None:
            terms = [constraints] if isinstance(constraints, str) else list(constraints)
            generate_kwargs["constraint_forms"] = [phrase_forms(self.tokenizer, term) for term in terms]
            for note in filter(None, (unusual_pieces(self.tokenizer, term) for term in terms)):
                logger.warning("constraint %s", note)
        postprocess = {}
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        # `generate()` keywords that GenerationConfig does not know (max_len_a, max_len_b) arrive here; those it
        # knows were set aside by Pipeline.__init__ and are merged back by `_prepare_generate_kwargs`.
        return preprocess, ({"generate_kwargs": generate_kwargs} if generate_kwargs else {}), postprocess

    def __call__(self, inputs: str | list[str], *args, **kwargs) -> list:
        result = super().__call__(inputs, *args, **kwargs)
        if isinstance(inputs, list) and all(len(records) == 1 for records in result):
            return [records[0] for records in result]
        return result

    def preprocess(self, text: str, max_source_tokens: int | None = None) -> dict[str, Any]:
        if not isinstance(text, str):
            raise TypeError(f"the translation pipeline takes text (a str or a list of str), got {type(text).__name__}")
        if not text.strip():
            logger.warning("empty or whitespace-only input: its translation is the empty string")
            ids = [self.tokenizer.eos_token_id]
        else:
            limit = max_source_tokens or default_max_source_tokens(self.model, self.tokenizer)
            ids = encode_source(self.tokenizer, text, limit)
        return {
            "input_ids": torch.tensor([ids]),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "blank": not text.strip(),
        }

    def _forward(self, model_inputs: dict[str, Any], generate_kwargs: dict | None = None) -> dict[str, Any]:
        blank = model_inputs.pop("blank")
        blank = [blank] if isinstance(blank, bool) else list(blank)
        generate_kwargs = {**self._forward_params.get("generate_kwargs", {}), **(generate_kwargs or {})}
        batch = model_inputs["input_ids"].shape[0]
        if all(blank):  # nothing to translate: no generation
            output_ids = torch.full((batch, 1, 1), self.tokenizer.eos_token_id, dtype=torch.long)
        else:
            forms = generate_kwargs.pop("constraint_forms", None)
            if forms:  # the same terms for every text of the batch
                generate_kwargs = {**generate_kwargs, "constraints": [forms] * batch}
            output_ids = self.model.generate(**model_inputs, **self._prepare_generate_kwargs(generate_kwargs))
            output_ids = output_ids.reshape(batch, output_ids.shape[0] // batch, *output_ids.shape[1:])
        return {"output_ids": output_ids, "blank": blank}

    def postprocess(self, model_outputs: dict[str, Any], clean_up_tokenization_spaces: bool = False) -> list[dict]:
        blank = model_outputs["blank"]
        blank = blank[0] if isinstance(blank, list) else blank
        return [
            {
                "translation_text": ""
                if blank
                else single_line(
                    self.tokenizer.decode(
                        ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                    )
                )
            }
            for ids in model_outputs["output_ids"][0]
        ]


__all__ = ["TranslationPipeline", "default_max_source_tokens", "encode_source", "single_line", "unusual_pieces"]
