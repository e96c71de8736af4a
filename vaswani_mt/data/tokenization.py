"""One BPE vocabulary shared by source and target (§5.1), built with the `tokenizers` library.

SentencePiece-style: text is NFC-normalised, spaces become the `▁` marker, BPE merges are learned over both
languages together, and decoding puts the spaces back, so ordinary German and English (accents, punctuation)
round-trip exactly. Special tokens follow fairseq's order: `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from datasets.fingerprint import Hasher
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from .corpus import remove_damaged_cache_files

logger = logging.getLogger(__name__)

# A word as the typo warning takes one (`record_seen_words`): letters, with inner hyphens or apostrophes.
_WORD = re.compile(r"[^\W\d_]+(?:[-'’][^\W\d_]+)*")

SPECIAL_TOKENS = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 37000,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    model_max_length: int = 1024,
) -> PreTrainedTokenizerFast:
    """Learns a joint BPE vocabulary of at most `vocab_size` tokens from `texts` (source and target sentences).

    Returns a `PreTrainedTokenizerFast` that appends `</s>` to every sequence; `tok(src, text_target=tgt)` gives
    `input_ids` and `labels`. It saves `tokenizer.json` and loads back with `AutoTokenizer`.
    """
    specials = list(SPECIAL_TOKENS.values())
    if vocab_size <= len(specials):
        raise ValueError(f"vocab_size must be larger than the {len(specials)} special tokens, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        limit_alphabet=limit_alphabet,
        show_progress=False,
    )
    count = 0

    def _counted(lines: Iterable[str]) -> Iterable[str]:
        nonlocal count
        for line in lines:
            count += 1
            yield line

    tokenizer.train_from_iterator(_counted(texts), trainer=trainer)
    if count == 0:
        raise ValueError("train_tokenizer got no texts")
    eos = SPECIAL_TOKENS["eos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, tokenizer.token_to_id(eos))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=model_max_length, padding_side="right", **SPECIAL_TOKENS
    )


def config_token_ids(tokenizer) -> dict[str, int]:
    """The `VaswaniConfig` fields a tokenizer decides: the vocabulary size and the special token ids (the decoder
    starts from `<s>`, fairseq's convention)."""
    return {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.bos_token_id,
    }


def build_tokenizer(
    corpus,
    languages: tuple[str, str],
    output_dir: str | os.PathLike,
    *,
    tokenizer: str | None = None,
    model_name_or_path: str | None = None,
    vocab_size: int = 37000,
    sample: int = 0,
):
    """The run's tokenizer: a given one (`tokenizer`, else `model_name_or_path`'s), the run's own from an earlier
    attempt (`output_dir/tokenizer`), or a new joint BPE learned on the train split of `corpus` (§5.1), on a random
    `sample` of its pairs when 0 < sample < its size."""
    saved = Path(output_dir) / "tokenizer"
    if tokenizer:
        return AutoTokenizer.from_pretrained(tokenizer)
    if model_name_or_path:
        return AutoTokenizer.from_pretrained(model_name_or_path)
    if (saved / "tokenizer.json").is_file():
        logger.info("reusing this run's tokenizer from %s", saved)
        return AutoTokenizer.from_pretrained(saved)
    train = corpus["train"]
    if 0 < sample < len(train):
        rows = np.random.default_rng(0).choice(len(train), sample, replace=False)
        train = train.select(np.sort(rows))
    trained = train_tokenizer(side_texts(train, languages), vocab_size=vocab_size)
    record_seen_words(trained, side_texts(train, languages[1:]))
    tmp = Path(output_dir) / "tokenizer.tmp"
    trained.save_pretrained(tmp)
    os.replace(tmp, saved)  # whole or not at all: a resumed run must find the very same vocabulary
    logger.info("trained a %d-token BPE vocabulary on %d sentences", len(trained), len(train) * 2)
    return trained


def record_seen_words(tokenizer, targets: Iterable[str]) -> list[str]:
    """Records in `tokenizer`'s config (`SEEN_WORDS`, saved with it) the words of `targets` (the training split's
    target side) that the typo warning for terms (`unusual_pieces`) would question: seen in training, none is ever
    called a typo. Only those go in (1% of the words of the built-in corpus's target side); returns them."""
    from vaswani_mt.model.constraints_vaswani import target_ids
    from vaswani_mt.model.pipeline_vaswani import SEEN_WORDS, unusual_pieces

    words = sorted({word for text in targets for word in _WORD.findall(text)})
    pieces = target_ids(tokenizer, [" " + word for word in words]) if words else []
    finely = [word for word, ids in zip(words, pieces, strict=True) if len(ids) >= 3 and len(word) / len(ids) < 2.5]
    tokenizer.init_kwargs[SEEN_WORDS] = []
    seen = [word for word in finely if unusual_pieces(tokenizer, word) is not None]
    tokenizer.init_kwargs[SEEN_WORDS] = seen
    return seen


def tokenizer_content(tokenizer) -> str:
    """A hash of what a tokenizer does: its class, its `tokenizers` JSON (vocabulary, merges, normalizer,
    post-processor) and special tokens; equal for a trained tokenizer and the same one saved and loaded again."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow tokenizer: datasets' hash of the object
        return Hasher.hash(tokenizer)
    return Hasher.hash([type(tokenizer).__name__, backend.to_str(), tokenizer.special_tokens_map,
                        tokenizer.model_max_length])  # fmt: skip


def side_texts(pairs, languages: tuple[str, ...], batch_size: int = 10_000) -> Iterator[str]:
    """Every sentence of `pairs` (a `datasets.Dataset` of `translation` rows) on each side in turn (all sources,
    then all targets), streamed in batches: a corpus of millions of pairs is never a Python list."""
    for lang in languages:
        for batch in pairs.iter(batch_size=batch_size):
            yield from (row[lang] for row in batch["translation"])


def tokenize_corpus(
    corpus,
    tokenizer,
    source_lang: str,
    target_lang: str,
    *,
    max_source_length: int = 256,
    max_target_length: int = 256,
    num_proc: int | None = None,
) -> dict:
    """Adds input_ids / labels (both ending in EOS) and their lengths with `datasets.map` (in `num_proc`
    processes, cached next to a corpus read from disk); drops over-long training pairs, with a count.

    The cache is keyed by the corpus's fingerprint, the tokenizer's content (`tokenizer_content`, the same in every
    process and after a reload), the languages and the maximum lengths, so a change never reads an old result;
    damaged cache files are removed first (`remove_damaged_cache_files`)."""
    src, tgt = source_lang, target_lang
    max_source, max_target = max_source_length, max_target_length

    def encode(batch):
        sources = [row[src] for row in batch["translation"]]
        targets = [row[tgt] for row in batch["translation"]]
        encoded = tokenizer(sources, text_target=targets)
        encoded["source_length"] = [len(ids) for ids in encoded["input_ids"]]
        encoded["target_length"] = [len(ids) for ids in encoded["labels"]]
        return encoded

    def short_enough(source_lengths, target_lengths):
        return [s <= max_source and t <= max_target for s, t in zip(source_lengths, target_lengths, strict=True)]

    content = tokenizer_content(tokenizer)
    out = {}
    for split, dataset in corpus.items():
        remove_damaged_cache_files(dataset)
        started = time.time()
        fingerprint = Hasher.hash([dataset._fingerprint, "tokenize_corpus", content, src, tgt])
        dataset = dataset.map(encode, batched=True, remove_columns=dataset.column_names, num_proc=num_proc,
                              desc=f"tokenizing {split}", new_fingerprint=fingerprint)  # fmt: skip
        cached = [Path(f["filename"]) for f in dataset.cache_files]
        if cached:  # on disk: whether this process tokenized it, or read what another one (or an earlier run) wrote
            reused = all(path.stat().st_mtime < started for path in cached)
            logger.info("%s the %s split (%d pairs) %s datasets' cache", "read" if reused else "tokenized", split,
                        len(dataset), "from" if reused else "into")  # fmt: skip
        if split == "train":
            before = len(dataset)
            dataset = dataset.filter(short_enough, input_columns=["source_length", "target_length"], batched=True,
                                     batch_size=10_000, num_proc=num_proc)  # fmt: skip
            if len(dataset) < before:
                logger.warning(
                    "dropped %d of %d training pairs longer than %d source / %d target tokens",
                    before - len(dataset),
                    before,
                    max_source,
                    max_target,
                )
        out[split] = dataset
    return out


__all__ = [
    "SPECIAL_TOKENS",
    "build_tokenizer",
    "config_token_ids",
    "record_seen_words",
    "side_texts",
    "tokenize_corpus",
    "train_tokenizer",
]
