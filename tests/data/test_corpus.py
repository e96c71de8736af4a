"""Corpora (`vaswani_mt.data.corpus`): the built-in Ding extraction and its cache, every local format giving the same
corpus, Hub datasets, and one error line from the training command for bad data. The readers' message for each bad
file: test_readers.py."""

import json
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from vaswani_mt.data import corpus as data
from vaswani_mt.data.corpus import (
    DataError,
    _cached_extraction,
    extract_ding_pairs,
    extract_ding_phrases,
    load_corpus,
    load_ding,
    split_by_group,
)

ROOT = Path(__file__).resolve().parents[2]

DING_SAMPLE = """# Version :: devel
Haus {n} | Das Haus ist klein. | Das Haus ist groß.; Das Haus ist riesig. :: \
house | The house is small. | The house is big.; The house is huge.
Katze {f} | Die Katze schläft [ugs.] gerne. :: cat | The cat likes to sleep.
kurz {adj} | Ja. :: short | Yes.
Hund {m} | Der Hund ist in der Tat ein sehr sehr sehr großer Hund. :: dog | Dog is big.
Vogel | Das Haus ist klein. :: bird | The small house.
"""


def test_ding_extraction_keeps_whole_sentences_paired_by_position():
    pairs = extract_ding_pairs(DING_SAMPLE.splitlines())  # the backslash joins the first entry's two halves
    assert [(de, en) for _, de, en in pairs] == [
        ("Das Haus ist klein.", "The house is small."),
        ("Das Haus ist groß.", "The house is big."),
        ("Das Haus ist riesig.", "The house is huge."),
        ("Die Katze schläft gerne.", "The cat likes to sleep."),  # [ugs.] annotation removed
    ]  # "Ja." too short, the dog pair's word ratio > 2, the second "Das Haus ist klein." a duplicate
    assert [line for line, _, _ in pairs] == [2, 2, 2, 3]


def test_ding_phrases_are_the_multi_word_sub_entries_that_are_not_sentences():
    sample = DING_SAMPLE + (
        "Gewerkschaft {f} | aus einer Gewerkschaft austreten (als Mitglied) | in die Gewerkschaft eintreten :: "
        "union | to resign from a union | to join the union\n"
        "Trinitrotoluol {n} /TNT/ | rotes Trinitrotoluol :: trinitrotoluene /TNT/ | red trinitrotoluene\n"
        "ganz {adj} | ganz und gar nicht wirklich sehr :: whole | not\n"
    )
    assert extract_ding_phrases(sample.splitlines()) == [
        (7, "aus einer Gewerkschaft austreten", "to resign from a union"),  # (explanation) removed
        (7, "in die Gewerkschaft eintreten", "to join the union"),
        (8, "rotes Trinitrotoluol", "red trinitrotoluene"),
    ]  # single words, sentences, and line 9's word ratio of 6 are out
    words = extract_ding_phrases(sample.splitlines(), min_words=1)
    assert (2, "Haus", "house") in words and (4, "Ja.", "Yes.") in words  # "Ja." is too short to be a sentence
    assert (8, "Trinitrotoluol", "trinitrotoluene") in words  # /TNT/ removed
    sentences = {(de, en) for _, de, en in extract_ding_pairs(sample.splitlines())}
    assert sentences and sentences.isdisjoint((de, en) for _, de, en in words)


