"""Importing a real checkpoint of the paper's architecture: an OPUS-MT model (`MarianMTModel`, Helsinki-NLP/opus-mt-*)
as a vaswani_mt folder that every command takes as it takes a trained one (`import_model`).

The weights go through `export.marian.from_marian`, the exact inverse of `to_marian`; the tokenizer stays the
checkpoint's `MarianTokenizer` (two SentencePiece models, one vocabulary); the search becomes the paper's (§6.1)
with the checkpoint's own token bans (OPUS-MT never generates `<pad>`, its decoder start). The folder's card names
the source model, its license and its citation, as the Hub expects of a derived model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from vaswani_mt.hub.card import IMPORTED_TAG, TAGS
from vaswani_mt.inference.loading import ModelFolderError, local_folder
from vaswani_mt.model.generation_vaswani import PAPER_SEARCH
from vaswani_mt.system.messages import error_line

# What an OPUS-MT repository holds that the import reads: configs, the tokenizer's SentencePiece models and
# vocabulary, the card, and the weights (safetensors, else PyTorch's file, which transformers reads with
# `weights_only`: tensors, never code).
_HUB_PATTERNS = ["*.json", "*.spm", "*.safetensors", "README.md"]
_HUB_PICKLED_WEIGHTS = "pytorch_model.bin"

# OPUS-MT's models are CC-BY 4.0 and ask to be cited so (https://github.com/Helsinki-NLP/Opus-MT).
OPUS_MT_LICENSE = "cc-by-4.0"
OPUS_MT_CITATION = """@InProceedings{TiedemannThottingal:EAMT2020,
  author = {J{\\"o}rg Tiedemann and Santhosh Thottingal},
  title = {{OPUS-MT} -- {B}uilding open translation services for the {W}orld},
  booktitle = {Proceedings of the 22nd Annual Conference of the European Association for Machine Translation (EAMT)},
  year = {2020},
  address = {Lisbon, Portugal}
}"""


class ModelImportError(ModelFolderError):
    """A source that cannot be imported: the message names it and the problem in one line."""


def _source_folder(source: str) -> Path:
    """`source` as a folder here: itself, or the Hub repository's files (weights: safetensors where it has them)."""
    try:
        folder = local_folder(source, _HUB_PATTERNS)
        if not Path(source).expanduser().is_dir() and not any(folder.glob("*.safetensors")):
            folder = local_folder(source, [*_HUB_PATTERNS, _HUB_PICKLED_WEIGHTS])
    except ModelFolderError as error:
        raise ModelImportError(str(error)) from None
    return folder


def _check_marian_folder(source: str, folder: Path) -> None:
    try:
        values = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelImportError(f"{source} is not a model folder: it has no config.json") from None
    except (OSError, ValueError) as error:
        raise ModelImportError(f"{source}: config.json does not read as JSON ({error})") from None
    model_type = values.get("model_type") if isinstance(values, dict) else None
    if model_type != "marian":
        raise ModelImportError(f"{source} holds a {model_type!r} model; the import takes MarianMTModel (OPUS-MT) ones")
    missing = [name for name in ("source.spm", "target.spm", "vocab.json") if not (folder / name).is_file()]
    if missing:
        raise ModelImportError(f"{source} has no {', '.join(missing)}: the import needs the checkpoint's tokenizer")


def _source_card(folder: Path) -> tuple[dict, str]:
    """(the metadata, the BibTeX citation) that the source's card states, where it has a card."""
    path = folder / "README.md"
    if not path.is_file():
        return {}, ""
    card = ModelCard(path.read_text(encoding="utf-8"))
    text, start = card.text, card.text.find("@")
    citation = ""
    if "bibtex" in text.lower() and start >= 0 and "```" in text[start:]:
        citation = text[start : text.find("```", start)].strip()
    return card.data.to_dict(), citation


# The card's widget examples where the source's card has none and the source language is English.
_ENGLISH_EXAMPLES = ["The house is small.", "How are you today?"]


def import_card(source: str, folder: Path, config, generation_config, tokenizer) -> str:
    """The imported folder's README.md: what it is, where it came from, its license and citation, its languages (the
    tokenizer's) and widget examples, how to use it."""
    metadata, citation = _source_card(folder)
    license_ = metadata.get("license") if isinstance(metadata.get("license"), str) else None
    opus = source.startswith("Helsinki-NLP/")  # OPUS-MT's own repositories (a card, where there is one, says more)
    license_ = license_ or (OPUS_MT_LICENSE if opus else "other")
    citation = citation or (OPUS_MT_CITATION if opus else "")
    base = source if len(Path(source).parts) == 2 and not Path(source).expanduser().exists() else None
    languages = [getattr(tokenizer, "source_lang", None), getattr(tokenizer, "target_lang", None)]
    english = [{"text": text} for text in _ENGLISH_EXAMPLES] if languages[0] in ("en", "eng") else None
    widget = metadata.get("widget") or english
    data = ModelCardData(license=license_, library_name="transformers", pipeline_tag="translation",
                         language=languages if all(languages) else None, widget=widget,
                         tags=[*TAGS, IMPORTED_TAG, "opus-mt", "marian"], base_model=base)  # fmt: skip
    beams, alpha = generation_config.num_beams, generation_config.length_penalty
    unstated = "" if license_ != "other" else ": the source states none here; check it before you publish"
    cite = f"\n## Citation\n\nCite the source model:\n\n```bibtex\n{citation}\n```\n" if citation else ""
    body = f"""
# {source}, imported into vaswani_mt

`{source}` (a `MarianMTModel`), converted exactly into the Transformer of *Attention Is All You Need* as the
vaswani_mt package implements it: `vaswani-mt-import --model {source} --output OUT`. The logits are MarianMTModel's
to float32 round-off; the weights are the source's, under the source's license ({license_}{unstated}).

- Shape: d_model {config.d_model}, {config.num_heads} heads, FFN {config.d_ff} ({config.activation_function}),
  {config.num_encoder_layers} + {config.num_decoder_layers} layers, {config.vocab_size} tokens, one shared matrix
  (§3.4).
- Search saved in `generation_config.json`: the paper's (§6.1), beam {beams}, GNMT length penalty α = {alpha},
  at most the input's length + {PAPER_SEARCH["max_len_b"]} tokens.
- Tokenizer: the source's `MarianTokenizer` (source.spm, target.spm, vocab.json).

## How to use

```bash
vaswani-mt-translate --model OUT --input text.en --output text.de
```
{cite}"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}").content


def import_model(source: str, output: str | os.PathLike) -> Path:
    """Imports the MarianMTModel at `source` (a folder here or a Hub id) into `output`: weights (`from_marian`),
    config, remote code, the tokenizer, `generation_config.json` with the paper's search, a card. Refused in one line
    (`ModelImportError`, a ValueError) before anything is written: not a Marian folder, no tokenizer, what the paper's
    architecture cannot represent exactly (`export.marian.vaswani_config`). `output` is written whole."""
    from transformers import AutoTokenizer, MarianMTModel

    from vaswani_mt.export.marian import from_marian
    from vaswani_mt.system.folders import written_whole

    folder = _source_folder(str(source))
    _check_marian_folder(str(source), folder)
    try:
        marian = MarianMTModel.from_pretrained(folder, dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = from_marian(marian.eval())
    except (OSError, ValueError, ImportError) as error:  # ImportError: sentencepiece missing
        raise ModelImportError(f"{source}: {error_line(error)}") from error
    # OPUS-MT bans `<pad>`, its decoder start, from the output; a source that names no ban gets that one.
    bans = marian.generation_config.bad_words_ids
    pad = model.config.pad_token_id
    model.generation_config.bad_words_ids = bans or ([[pad]] if pad not in (None, model.config.eos_token_id) else None)
    with written_whole(output) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        card = import_card(str(source), folder, model.config, model.generation_config, tokenizer)
        (Path(staging) / "README.md").write_text(card, encoding="utf-8")
    return Path(output)


__all__ = ["OPUS_MT_CITATION", "OPUS_MT_LICENSE", "ModelImportError", "import_card", "import_model"]
