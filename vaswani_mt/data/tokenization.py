"""One BPE vocabulary shared by source and target (§5.1), built with the `tokenizers` library.

SentencePiece-style: text is NFC-normalised, spaces become the `▁` marker, BPE merges are learned over both
languages together, and decoding puts the spaces back, so ordinary German and English (accents, punctuation)
round-trip exactly. Special tokens follow fairseq's order: `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

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


__all__ = ["SPECIAL_TOKENS", "config_token_ids", "train_tokenizer"]
