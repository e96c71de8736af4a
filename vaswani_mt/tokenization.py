"""One BPE vocabulary shared by source and target (§5.1), built with the `tokenizers` library.

SentencePiece-style: text is NFC-normalised, spaces become the `▁` marker, BPE merges are learned over both
languages together, and decoding puts the spaces back, so ordinary German and English (accents, punctuation)
round-trip exactly. With `split_punctuation=True` every punctuation mark is a piece of its own, as in the
Moses-tokenized text the paper's BPE was learned on: no merge joins a word and the mark after it (`▁hatte.`), so a
word has one spelling wherever it stands in the sentence, and the text still round-trips exactly. Special tokens
follow fairseq's order: `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 37000,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    model_max_length: int = 1024,
    split_punctuation: bool = False,
    extra_special_tokens: Sequence[str] = (),
) -> PreTrainedTokenizerFast:
    """Learns a joint BPE vocabulary of at most `vocab_size` tokens from `texts` (source and target sentences).

    Returns a `PreTrainedTokenizerFast` that appends `</s>` to every sequence; `tok(src, text_target=tgt)` gives
    `input_ids` and `labels`. It saves `tokenizer.json` and loads back with `AutoTokenizer`. `split_punctuation`
    isolates each punctuation character (Unicode P*) before BPE, so no token mixes a word and a mark.
    `extra_special_tokens` (such as the data tag `<extra>`, `vaswani_mt.data.EXTRA_DATA_TAG`) get the ids after
    `<unk>`, are never split, and are dropped by `decode(..., skip_special_tokens=True)`.
    """
    specials = list(SPECIAL_TOKENS.values()) + [t for t in extra_special_tokens if t not in SPECIAL_TOKENS.values()]
    if vocab_size <= len(specials):
        raise ValueError(f"vocab_size must be larger than the {len(specials)} special tokens, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    if split_punctuation:  # after Metaspace: a mark keeps no `▁` of its own, so decoding adds no space
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [tokenizer.pre_tokenizer, pre_tokenizers.Punctuation(behavior="isolated")]
        )
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
    extra = {"extra_special_tokens": specials[len(SPECIAL_TOKENS) :]} if len(specials) > len(SPECIAL_TOKENS) else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=model_max_length, padding_side="right", **SPECIAL_TOKENS, **extra
    )


class BPEDropoutCollator:
    """BPE-dropout (Provilkov et al., 2020) for training batches: each pair is segmented anew, every merge skipped
    with probability `dropout`, before `collator` pads the batch.

    A regulariser for small corpora: a sentence seen for the tenth time arrives in a new segmentation, so the model
    learns words from their pieces too. Pairs arrive tokenized; each side is decoded back to its text (exact: the
    tokenizer round-trips) and encoded again by a copy of the tokenizer whose BPE drops merges. A pair with an
    unknown token, or whose new encoding would be longer than `max_length`, keeps its own ids. The segmentations
    come from the `tokenizers` library's own random generator, which cannot be seeded: with dropout a run is not
    bit-for-bit repeatable. Only the training loader uses it; evaluation sees the deterministic segmentation.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerFast, dropout: float, collator: Callable, max_length: int = 1024):
        if not 0.0 < dropout < 1.0:
            raise ValueError(f"BPE-dropout must be in (0, 1), got {dropout}")
        if not hasattr(tokenizer.backend_tokenizer.model, "dropout"):
            raise ValueError(
                f"BPE-dropout needs a BPE tokenizer, got {type(tokenizer.backend_tokenizer.model).__name__}"
            )
        self.tokenizer = tokenizer
        self.dropped = copy.deepcopy(tokenizer)
        self.dropped.backend_tokenizer.model.dropout = dropout
        self.collator = collator
        self.max_length = max_length

    def __call__(self, features: list[dict]) -> dict:
        unk = self.tokenizer.unk_token_id
        redo = [i for i, f in enumerate(features) if unk not in f["input_ids"] and unk not in f["labels"]]
        if redo:
            sources = self.tokenizer.batch_decode([features[i]["input_ids"] for i in redo], skip_special_tokens=True)
            targets = self.tokenizer.batch_decode([features[i]["labels"] for i in redo], skip_special_tokens=True)
            encoded = self.dropped(sources, text_target=targets)
            features = list(features)
            for i, source, target in zip(redo, encoded["input_ids"], encoded["labels"], strict=True):
                if max(len(source), len(target)) <= self.max_length:
                    features[i] = {**features[i], "input_ids": source, "labels": target}
                    if "attention_mask" in features[i]:
                        features[i]["attention_mask"] = [1] * len(source)
        return self.collator(features)


__all__ = ["SPECIAL_TOKENS", "BPEDropoutCollator", "train_tokenizer"]
