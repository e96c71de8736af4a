"""CTranslate2, the C++ engine users pick for fast Marian decoding: the conversion of a Marian folder written by
`marian.save_marian` (`to_ctranslate2`, through CTranslate2's own Transformers converter) and translating with the
result (`ctranslate2_translate`; `ctranslate2_generate` for batches of our token ids, as the tests compare them).
`ctranslate2` is an optional dependency (`pip install vaswani-mt[ctranslate2]`), imported when used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path


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
    `config.json`, `shared_vocabulary.json`, plus `tokenizer.json` to tokenize with). `quantization`: None (the
    weights' float32), "int8", "int8_float32", "float16", ... as CTranslate2 names them."""
    import ctranslate2

    marian_dir, output = Path(marian_dir), Path(output)
    converter = ctranslate2.converters.TransformersConverter(
        str(marian_dir), copy_files=["tokenizer.json", "tokenizer_config.json"]
    )
    with _ctranslate2_marian_loader():
        converter.convert(str(output), quantization=quantization, force=True)
    return output


def ctranslate2_generate(translator, input_ids, attention_mask, tokenizer, **options) -> list[list[int]]:
    """Runs `translator.translate_batch` on a padded batch of our source ids and returns the target ids of the best
    hypothesis of each sentence (without the start token; `</s>` is not included by CTranslate2)."""
    sources = [
        tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist())
        for ids, mask in zip(input_ids, attention_mask, strict=True)
    ]
    results = translator.translate_batch(sources, **options)
    return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]


def ctranslate2_translate(translator, tokenizer, sentences: Sequence[str], **options) -> list[str]:
    """Translates `sentences` with a CTranslate2 model; `options` are `translate_batch`'s (beam_size, ...)."""
    sources = [tokenizer.convert_ids_to_tokens(tokenizer(s)["input_ids"]) for s in sentences]
    results = translator.translate_batch(sources, **options)
    return [tokenizer.convert_tokens_to_string(r.hypotheses[0]).strip() for r in results]


__all__ = ["ctranslate2_generate", "ctranslate2_translate", "to_ctranslate2"]
