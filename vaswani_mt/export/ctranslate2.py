"""CTranslate2, the C++ engine users pick for fast Marian decoding: the conversion of a Marian folder written by
`marian.save_marian` (`to_ctranslate2`, through CTranslate2's own Transformers converter). Translating with the
result is inference's (`vaswani_mt.inference.ctranslate2.CTranslate2Model`, re-exported here). `ctranslate2` is an
optional dependency (`pip install vaswani-mt[ctranslate2]`), imported when used. How to run it: docs/export.md.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from vaswani_mt.inference.ctranslate2 import (
    CTranslate2Model,
    ctranslate2_generate,
    ctranslate2_nbest,
    ctranslate2_search,
    load_ctranslate2,
)


def _converter(marian_dir: Path):
    """A CTranslate2 `Converter` (its public extension point: a subclass that implements `_load`) of the Marian folder
    that `save_marian` wrote. CTranslate2's Marian loader assumes OPUS-MT's conventions: `<pad>` is the last token
    (its row is dropped) and the decoder starts from a zero embedding. A vaswani_mt model has `<pad>` = 1 and starts
    the decoder from the trained embedding of `<s>` (fairseq's order), so the spec is built by the loader of the same
    architecture without those two OPUS-MT rules (CTranslate2's BART loader, which reads `decoder_start_token_id`
    from the config). No registry of CTranslate2's is changed."""
    import ctranslate2
    from ctranslate2.converters import transformers as ct2_transformers
    from transformers import AutoTokenizer, MarianMTModel

    class VaswaniMarianLoader(ct2_transformers.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False  # post-LN
            model.config.normalize_embedding = False  # no LayerNorm on the embeddings
            return ct2_transformers.BartLoader.get_model_spec(self, model)

        def set_config(self, config, model, tokenizer):
            ct2_transformers.BartLoader.set_config(self, config, model, tokenizer)
            if config.bos_token is None:  # an imported OPUS-MT model's MarianTokenizer has none: `</s>`, as CT2's own
                config.bos_token = tokenizer.eos_token

        def set_decoder(self, spec, decoder):
            ct2_transformers.BartLoader.set_decoder(self, spec, decoder)

        def get_vocabulary(self, model, tokenizer):
            return ct2_transformers.BartLoader.get_vocabulary(self, model, tokenizer)

    class VaswaniMarianConverter(ctranslate2.converters.Converter):
        def _load(self):
            model = MarianMTModel.from_pretrained(marian_dir, dtype=torch.float32)
            return VaswaniMarianLoader()(model, AutoTokenizer.from_pretrained(marian_dir))

    return VaswaniMarianConverter()


def to_ctranslate2(marian_dir: str | Path, output: str | Path, quantization: str | None = None) -> Path:
    """Converts a Marian folder written by `save_marian` to a CTranslate2 model in `output` (`model.bin`,
    `config.json`, `shared_vocabulary.json`, plus the tokenizer's files to tokenize with; `export_model` adds our
    generation_config.json, the search `ctranslate2_search` reads). `quantization`: None (the
    weights' float32), "int8", "int8_float32", "float16", ... as CTranslate2 names them."""
    marian_dir, output = Path(marian_dir), Path(output)
    with torch.no_grad():
        _converter(marian_dir).convert(str(output), quantization=quantization, force=True)
    # Ours (tokenizer.json) or an imported checkpoint's MarianTokenizer (its SentencePiece models and vocabulary).
    for name in ("tokenizer.json", "tokenizer_config.json", "source.spm", "target.spm", "vocab.json"):
        if (marian_dir / name).is_file():
            shutil.copy(marian_dir / name, output / name)
    return output


__all__ = ["CTranslate2Model", "ctranslate2_generate", "ctranslate2_nbest", "ctranslate2_search",
           "load_ctranslate2", "to_ctranslate2"]  # fmt: skip
