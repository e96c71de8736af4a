"""Word-alignment labels for a supervised alignment head (`vaswani_mt.data.alignment_labels`): word links mapped to
token positions by the tokenizer's offsets, grow-diag-final-and, and eflomal's links cached (skipped where eflomal,
an optional package, is not installed)."""

import importlib.util

import pytest
from datasets import Dataset

from vaswani_mt.data import alignment_labels
from vaswani_mt.data.alignment_labels import grow_diag_final_and, token_links
from vaswani_mt.data.words import token_words
from vaswani_mt.training.alignment_supervision import add_alignment_labels

needs_eflomal = pytest.mark.skipif(importlib.util.find_spec("eflomal") is None,
                                   reason="eflomal is an optional package (pip install eflomal)")  # fmt: skip


def test_each_target_token_gets_every_token_of_its_linked_source_words(tokenizer):
    source, target = "the girl ate", "das Mädchen aß"
    source_ids, target_ids = tokenizer(source)["input_ids"], tokenizer(text_target=target)["input_ids"]
    source_words, source_index = token_words(tokenizer, source, source_ids)
    target_words, target_index = token_words(tokenizer, target, target_ids)
    assert source_words == ["the", "girl", "ate"] and target_words == ["das", "Mädchen", "aß"]
    assert source_index[-1] == -1 == target_index[-1]  # </s>: no word
    pairs = token_links(source_index, target_index, [(1, 1), (2, 2), (0, 1)])
    for t, word in enumerate(target_index):
        linked = {0, 1} if word == 1 else {2} if word == 2 else set()  # "das" (word 0) has no link
        assert {s for tt, s in pairs if tt == t} == {s for s, w in enumerate(source_index) if w in linked}
    assert not any(t == len(target_ids) - 1 for t, _ in pairs)


def test_grow_diag_final_and_keeps_the_intersection_and_grows_along_its_neighbours():
    forward, backward = {(0, 0), (1, 1), (2, 1)}, {(0, 0), (1, 1), (3, 3)}
    links = grow_diag_final_and(forward, backward, 4, 4)
    assert {(0, 0), (1, 1)} <= links and (2, 1) in links  # a neighbour of (1, 1), source word 2 unaligned
    assert (3, 3) in links  # final-and: both words unaligned


@needs_eflomal
def test_labels_are_cached_and_read_back_without_running_eflomal_again(tmp_path, tokenizer, monkeypatch):
    pairs = [("the girl ate", "das Mädchen aß"), ("the house", "das Haus")] * 5
    encoded = tokenizer([en for en, _ in pairs], text_target=[de for _, de in pairs])
    dataset = Dataset.from_dict(dict(encoded))
    first = add_alignment_labels(dataset, tokenizer, cache=tmp_path)
    assert [p.name.startswith("alignment_links-") for p in tmp_path.iterdir()] == [True]  # no temporary file left
    assert all(len(row) % 2 == 0 for row in first["alignment"]) and any(first["alignment"])

    def no_eflomal(*_):
        raise AssertionError("eflomal ran again")

    monkeypatch.setattr(alignment_labels, "eflomal_links", no_eflomal)
    assert list(add_alignment_labels(dataset, tokenizer, cache=tmp_path)["alignment"]) == list(first["alignment"])


def test_a_missing_eflomal_is_one_line_that_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "eflomal", None)
    with pytest.raises(ImportError, match=r"pip install 'vaswani-mt\[align\]'") as error:
        alignment_labels.require_eflomal()
    assert "\n" not in str(error.value)
