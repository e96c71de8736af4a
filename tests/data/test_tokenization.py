"""The joint BPE vocabulary (§5.1, `vaswani_mt.data.tokenization`): fairseq's special tokens, one vocabulary for both
sides, exact round trips; a run's tokenizer learned from a stream of its corpus; the corpus tokenized in several
processes, cached beside it."""

from pathlib import Path

import datasets
import pytest
from conftest import SENTENCES
from transformers import AutoTokenizer

from vaswani_mt.data import tokenization
from vaswani_mt.data.batching import length_array
from vaswani_mt.data.corpus import SPLITS, load_corpus
from vaswani_mt.data.tokenization import build_tokenizer, tokenize_corpus, train_tokenizer


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


def test_the_bpe_is_learned_from_a_stream_of_the_corpus_or_a_sample_of_it(tmp_path, monkeypatch):
    pairs = [{"en": f"The house number {i} is small.", "de": f"Das Haus Nummer {i} ist klein."} for i in range(300)]
    corpus = {"train": datasets.Dataset.from_dict({"translation": pairs})}
    seen = {}
    real = tokenization.train_tokenizer

    def spy(texts, **kwargs):
        seen["type"] = type(texts)
        texts = list(texts)
        seen["texts"] = texts
        return real(texts, **kwargs)

    monkeypatch.setattr(tokenization, "train_tokenizer", spy)
    full = build_tokenizer(corpus, ("en", "de"), tmp_path / "full", vocab_size=120)  # what --vocab_size 120 gives
    assert not issubclass(seen["type"], (list, tuple))  # a stream, never a list of every sentence
    # all sources, then all targets, in corpus order: the vocabulary the old list gave, token for token
    assert seen["texts"] == [p["en"] for p in pairs] + [p["de"] for p in pairs]
    assert full.get_vocab() == real(seen["texts"], vocab_size=120).get_vocab()
    build_tokenizer(corpus, ("en", "de"), tmp_path / "sample", vocab_size=120, sample=50)  # --tokenizer_sample 50
    assert len(seen["texts"]) == 100 and set(seen["texts"][:50]) <= {p["en"] for p in pairs}
    assert seen["texts"][50:] == [next(p["de"] for p in pairs if p["en"] == en) for en in seen["texts"][:50]]


def test_tokenization_in_several_processes_is_cached_beside_a_corpus_on_disk_and_reused(tmp_path):
    pairs = [{"en": "The house is" + " very" * (i % 9) + " small.", "de": "Das Haus ist" + " sehr" * (i % 9) + "."}
             for i in range(400)]  # fmt: skip
    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})
    folder = tmp_path / "corpus"
    datasets.DatasetDict(
        {split: datasets.Dataset.from_dict({"translation": pairs}, features=features) for split in SPLITS}
    ).save_to_disk(str(folder))
    tokenizer = train_tokenizer([t for p in pairs for t in p.values()], vocab_size=120, min_frequency=1)
    limits = {"max_source_length": 12, "max_target_length": 12}  # --max_source_length 12 --max_target_length 12
    plain = tokenize_corpus(load_corpus(str(folder)), tokenizer, "en", "de", **limits)["train"]
    first = tokenize_corpus(load_corpus(str(folder)), tokenizer, "en", "de", **limits, num_proc=2)["train"]
    assert first["input_ids"] == plain["input_ids"] and 0 < len(first) < 400  # the length filter dropped some
    cached = {Path(f["filename"]) for f in first.cache_files if Path(f["filename"]).parent.parent == folder}
    assert cached, "map wrote its result beside the corpus"
    stamps = {path: path.stat().st_mtime_ns for path in cached}
    again = tokenize_corpus(load_corpus(str(folder)), tokenizer, "en", "de", **limits, num_proc=2)["train"]
    assert {Path(f["filename"]) for f in again.cache_files} >= cached  # the same files, read again
    assert {path: path.stat().st_mtime_ns for path in cached} == stamps  # not written a second time
    assert again["labels"] == first["labels"]
    assert list(length_array(again, "source_length")) == list(again["source_length"])  # through the filter's mapping


def test_a_word_training_saw_is_never_called_a_typo_and_the_record_is_saved_with_the_tokenizer(tmp_path):
    """Issue 62, item 7: `record_seen_words` keeps, in the tokenizer's config, the training targets' words that the
    typo warning would question ("Gebaude", one letter from "Gebäude", as a corpus may spell it); the warning then
    passes them, also after the tokenizer is saved and loaded, and still warns on a word training did not see."""
    from transformers import AutoTokenizer

    from vaswani_mt.data.tokenization import record_seen_words, train_tokenizer
    from vaswani_mt.model.pipeline_vaswani import unusual_pieces

    texts = ["er würde das Gebäude sehen", "das Gesetz und zuletzt das Gebäude", "sie würde zuletzt gehen"] * 40
    tokenizer = train_tokenizer([*texts, "H ü r d e G s t z Z l e t a b c"], vocab_size=80)
    assert unusual_pieces(tokenizer, "Gebaude") is not None and unusual_pieces(tokenizer, "Gebude") is not None
    assert record_seen_words(tokenizer, [*texts, "Das Gebaude, sagte sie."]) == ["Gebaude"]
    tokenizer.save_pretrained(tmp_path)
    for loaded in (tokenizer, AutoTokenizer.from_pretrained(tmp_path)):
        assert unusual_pieces(loaded, "Gebaude") is None
        assert unusual_pieces(loaded, "Gebude") is not None  # not seen in training: still a typo
