import pytest
from conftest import SENTENCES
from transformers import AutoTokenizer

from vaswani_mt.data.tokenization import train_tokenizer


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
