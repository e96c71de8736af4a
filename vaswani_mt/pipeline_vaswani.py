"""The translation pipeline of a vaswani_mt model: `pipeline("translation", model=folder, trust_remote_code=True)`.

transformers 5 removed its `translation` task. A folder saved by vaswani_mt names this file in its config.json
(`custom_pipelines`, as `Pipeline.save_pretrained` writes it), and `save_pretrained` copies the file next to the
model code (modeling_vaswani.py imports `CUSTOM_PIPELINES` from it), so
`pipeline("translation", model=folder, trust_remote_code=True)` and
`pipeline(model=folder, trust_remote_code=True)` load it as remote code. It answers in the schema of the Hub's
translation widget: `[{"translation_text": ...}]` per input.

Input that the model cannot translate as given is handled, with a warning, never with a shape error:
- an empty or whitespace-only text translates to "" (no generation runs for it);
- a text longer than `max_source_tokens` (default: the config's `max_position_embeddings`, 1024, the longest input
  the model is meant to see) is cut to that many tokens, its final `</s>` kept;
- characters outside the vocabulary become `<unk>`, which the warning names.

Self-contained (torch and transformers only) so that `save_pretrained` ships it as Hub remote code.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Pipeline
from transformers.utils import logging

logger = logging.get_logger(__name__)

# How `config.json` names this pipeline (`custom_pipelines`): the task, the class in this file and the Auto class
# that loads the model for it. The model's `save_pretrained` (modeling_vaswani.py) writes this dict.
CUSTOM_PIPELINES = {
    "translation": {
        "impl": "pipeline_vaswani.TranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}


def default_max_source_tokens(model, tokenizer) -> int:
    """The default longest source: `config.max_position_embeddings`, or the tokenizer's limit if smaller."""
    limits = [getattr(model.config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    limits = [limit for limit in limits if isinstance(limit, int) and 0 < limit < 10**9]
    return min(limits) if limits else 1024


def encode_source(tokenizer, text: str, limit: int, notes: list[str] | None = None) -> list[int]:
    """Token ids of one source text ending in `</s>`, cut to `limit` tokens with a warning; characters that the
    vocabulary lacks are named in a warning (they become `<unk>` and cannot be translated). The warnings are also
    appended to `notes` when it is given."""

    def warn(message: str, *args) -> None:
        logger.warning(message, *args)
        if notes is not None:
            notes.append(message % args)

    encoding = tokenizer(text, return_offsets_mapping=True, verbose=False)
    ids = list(encoding["input_ids"])
    unk = tokenizer.unk_token_id
    if unk is not None and unk in ids:
        spans = zip(ids, encoding["offset_mapping"], strict=True)
        unknown = sorted({text[start:end] for token, (start, end) in spans if token == unk})
        warn(
            "%s outside the vocabulary became <unk> and cannot be translated: %s",
            "a character" if len(unknown) == 1 else f"{len(unknown)} characters",
            " ".join(repr(c) for c in unknown),
        )
    if len(ids) > limit:
        warn(
            "source of %d tokens cut to the first %d (max_source_tokens; the model is not meant for longer input): "
            "%r...",
            len(ids),
            limit,
            text[:60],
        )
        eos = tokenizer.eos_token_id
        ids = [*ids[: limit - 1], eos] if ids[-1] == eos else ids[:limit]
    return ids


class TranslationPipeline(Pipeline):
    """Translates text with `model.generate()` (the paper's search by default: beam 4, GNMT alpha 0.6, input
    length + 50).

    Args, at construction or per call: `max_source_tokens` (longer sources are cut, with a warning),
    `clean_up_tokenization_spaces`, `batch_size`, and any `generate()` keyword (`num_beams`, `max_new_tokens`,
    `num_return_sequences`, `max_len_b`, ...), passed through.

    Returns `[{"translation_text": ...}]` for one text and one such dict per text for a list of texts (a list of
    them per text when `num_return_sequences` > 1), as transformers 4's translation pipeline did.
    """

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    _pipeline_calls_generate = True

    def _sanitize_parameters(self, max_source_tokens=None, clean_up_tokenization_spaces=None, **generate_kwargs):
        preprocess = {} if max_source_tokens is None else {"max_source_tokens": max_source_tokens}
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
                else self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                ).strip()
            }
            for ids in model_outputs["output_ids"][0]
        ]


__all__ = ["CUSTOM_PIPELINES", "TranslationPipeline", "default_max_source_tokens", "encode_source"]