def test_split_is_deterministic_and_keeps_groups_together():
    groups = [str(i // 3) for i in range(3000)]
    first, second = split_by_group(groups), split_by_group(groups)
    assert first == second
    assert sorted(i for indices in first.values() for i in indices) == list(range(3000))
    for name, indices in first.items():
        for index in indices:
            assert all(j in indices for j in range(3 * (index // 3), 3 * (index // 3) + 3)), name
    assert 0.01 < len(first["validation"]) / 3000 < 0.03 and 0.02 < len(first["test"]) / 3000 < 0.05


def test_builtin_corpus_from_debian_package():
    corpus = load_ding("en", "de")
    sizes = {k: len(v) for k, v in corpus.items()}
    assert 18_000 < sizes["train"] < 18_700 and 250 < sizes["validation"] < 450 and 450 < sizes["test"] < 750
    row = corpus["test"][0]["translation"]
    assert set(row) == {"en", "de"} and row["en"][-1] in ".!?"
    reverse = load_corpus("ding", source_lang="de", target_lang="en")
    assert reverse["test"][0]["translation"] == row  # same split, either direction
    with pytest.raises(DataError, match="German-English"):
        load_corpus("ding", source_lang="en", target_lang="fr")


def test_builtin_corpus_with_phrases_adds_training_phrases_of_training_entries_only():
    plain, extended = load_ding("en", "de"), load_corpus("ding+phrases")
    for split in ("validation", "test"):
        assert extended[split]["translation"] == plain[split]["translation"]
    train = extended["train"]["translation"]
    assert train[: len(plain["train"])] == plain["train"]["translation"]
    phrases = train[len(plain["train"]) :]
    assert 80_000 < len(phrases) < 95_000
    assert {"en": "to resign from a union", "de": "aus einer Gewerkschaft austreten"} in phrases
    # no phrase of a held-out dictionary entry: the split is by entry, as for the sentences
    rows = _cached_extraction("phrases", extract_ding_phrases)
    buckets = split_by_group([str(row["entry"]) for row in rows])
    assert len(phrases) == len(buckets["train"])
    held_out = {(rows[i]["en"], rows[i]["de"]) for i in buckets["validation"] + buckets["test"]}
    assert len(held_out) > 1000 and held_out.isdisjoint((p["en"], p["de"]) for p in phrases)


def test_upsample_primary_repeats_the_training_sentences_against_the_phrases(tmp_path):
    once, twice = load_corpus("ding+phrases"), load_corpus("ding+phrases", upsample_primary=2)
    sentences = len(load_ding("en", "de")["train"])
    train, train2 = once["train"]["translation"], twice["train"]["translation"]
    assert len(train2) == len(train) + sentences
    assert train2[:sentences] == train2[sentences : 2 * sentences] == train[:sentences]
    assert train2[2 * sentences :] == train[sentences:]  # each phrase once
    assert twice["test"]["translation"] == once["test"]["translation"]
    with pytest.raises(DataError, match="upsample_primary"):
        load_corpus("ding", upsample_primary=2)  # no extra data to weigh the sentences against
    with pytest.raises(DataError, match="upsample_primary"):
        load_corpus(str(_jsonl(tmp_path / "pairs.jsonl", [{"en": "A b.", "de": "A b."}])), upsample_primary=2)


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    return path


PAIRS = [(f"Sentence number {i}.", f"Satz Nummer {i}.") for i in range(200)]


def test_jsonl_tsv_and_plain_text_give_the_same_corpus(tmp_path):
    jsonl = _jsonl(tmp_path / "c.jsonl", [{"translation": {"en": e, "de": d}} for e, d in PAIRS])
    tsv = tmp_path / "c.tsv"
    tsv.write_text("de\ten\n" + "".join(f"{d}\t{e}\n" for e, d in PAIRS), encoding="utf-8")
    (tmp_path / "c.en").write_text("".join(e + "\n" for e, _ in PAIRS), encoding="utf-8")
    (tmp_path / "c.de").write_text("".join(d + "\n" for _, d in PAIRS), encoding="utf-8")
    corpora = [load_corpus(str(p)) for p in (jsonl, tsv, tmp_path / "c")]
    for corpus in corpora:
        assert sum(len(corpus[s]) for s in ("train", "validation", "test")) == 200
        assert corpus["train"]["translation"] == corpora[0]["train"]["translation"]
        assert corpus["test"]["translation"] == corpora[0]["test"]["translation"]


def test_hub_dataset_code_path_with_a_locally_built_dataset(tmp_path):
    folder = tmp_path / "my_wmt"
    folder.mkdir()
    for split, chunk in (("train", PAIRS[:150]), ("validation", PAIRS[150:170]), ("test", PAIRS[170:])):
        _jsonl(folder / f"{split}.jsonl", [{"translation": {"de": d, "en": e}} for e, d in chunk])
    corpus = load_corpus(str(folder))  # datasets.load_dataset, as for "wmt14" "de-en"
    assert {k: len(v) for k, v in corpus.items()} == {"train": 150, "validation": 20, "test": 30}
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": corpus["train"], "test": corpus["test"]}).save_to_disk(saved)
    corpus = load_corpus(str(saved))  # no validation split: held out from train
    assert len(corpus["validation"]) > 0 and len(corpus["train"]) + len(corpus["validation"]) == 150
    with pytest.raises(DataError, match="'fr' missing"):
        load_corpus(str(folder), source_lang="fr")


# ---------------------------------------------------------------------------------------------------------------
# The on-disk caches


def test_ding_extraction_cache_is_redone_when_cut_short_unvouched_or_stale(tmp_path, monkeypatch):
    dictionary = tmp_path / "de-en"
    dictionary.write_text(DING_SAMPLE, encoding="utf-8")
    monkeypatch.setenv("VASWANI_MT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(data, "_fetch_ding_dictionary", lambda directory: dictionary)
    calls = []

    def counting(lines):
        calls.append(1)
        return extract_ding_pairs(lines)

    expected = [{"entry": line, "de": de, "en": en} for line, de, en in extract_ding_pairs(DING_SAMPLE.splitlines())]
    rows, done = tmp_path / "cache" / "ding" / "t.jsonl", tmp_path / "cache" / "ding" / "t.done.json"
    assert _cached_extraction("t", counting) == expected and len(calls) == 1
    assert _cached_extraction("t", counting) == expected and len(calls) == 1  # served from the cache
    assert sorted(p.name for p in rows.parent.iterdir()) == ["t.done.json", "t.jsonl"]  # no temporary file left
    whole = rows.read_bytes()
    rows.write_bytes(whole[: len(whole) // 2])  # cut short (a copy, a full disk): its SHA-256 no longer matches
    assert _cached_extraction("t", counting) == expected and len(calls) == 2
    done.unlink()  # killed between the rows and their record: the rows are not taken as complete
    assert _cached_extraction("t", counting) == expected and len(calls) == 3
    monkeypatch.setattr(data, "_EXTRACTION_VERSION", data._EXTRACTION_VERSION + 1)  # the extraction changed
    assert _cached_extraction("t", counting) == expected and len(calls) == 4
    with open(dictionary, "a", encoding="utf-8") as f:  # a newer dictionary: stale rows
        f.write("Maus {f} | Die Maus ist sehr klein. :: mouse | The mouse is very small.\n")
    assert _cached_extraction("t", counting)[-1]["en"] == "The mouse is very small." and len(calls) == 5
    assert _cached_extraction("t", counting)[-1]["en"] == "The mouse is very small." and len(calls) == 5


# ---------------------------------------------------------------------------------------------------------------
# The command line


@pytest.mark.parametrize(
    ("files", "corpus", "message", "process"),
    [
        ({"bad.jsonl": '{"translation": {"en": "Hi.", "de": "Hallo."}}\n{"translation": {"en": "Yes."}}\n'},
         "bad.jsonl", r"bad.jsonl:2: language 'de' missing", True),
        ({"c.en": "One.\nTwo.\n", "c.de": "Eins.\n"}, "c", r"c.en has 2 lines but .*c.de has 1", False),
    ],
)  # fmt: skip
def test_train_script_prints_one_error_line_for_bad_data(tmp_path, files, corpus, message, process):
    """The first as a process of its own (one line on stderr, no traceback), the second through the command's main
    in this process (the line it exits with)."""
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    argv = ["--dataset", str(tmp_path / corpus), "--output_dir", str(tmp_path / "out"), "--preset", "tiny",
            "--report_to", "none"]  # fmt: skip
    if not process:
        from vaswani_mt.cli.train import main as train_main

        with pytest.raises(SystemExit) as stop:
            train_main([*argv, "--retain_freed_memory", "false"])  # malloc's settings are this process's for good
        assert re.match(f"error: {tmp_path}/{message}", str(stop.value.code)) and "\n" not in stop.value.code
        return
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), *argv], capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and re.match(f"error: {tmp_path}/{message}", errors[0]), result.stderr[-3000:]
