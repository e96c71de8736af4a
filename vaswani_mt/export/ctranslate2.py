"""CTranslate2, the C++ engine users pick for fast Marian decoding: the conversion of a Marian folder written by
`marian.save_marian` (`to_ctranslate2`, through CTranslate2's own Transformers converter) and translating with the
result: `CTranslate2Model(folder).translate(sentences)` with the model's own search by default; under it
`ctranslate2_translate` and, for batches of our token ids, `ctranslate2_generate`, with the search given.
`ctranslate2` is an optional dependency (`pip install vaswani-mt[ctranslate2]`), imported when used. How to run it:
docs/export.md.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch

from vaswani_mt.model.generation_vaswani import sentence_limits
from vaswani_mt.model.pipeline_vaswani import encode_source, single_line

# The generation_config.json keys of the model's search (§6.1), and their names among translate_batch's options.
_SEARCH_OPTIONS = {"num_beams": "beam_size", "length_penalty": "length_penalty"}
_LENGTH_RULE = ("max_len_a", "max_len_b")


@contextlib.contextmanager
def _ctranslate2_marian_loader() -> Iterator[None]:
    """CTranslate2's Marian loader assumes OPUS-MT's conventions: `<pad>` is the last token (its row is dropped) and
    the decoder starts from a zero embedding. A vaswani_mt model has `<pad>` = 1 and starts the decoder from the
    trained embedding of `<s>` (fairseq's order), so the conversion uses the loader of the same architecture without
    those two OPUS-MT rules (CTranslate2's BART loader, which reads `decoder_start_token_id` from the config)."""
    from ctranslate2.converters import transformers as ct2_transformers

    class VaswaniMarianLoader(ct2_transformers.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False  # post-LN
            model.config.normalize_embedding = False  # no LayerNorm on the embeddings
            return ct2_transformers.BartLoader.get_model_spec(self, model)

        def set_config(self, config, model, tokenizer):
            ct2_transformers.BartLoader.set_config(self, config, model, tokenizer)

        def set_decoder(self, spec, decoder):
            ct2_transformers.BartLoader.set_decoder(self, spec, decoder)

        def get_vocabulary(self, model, tokenizer):
            return ct2_transformers.BartLoader.get_vocabulary(self, model, tokenizer)

    loaders = ct2_transformers._MODEL_LOADERS
    original = loaders["MarianConfig"]
    loaders["MarianConfig"] = VaswaniMarianLoader()
    try:
        yield
    finally:
        loaders["MarianConfig"] = original


def to_ctranslate2(marian_dir: str | Path, output: str | Path, quantization: str | None = None) -> Path:
    """Converts a Marian folder written by `save_marian` to a CTranslate2 model in `output` (`model.bin`,
    `config.json`, `shared_vocabulary.json`, plus `tokenizer.json` to tokenize with; `export_model` adds our
    generation_config.json, the search `ctranslate2_search` reads). `quantization`: None (the
    weights' float32), "int8", "int8_float32", "float16", ... as CTranslate2 names them."""
    import ctranslate2

    marian_dir, output = Path(marian_dir), Path(output)
    converter = ctranslate2.converters.TransformersConverter(
        str(marian_dir), copy_files=["tokenizer.json", "tokenizer_config.json"]
    )
    with _ctranslate2_marian_loader():
        converter.convert(str(output), quantization=quantization, force=True)
    return output


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


def _translate_batch(translator, sources: list[list[str]], search: Mapping | None, options: dict) -> list:
    """`translator.translate_batch(sources)` with `search`'s options under `options`. With a length rule (and no
    `max_decoding_length` in `options`) the sentences of one limit go together, as translate_batch takes one limit
    per call: our limit counts `</s>`, which CTranslate2 does not return, so a translation cut at the limit has
    `limit - 1` tokens in both."""
    search = dict(search or {})
    a, b = (search.pop(name, None) for name in _LENGTH_RULE)
    options = {**search, **options}
    if b is None or "max_decoding_length" in options:
        return translator.translate_batch(sources, **options)
    limits = (sentence_limits(a, b, torch.tensor([len(tokens) for tokens in sources])) - 1).tolist()
    results: list = [None] * len(sources)
    for limit in sorted(set(limits)):
        group = [i for i, own in enumerate(limits) if own == limit]
        found = translator.translate_batch([sources[i] for i in group], max_decoding_length=limit, **options)
        for i, result in zip(group, found, strict=True):
            results[i] = result
    return results


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


def ctranslate2_translate(
    translator, tokenizer, sentences: Sequence[str], search: Mapping | None = None, **options
) -> list[str]:
    """Translates `sentences` with a CTranslate2 model: with `search = ctranslate2_search(folder)`, the model's search
    (its beam size and length penalty, and each sentence's own limit of |X| + 50 tokens); `options` are
    translate_batch's and win. Sources are read as `translate()` reads them (`pipeline_vaswani.encode_source`: cut
    at the tokenizer's `model_max_length`, <unk> named in a warning) and a blank one gives "".

    CTranslate2 divides a hypothesis's log-probability by |Y|^alpha where ours divides by GNMT's ((5 + |Y|) / 6)^alpha,
    so beam search with alpha > 0 may rank some hypotheses otherwise; greedy search gives our tokens."""
    limit = tokenizer.model_max_length if 0 < (tokenizer.model_max_length or 0) < 10**9 else 1024
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    sources = [tokenizer.convert_ids_to_tokens(encode_source(tokenizer, sentences[i], limit)) for i in todo]
    results = _translate_batch(translator, sources, search, {"max_input_length": 0, **options}) if todo else []
    translations = [""] * len(sentences)
    for i, result in zip(todo, results, strict=True):
        ids = tokenizer.convert_tokens_to_ids(result.hypotheses[0])
        translations[i] = single_line(tokenizer.decode(ids, skip_special_tokens=True))  # as translate() decodes
    return translations


class CTranslate2Model:
    """A CTranslate2 export ready to translate with the model's search: its `translator` (`ctranslate2.Translator`,
    `translator_options` such as device="cuda" or compute_type="int8"), its `tokenizer` and its `search`
    (`ctranslate2_search`)."""

    def __init__(self, folder: str | Path, **translator_options):
        import ctranslate2
        from transformers import AutoTokenizer

        self.translator = ctranslate2.Translator(str(folder), **{"device": "cpu", **translator_options})
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.search = ctranslate2_search(folder)

    def translate(self, sentences: Sequence[str], **options) -> list[str]:
        """`ctranslate2_translate` with the model's search; `options` (translate_batch's: beam_size=1, ...) win."""
        return ctranslate2_translate(self.translator, self.tokenizer, sentences, self.search, **options)


__all__ = ["CTranslate2Model", "ctranslate2_generate", "ctranslate2_search", "ctranslate2_translate", "to_ctranslate2"]
