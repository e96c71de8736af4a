import pytest
from conftest import SENTENCES
from transformers import AutoTokenizer

from vaswani_mt.tokenization import train_tokenizer


def test_special_tokens_in_fairseq_order(tokenizer):
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<s>", "<pad>", "</s>", "<unk>"]
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )


def test_source_and_target_share_one_vocabulary_and_end_in_eos(tokenizer):
    english, german = SENTENCES[0]
    batch = tokenizer([english], text_target=[german])
    assert batch["input_ids"][0][-1] == 2 and batch["labels"][0][-1] == 2
    assert tokenizer(german)["input_ids"] == batch["labels"][0]  # the same tokenizer encodes both sides


@pytest.mark.parametrize("text", [side for pair in SENTENCES for side in pair] + ["Straße über Öl, Café!  Sie."])
def test_decoding_gives_back_the_text(tokenizer, text):
    assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text


def test_vocabulary_size_is_respected():
    texts = [side for pair in SENTENCES for side in pair] * 3
    tokenizer = train_tokenizer(texts, vocab_size=120, min_frequency=1)
    assert len(tokenizer) <= 120
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(texts, vocab_size=3)
    with pytest.raises(ValueError, match="no texts"):
        train_tokenizer([], vocab_size=100)


def test_unknown_characters_become_unk(tokenizer):
    assert 3 in tokenizer("天")["input_ids"]


def test_saves_tokenizer_json_and_loads_with_auto_tokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").exists()
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for english, german in SENTENCES:
        assert loaded(english, text_target=german) == tokenizer(english, text_target=german)


def test_split_punctuation_keeps_marks_apart_from_words_and_round_trips():
    texts = ([side for pair in SENTENCES for side in pair] + ["I can’t (really) say: “E-Mail”…"]) * 3
    joined = train_tokenizer(texts, vocab_size=400, min_frequency=1)
    split = train_tokenizer(texts, vocab_size=400, min_frequency=1, split_punctuation=True)

    def mixed(tokenizer):  # tokens that hold a letter and a punctuation mark
        return [t for t in tokenizer.get_vocab() if any(c.isalpha() for c in t) and any(c in ".,!?’" for c in t)]

    assert mixed(joined) and not mixed(split)
    for text in texts:
        ids = split(text)["input_ids"]
        assert split.decode(ids, skip_special_tokens=True) == text
    english = SENTENCES[0][0]
    assert split.convert_ids_to_tokens(split(english)["input_ids"])[-2] == english[-1]  # the final mark alone


def test_bpe_dropout_collator_resegments_training_pairs_and_keeps_their_text(tokenizer):
    from transformers import DataCollatorForSeq2Seq

    from vaswani_mt.tokenization import BPEDropoutCollator

    pairs = [pair for pair in SENTENCES if "<unk>" not in tokenizer.tokenize(pair[0] + pair[1])]
    features = [dict(tokenizer(english, text_target=german)) for english, german in pairs]
    features.append(dict(tokenizer("Ich ☃ sehe", text_target="I ☃ see")))  # holds <unk>: kept as it is
    collator = BPEDropoutCollator(tokenizer, 0.5, lambda batch: batch)
    seen = set()
    for _ in range(5):
        out = collator(features)
        assert out[-1] == features[-1]
        for feature, new in zip(features[:-1], out[:-1], strict=True):
            for side in ("input_ids", "labels"):
                text = tokenizer.decode(feature[side], skip_special_tokens=True)
                assert tokenizer.decode(new[side], skip_special_tokens=True) == text and new[side][-1] == 2
            assert len(new["attention_mask"]) == len(new["input_ids"])
            seen.add(tuple(new["labels"]))
    assert len(seen) > len(features)  # new segmentations, more pieces on average
    assert sum(map(len, (f["labels"] for f in out))) >= sum(map(len, (f["labels"] for f in features)))
    padded = BPEDropoutCollator(tokenizer, 0.1, DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100))(features)
    assert padded["input_ids"].shape == padded["attention_mask"].shape
    with pytest.raises(ValueError, match="BPE-dropout"):
        BPEDropoutCollator(tokenizer, 1.0, collator)


def test_extra_special_tokens_follow_unk_are_never_split_and_survive_saving(tmp_path):
    texts = [side for pair in SENTENCES for side in pair] * 3
    tokenizer = train_tokenizer(texts, vocab_size=120, min_frequency=1, extra_special_tokens=["<extra>"])
    assert len(tokenizer) <= 120 and tokenizer.convert_tokens_to_ids("<extra>") == 4
    english = SENTENCES[0][0]
    tagged, plain = tokenizer(f"<extra> {english}")["input_ids"], tokenizer(english)["input_ids"]
    assert tagged == [4, *plain]  # one id for the tag, then the sentence exactly as without it
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(f"<extra> {english}")["input_ids"] == tagged
    assert loaded.decode(tagged, skip_special_tokens=True) == english
