"""The readers of parallel text (`vaswani_mt.data.readers`), through `load_corpus` as a run reads a file: each bad
local file gets one `DataError` naming the file, the line and the problem; and `datasets`' cache files that are not
whole are removed. Every reader fuzzed with every fault: test_readers_fuzz.py."""

import gc

import datasets
import pytest

from vaswani_mt.data.corpus import load_corpus
from vaswani_mt.data.readers import DataError, remove_damaged_cache_files

# ---------------------------------------------------------------------------------------------------------------
# Bad local files


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.jsonl", '{"translation": {"en": "Hi.", "de": "Hallo."}}\n{"translation": {"en": "x"}}\n',
         r"bad.jsonl:2: language 'de' missing"),
        ("bad.jsonl", '{"translation": {"en": "Hi.", "de": "  "}}\n', r"bad.jsonl:1: the 'de' side is empty"),
        ("bad.jsonl", '{"translation": {"en": "Hi.", "de": "Hallo."}}\n{oops\n', r"bad.jsonl:2: not valid JSON"),
        ("bad.jsonl", '{"en": "Hi.", "de": "Hallo."}\n', r"bad.jsonl:1: expected"),
        ("bad.tsv", "en\tfr\nHi.\tSalut.\n", r"bad.tsv:1: the header .* does not name language 'de'"),
        ("bad.tsv", "en\tde\nHi.\tHallo.\nonly one field\n", r"bad.tsv:3: 1 tab-separated fields, the header has 2"),
        ("bad.tsv", "en\tde\nHi.\t\n", r"bad.tsv:2: the 'de' side is empty"),
    ],
)  # fmt: skip
def test_bad_local_files_name_file_line_and_problem(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        load_corpus(str(path))


def test_undecodable_bytes_are_reported_with_their_line(tmp_path):
    path = tmp_path / "latin1.tsv"
    path.write_bytes("en\tde\nHi.\tHallo.\nStreet.\tStra\xdfe.\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.tsv:3: bytes that are not UTF-8"):
        load_corpus(str(path))


def test_misaligned_and_missing_plain_text_files(tmp_path):
    (tmp_path / "c.en").write_text("One.\nTwo.\nThree.\n")
    (tmp_path / "c.de").write_text("Eins.\nZwei.\n")
    with pytest.raises(DataError, match=r"c.en has 3 lines but .*c.de has 2"):
        load_corpus(str(tmp_path / "c"))
    (tmp_path / "d.en").write_text("One.\n")
    with pytest.raises(DataError, match=r"d.de: missing"):
        load_corpus(str(tmp_path / "d"))
    (tmp_path / "e.en").write_text("One.\n\nThree.\n")
    (tmp_path / "e.de").write_text("Eins.\nZwei.\nDrei.\n")
    with pytest.raises(DataError, match=r"e.en:2: the 'source' side is empty"):
        load_corpus(str(tmp_path / "e"))


def test_unknown_file_format_is_refused(tmp_path):
    path = tmp_path / "corpus.csv"
    path.write_text("en,de\n")
    with pytest.raises(DataError, match="unknown format"):
        load_corpus(str(path))


def test_a_dataset_that_looks_like_a_path_and_is_not_there_is_no_such_file_before_any_hub_call(tmp_path, monkeypatch):
    """`--dataset my.tsv` with no such file: one line at once, from the library and from the command, where the Hub
    would retry for seconds and then say it has no such dataset. A Hub id (one `/`) still goes to the Hub."""
    from vaswani_mt.cli.train import main as train_main

    def no_hub(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    monkeypatch.chdir(tmp_path)
    for name in ("my.tsv", "corpus.jsonl", "/no/such/folder", "./here", "data/train/all", "pairs.csv"):
        with pytest.raises(DataError, match=rf"^{name}: no such file"):
            load_corpus(name)
    with pytest.raises(SystemExit) as stop:
        train_main(["--dataset", "my.tsv", "--output_dir", str(tmp_path / "run"), "--report_to", "none"])
    assert stop.value.code == (
        "error: --dataset my.tsv: no such file (a .tsv starts with a header line naming the languages: en<TAB>de)"
    )
    assert not (tmp_path / "run").exists()
    (tmp_path / "c.en").write_text("One.\n")
    (tmp_path / "c.de").write_text("Eins.\n")
    assert sum(map(len, load_corpus("./c").values())) == 1  # a prefix of P.en, P.de
    with pytest.raises(DataError, match="the Hub was asked"):
        load_corpus("someone/corpus")


# ---------------------------------------------------------------------------------------------------------------
# The cache files of `datasets.map`


def test_a_damaged_map_cache_file_is_removed_and_computed_again(tmp_path):
    datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(500)]}).save_to_disk(tmp_path / "saved")
    dataset = datasets.load_from_disk(tmp_path / "saved")

    def length(batch):
        return {"length": [len(t) for t in batch["text"]]}

    expected = list(dataset.map(length, batched=True)["length"])
    gc.collect()  # nothing maps the cache file any more: cutting a mapped file short would crash this process
    caches = sorted((tmp_path / "saved").glob("cache-*.arrow"))
    assert len(caches) == 1 and remove_damaged_cache_files(dataset) == []  # a whole file stays
    whole = caches[0].read_bytes()
    for cut in (len(whole) // 2, len(whole) - 8):  # mid-batch; only the end-of-stream marker missing
        caches[0].write_bytes(whole[:cut])
        assert remove_damaged_cache_files(dataset) == caches and not caches[0].exists()
        assert list(dataset.map(length, batched=True)["length"]) == expected
        gc.collect()
        assert caches[0].read_bytes() == whole  # computed again, in full
