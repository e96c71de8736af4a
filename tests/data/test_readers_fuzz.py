"""Every corpus reader fuzzed with hypothesis: each bad input raises one `DataError` whose one-line message names the
file and line (or the split and row) and the problem; every good input, whatever its text, loads unchanged.

Each example builds a corpus from generated sentences, then injects one fault at a generated place. The policy the
readers follow (`vaswani_mt.data.readers._read_lines`, `_side_problem`, `check_translations`):

- Local files (jsonl, tsv, `P.src` / `P.tgt`): UTF-8; a byte-order mark at the start is dropped; a line ends at
  "\\n" or "\\r\\n", the last one optionally; other Unicode line breaks (U+2028, NEL, form feed) are text inside a
  line; each side is stripped of Python's whitespace. Errors, naming `file:line`: bytes that are not UTF-8, a NUL,
  a "\\r" that ends no line, broken JSON, a row that is not `{"translation": {...}}`, a missing language, a side that
  is not a string, blank, holds a NUL or a lone surrogate (JSON escapes), a TSV line with the wrong number of
  fields, a header that does not name a language once; naming both files: different line counts; an empty corpus.
- Hub and `save_to_disk` datasets: text kept as it is (newlines and tabs included). Errors, naming the split and
  row: a null translation, a null (missing) side, a blank side, a NUL, bytes that are not UTF-8; naming the split:
  no `translation` column, a column or side that is not text, a missing language.
- A local dataset folder of JSON-lines files (`datasets.load_dataset`, as for a Hub id): what datasets cannot load,
  and rows the checks above refuse, are read again with the jsonl reader, whose message names the file and line.

`VASWANI_MT_FUZZ_REPORT=FILE pytest tests/data/test_readers_fuzz.py` writes how many inputs of each kind were tried.
"""

import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import datasets
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vaswani_mt.data.corpus import SPLITS, DataError, load_corpus, split_by_group

SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=SLOW_IS_FINE)
TRIED: Counter = Counter()  # (reader, kind) -> inputs tried; written out by the module fixture below

# Python's whitespace: what str.strip() removes, so a side made of it is empty.
WHITESPACE = [chr(c) for c in range(0x3001) if chr(c).isspace()]
LINE_SAFE = [c for c in WHITESPACE if c not in "\n\r\t"]
# A sentence of a line-based file: any character but a line end, a tab, a NUL or a surrogate; not blank.
LINE_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\n\r\t\0"), min_size=1, max_size=20)
# Inside JSON or Arrow, newlines and tabs are text too.
ANY_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), min_size=1, max_size=20)
BLANK = st.text(st.sampled_from(LINE_SAFE), max_size=4)
NOT_UTF8 = st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80", b"\xf8\x88\x80"])
NON_STRING = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.lists(st.integers(), max_size=3),
                       st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))  # fmt: skip
MEGABYTE_LINE = "long " * 200_000  # 1 MB of legal text in one line


@pytest.fixture(scope="module", autouse=True)
def no_progress_bars():
    """datasets draws no progress bar for the hundreds of tiny corpora here; turned back on after this module."""
    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    yield
    if enabled:
        datasets.enable_progress_bars()


@pytest.fixture(scope="module", autouse=True)
def report_inputs_tried():
    yield
    if os.environ.get("VASWANI_MT_FUZZ_REPORT"):
        rows = [{"reader": reader, "kind": kind, "inputs": n} for (reader, kind), n in sorted(TRIED.items())]
        Path(os.environ["VASWANI_MT_FUZZ_REPORT"]).write_text(json.dumps(rows, indent=1) + "\n")


def sentences(text=LINE_TEXT, min_size: int = 1):
    """Sentence pairs, neither side blank."""
    pair = st.tuples(text, text).filter(lambda p: p[0].strip() and p[1].strip())
    return st.lists(pair, min_size=min_size, max_size=6)


def layout():
    """How the lines are written: a byte-order mark or not, LF or CRLF, a final line end or not."""
    return st.fixed_dictionaries({"bom": st.booleans(), "eol": st.sampled_from(["\n", "\r\n"]), "final": st.booleans()})


def write_lines(path: Path, lines: list[bytes], how: dict) -> Path:
    eol = how["eol"].encode()
    data = eol.join(lines) + (eol if how["final"] and lines else b"")
    path.write_bytes((b"\xef\xbb\xbf" if how["bom"] else b"") + data)
    return path


def insert(line: bytes, at: int, what: bytes) -> bytes:
    """`what` inserted into a UTF-8 line before its character `at` (a character boundary)."""
    text = line.decode("utf-8")
    at = at % (len(text) + 1)
    return text[:at].encode() + what + text[at:].encode()


BYTE_FAULTS = {"not_utf8": "not UTF-8", "nul_byte": "NUL", "lone_cr": "carriage return"}  # fault -> the message's word


def insert_byte_fault(line: bytes, fault: str, data) -> tuple[bytes, tuple[str, ...]]:
    """`line` with the bytes of `fault` (one of BYTE_FAULTS) inserted at a drawn character, and the words its message
    must say."""
    what = {"not_utf8": data.draw(NOT_UTF8), "nul_byte": b"\0", "lone_cr": b"\r"}[fault]
    line = insert(line, data.draw(st.integers(0, 10**6)), what)
    if fault == "lone_cr" and line.endswith(b"\r"):
        line += b" "  # not at the end: "\r" then the line end would be a CRLF, which is legal
    return line, (BYTE_FAULTS[fault],)


def check_error(load, expected_start: str, *words: str) -> str:
    """`load()` raises one DataError, in one line, starting with `expected_start`, saying each of `words`."""
    with pytest.raises(DataError) as caught:
        load()
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message, message
    assert len(message) < 300 + len(expected_start), message  # short, even for a 1 MB line
    assert message.startswith(expected_start), (message, expected_start)
    for word in words:
        assert word in message, (message, word)
    return message


def assert_corpus_is(corpus, pairs: list[tuple[str, str]]) -> None:
    """load_corpus split `pairs` (source, target) by row, as for every local file, and kept each text as given."""
    indices = split_by_group([str(i) for i in range(len(pairs))])
    for split, rows in indices.items():
        assert corpus[split]["translation"] == [{"en": pairs[i][0], "de": pairs[i][1]} for i in rows]


# ---------------------------------------------------------------------------------------------------------------
# Good inputs load unchanged


def maybe_megabyte(pairs, draw_long: bool):
    return [(MEGABYTE_LINE + pairs[0][0], pairs[0][1]), *pairs[1:]] if draw_long else pairs


@settings(FUZZ, max_examples=25)
@given(pairs=sentences(ANY_TEXT), how=layout(), ascii_only=st.booleans(), long=st.sampled_from([False] * 5 + [True]))
def test_good_jsonl_loads_every_pair_unchanged(pairs, how, ascii_only, long):
    TRIED["jsonl", "good"] += 1
    pairs = maybe_megabyte(pairs, long)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [json.dumps({"translation": {"en": e, "de": d}}, ensure_ascii=ascii_only).encode() for e, d in pairs]
        path = write_lines(Path(tmp, "c.jsonl"), rows, how)
        assert_corpus_is(load_corpus(str(path)), [(e.strip(), d.strip()) for e, d in pairs])


@settings(FUZZ, max_examples=25)
@given(pairs=sentences(), how=layout(), german_first=st.booleans(), long=st.sampled_from([False] * 5 + [True]))
def test_good_tsv_loads_every_pair_unchanged(pairs, how, german_first, long):
    TRIED["tsv", "good"] += 1
    pairs = maybe_megabyte(pairs, long)
    with tempfile.TemporaryDirectory() as tmp:
        order = (1, 0) if german_first else (0, 1)
        header = "\t".join(("en", "de")[i] for i in order)
        lines = [header.encode()] + ["\t".join(p[i] for i in order).encode() for p in pairs]
        path = write_lines(Path(tmp, "c.tsv"), lines, how)
        assert_corpus_is(load_corpus(str(path)), [(e.strip(), d.strip()) for e, d in pairs])


@settings(FUZZ, max_examples=25)
@given(pairs=sentences(), how=layout(), how_target=layout(), long=st.sampled_from([False] * 5 + [True]))
def test_good_plain_text_pair_loads_every_pair_unchanged(pairs, how, how_target, long):
    TRIED["plain text", "good"] += 1
    pairs = maybe_megabyte(pairs, long)
    with tempfile.TemporaryDirectory() as tmp:
        write_lines(Path(tmp, "c.en"), [e.encode() for e, _ in pairs], how)
        write_lines(Path(tmp, "c.de"), [d.encode() for _, d in pairs], how_target)  # each file its own layout
        assert_corpus_is(load_corpus(str(Path(tmp, "c"))), [(e.strip(), d.strip()) for e, d in pairs])


@settings(FUZZ, max_examples=20)
@given(train=sentences(ANY_TEXT), held_out=st.lists(sentences(ANY_TEXT), min_size=2, max_size=2))
def test_good_saved_dataset_loads_every_row_unchanged(train, held_out):
    TRIED["save_to_disk", "good"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        splits = {"train": train, "validation": held_out[0], "test": held_out[1]}
        save(Path(tmp, "saved"), {s: [{"en": e, "de": d} for e, d in p] for s, p in splits.items()})
        corpus = load_corpus(str(Path(tmp, "saved")))
        for split, pairs in splits.items():  # Hub text is kept as it is: not stripped
            assert corpus[split]["translation"] == [{"en": e, "de": d} for e, d in pairs]


# ---------------------------------------------------------------------------------------------------------------
# Bad local files


JSONL_FAULTS = ["broken_json", "missing_language", "non_string", "not_a_row", "blank_side", "nul_escape",
                "lone_surrogate", "not_utf8", "nul_byte", "lone_cr", "too_deep"]  # fmt: skip


def jsonl_with_fault(
    fault: str, data, pairs: list[tuple[str, str]], non_string=NON_STRING
) -> tuple[list[bytes], int, tuple[str, ...]]:
    """JSON lines of `pairs` with `fault` injected in one generated line: the lines, that line's index and the words
    its message must say."""
    line = data.draw(st.integers(0, len(pairs) - 1))
    side = data.draw(st.sampled_from(["en", "de"]))
    rows = [{"translation": {"en": e, "de": d}} for e, d in pairs]
    row, words = rows[line]["translation"], ()
    if fault == "missing_language":
        del row[side]
        words = (f"language {side!r} missing",)
    elif fault == "non_string":
        row[side] = data.draw(non_string)
        words = (f"the {side!r} side is not a string",)
    elif fault == "not_a_row":
        rows[line] = data.draw(st.one_of(NON_STRING, st.just(row), st.just({"translation": [row[side]]})))
        words = ("expected",)
    elif fault == "blank_side":
        row[side] = data.draw(st.text(st.sampled_from(WHITESPACE), max_size=4))
        words = (f"the {side!r} side is empty",)
    elif fault in ("nul_escape", "lone_surrogate"):
        what = "\0" if fault == "nul_escape" else chr(data.draw(st.integers(0xD800, 0xDFFF)))
        at = data.draw(st.integers(0, len(row[side])))
        row[side] = row[side][:at] + what + row[side][at:]
        words = (f"the {side!r} side contains", "NUL" if fault == "nul_escape" else "lone surrogate")
    # JSON escapes (\u0000, \ud800) whatever ensure_ascii says; the others as the writer chooses
    ascii_only = fault in ("nul_escape", "lone_surrogate") or data.draw(st.booleans())
    lines = [json.dumps(r, ensure_ascii=ascii_only).encode() for r in rows]
    if fault == "broken_json":
        lines[line] = lines[line][: data.draw(st.integers(1, len(lines[line]) - 1))].decode("utf-8", "ignore").encode()
        words = ("not valid JSON",)
    elif fault == "too_deep":
        lines[line] = b"[" * 100_000 + b"]" * 100_000
        words = ("nested too deeply",)
    elif fault in BYTE_FAULTS:
        lines[line], words = insert_byte_fault(lines[line], fault, data)
    return lines, line, words


@pytest.mark.parametrize("fault", JSONL_FAULTS)
@settings(FUZZ, max_examples=8)
@given(data=st.data(), pairs=sentences(ANY_TEXT), how=layout(), long=st.sampled_from([False] * 3 + [True]))
def test_bad_jsonl_names_file_line_and_problem(fault, data, pairs, how, long):
    TRIED["jsonl", fault] += 1
    lines, line, words = jsonl_with_fault(fault, data, maybe_megabyte(pairs, long))
    with tempfile.TemporaryDirectory() as tmp:
        path = write_lines(Path(tmp, "c.jsonl"), lines, how)
        check_error(lambda: load_corpus(str(path)), f"{path}:{line + 1}: ", *words)


TSV_FAULTS = ["no_tab", "extra_tab", "blank_side", "not_utf8", "nul_byte", "lone_cr", "header_without_language",
              "header_naming_twice"]  # fmt: skip


@pytest.mark.parametrize("fault", TSV_FAULTS)
@settings(FUZZ, max_examples=8)
@given(data=st.data(), pairs=sentences(), how=layout(), long=st.sampled_from([False] * 3 + [True]))
def test_bad_tsv_names_file_line_and_problem(fault, data, pairs, how, long):
    TRIED["tsv", fault] += 1
    pairs = maybe_megabyte(pairs, long)
    line = data.draw(st.integers(0, len(pairs) - 1))
    column = data.draw(st.integers(0, 1))
    fields = [["en", "de"]] + [list(p) for p in pairs]
    words, number = (), line + 2  # the header is line 1
    if fault == "blank_side":
        fields[line + 1][column] = data.draw(BLANK)
        words = (f"the {('en', 'de')[column]!r} side is empty",)
    elif fault.startswith("header"):
        fields[0][column] = data.draw(st.sampled_from(["fr", "EN", "", " en"])) if fault == "header_without_language" \
            else fields[0][1 - column]  # fmt: skip
        words, number = ("the header",), 1
    lines = ["\t".join(f).encode() for f in fields]
    if fault == "no_tab":
        lines[line + 1] = " ".join(fields[line + 1]).encode()
        words = ("1 tab-separated fields, the header has 2",)
    elif fault == "extra_tab":
        lines[line + 1] = insert(lines[line + 1], data.draw(st.integers(0, 10**6)), b"\t")
        words = ("3 tab-separated fields, the header has 2",)
    elif fault in BYTE_FAULTS:
        lines[line + 1], words = insert_byte_fault(lines[line + 1], fault, data)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_lines(Path(tmp, "c.tsv"), lines, how)
        check_error(lambda: load_corpus(str(path)), f"{path}:{number}: ", *words)


PLAIN_TEXT_FAULTS = ["line_counts", "blank_side", "not_utf8", "nul_byte", "lone_cr", "one_file_missing"]


@pytest.mark.parametrize("fault", PLAIN_TEXT_FAULTS)
@settings(FUZZ, max_examples=8)
@given(data=st.data(), pairs=sentences(), how=layout(), long=st.sampled_from([False] * 3 + [True]))
def test_bad_plain_text_names_file_line_and_problem(fault, data, pairs, how, long):
    TRIED["plain text", fault] += 1
    pairs = maybe_megabyte(pairs, long)
    line = data.draw(st.integers(0, len(pairs) - 1))
    side = data.draw(st.integers(0, 1))
    files = [[p[0].encode() for p in pairs], [p[1].encode() for p in pairs]]
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp, "c.en"), Path(tmp, "c.de")]
        start, words = f"{paths[side]}:{line + 1}: ", ()
        if fault == "line_counts":
            extra = data.draw(st.booleans())
            files[side] = files[side] + [b"One more."] if extra else files[side][:line] + files[side][line + 1 :]
            counts = [len(f) for f in files]
            start, words = (
                f"{paths[0]} has {counts[0]} lines but {paths[1]} has {counts[1]}",
                (f"line {min(counts) + 1} has no partner",),
            )
        elif fault == "blank_side":
            # an empty last line with no line end after it is no line at all: then the files differ in length
            last = line == len(pairs) - 1 and not how["final"]
            files[side][line] = data.draw(st.text(st.sampled_from(LINE_SAFE), min_size=last, max_size=4)).encode()
            words = (f"the {('source', 'target')[side]!r} side is empty",)
        elif fault in BYTE_FAULTS:
            files[side][line], words = insert_byte_fault(files[side][line], fault, data)
        elif fault == "one_file_missing":
            start, words = f"{paths[side]}: missing", ()
        for index, (path, lines) in enumerate(zip(paths, files, strict=True)):
            if not (fault == "one_file_missing" and index == side):
                write_lines(path, lines, how)
        check_error(lambda: load_corpus(str(Path(tmp, "c"))), start, *words)


@pytest.mark.parametrize("reader", ["jsonl", "tsv", "plain text"])
@settings(FUZZ, max_examples=6)
@given(how=layout(), blank_lines=st.integers(0, 3))
def test_empty_files_are_refused_by_name(reader, how, blank_lines):
    TRIED[reader, "empty_file"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        if reader == "jsonl":  # blank lines are skipped: a file of them holds no pair
            path = write_lines(Path(tmp, "c.jsonl"), [b""] * blank_lines, how)
            check_error(lambda: load_corpus(str(path)), f"{path}: no sentence pairs")
        elif reader == "tsv":
            path = write_lines(Path(tmp, "c.tsv"), [], how)
            check_error(lambda: load_corpus(str(path)), f"{path}:1: empty file")
        else:
            for lang in ("en", "de"):
                write_lines(Path(tmp, f"c.{lang}"), [], how)
            check_error(lambda: load_corpus(str(Path(tmp, "c"))), f"{Path(tmp, 'c')}: no sentence pairs")


# ---------------------------------------------------------------------------------------------------------------
# Bad Hub and save_to_disk datasets


def save(folder: Path, splits: dict[str, list]) -> Path:
    datasets.DatasetDict({s: datasets.Dataset.from_dict({"translation": rows}) for s, rows in splits.items()}) \
        .save_to_disk(folder)  # fmt: skip
    return folder


def not_utf8_split(rows: list[dict], row: int, lang: str, junk: bytes) -> datasets.Dataset:
    """`rows` as a dataset whose `lang` text in `row` is `junk` bytes: Arrow checks UTF-8 only when asked to."""
    texts = [r[lang].encode() if i != row else junk for i, r in enumerate(rows)]
    offsets = pa.array([sum(len(t) for t in texts[:i]) for i in range(len(texts) + 1)], pa.int32())
    side = pa.StringArray.from_buffers(len(texts), offsets.buffers()[1], pa.py_buffer(b"".join(texts)))
    other = "de" if lang == "en" else "en"
    column = pa.StructArray.from_arrays([side, pa.array([r[other] for r in rows])], names=[lang, other])
    return datasets.Dataset(pa.table({"translation": column}))


HUB_ROW_FAULTS = ["null_row", "null_side", "blank_side", "nul", "not_utf8"]
HUB_SPLIT_FAULTS = ["non_text_side", "not_a_struct", "no_translation_column", "missing_language"]


@pytest.mark.parametrize("fault", HUB_ROW_FAULTS + HUB_SPLIT_FAULTS)
@settings(FUZZ, max_examples=6)
@given(data=st.data(), train=sentences(ANY_TEXT, 2), held_out=st.lists(sentences(ANY_TEXT, 2), max_size=2))
def test_bad_saved_dataset_names_split_row_and_problem(fault, data, train, held_out):
    TRIED["save_to_disk", fault] += 1
    splits = {"train": train, **dict(zip(("validation", "test"), held_out, strict=False))}
    splits = {s: [{"en": e, "de": d} for e, d in pairs] for s, pairs in splits.items()}
    split = data.draw(st.sampled_from(sorted(splits)))
    row = data.draw(st.integers(0, len(splits[split]) - 1))
    lang = data.draw(st.sampled_from(["en", "de"]))
    rows = splits[split]
    start, words = f"split {split!r}, row {row}: ", ()
    if fault == "null_row":
        rows[row], words = None, ("the translation is None",)
    elif fault == "null_side":
        del rows[row][lang]
        words = (f"language {lang!r} missing",)
    elif fault == "blank_side":
        rows[row][lang], words = data.draw(st.text(st.sampled_from(WHITESPACE), max_size=4)), ("side is empty",)
    elif fault == "nul":
        rows[row][lang] += "\0"
        words = ("NUL",)
    elif fault == "not_utf8":
        words = ("not UTF-8",)
    elif fault == "non_text_side":
        splits[split] = [{**r, lang: data.draw(st.integers(-(2**63), 2**63 - 1))} for r in rows]
        start, words = f"split {split!r}: the {lang!r} side holds int64", ()
    elif fault == "not_a_struct":
        splits[split] = [r[lang] for r in rows]
        start, words = f"split {split!r}: the 'translation' column holds string", ()
    elif fault == "missing_language":
        splits[split] = [{"en" if lang == "de" else "de": r["en"], "fr": r["de"]} for r in rows]
        start, words = f"split {split!r}: language {lang!r} missing", ()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp, "saved")
        if fault == "no_translation_column":
            datasets.DatasetDict({s: datasets.Dataset.from_dict({"text": [str(r) for r in rows]})
                                  for s, rows in splits.items()}).save_to_disk(folder)  # fmt: skip
            start = f"split {'train'!r}: no 'translation' column"  # train is checked first
        elif fault == "not_utf8":
            bad = not_utf8_split(splits[split], row, lang, data.draw(NOT_UTF8))
            others = {s: datasets.Dataset.from_dict({"translation": r}) for s, r in splits.items() if s != split}
            datasets.DatasetDict({**others, split: bad}).save_to_disk(folder)
        else:
            save(folder, splits)
        check_error(lambda: load_corpus(str(folder)), f"{folder}: {start}", *words)


# ---------------------------------------------------------------------------------------------------------------
# Local dataset folders, read by datasets.load_dataset as a Hub id is


@pytest.fixture(scope="module", autouse=True)
def datasets_cache_of_its_own(tmp_path_factory):
    """datasets keeps a prepared copy of every folder it loads: here in a temporary folder, not ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets"))
        yield


def write_folder(folder: Path, splits: dict[str, list[bytes]], how: dict) -> Path:
    folder.mkdir()
    for split, lines in splits.items():
        write_lines(folder / f"{split}.jsonl", lines, how)
    return folder


def good_lines(pairs: list[tuple[str, str]], ascii_only: bool = True) -> list[bytes]:
    return [json.dumps({"translation": {"en": e, "de": d}}, ensure_ascii=ascii_only).encode() for e, d in pairs]


@settings(FUZZ, max_examples=8)
@given(splits=st.lists(sentences(ANY_TEXT), min_size=3, max_size=3), how=layout(), ascii_only=st.booleans())
def test_good_dataset_folder_loads_every_row_unchanged(splits, how, ascii_only):
    TRIED["dataset folder", "good"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        lines = {split: good_lines(pairs, ascii_only) for split, pairs in zip(SPLITS, splits, strict=True)}
        corpus = load_corpus(str(write_folder(Path(tmp, "my_wmt"), lines, how)))
        for split, pairs in zip(SPLITS, splits, strict=True):  # Hub text is kept as it is: not stripped
            assert corpus[split]["translation"] == [{"en": e, "de": d} for e, d in pairs]


# "\r" between JSON tokens is whitespace to datasets' reader, which keeps Hub text as it is: not a fault there
FOLDER_FAULTS = [fault for fault in JSONL_FAULTS if fault != "lone_cr"] + ["empty_file"]
# datasets gives every split the train split's features: a number, boolean, list or object in another split's text
# column is cast to text ("false", "[]"), as for any Hub dataset; in the train split it is a fault.
FOLDER_NON_STRING = st.one_of(st.none(), st.lists(st.integers(), max_size=3),
                              st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))  # fmt: skip


@pytest.mark.parametrize("fault", FOLDER_FAULTS)
@settings(FUZZ, max_examples=3)  # datasets.load_dataset takes about a second a folder
@given(data=st.data(), bad=st.sampled_from(SPLITS), splits=st.lists(sentences(ANY_TEXT), min_size=3, max_size=3),
       how=layout())  # fmt: skip
def test_bad_dataset_folder_names_file_line_and_problem(fault, data, bad, splits, how):
    TRIED["dataset folder", fault] += 1
    bad = "train" if fault == "non_string" else bad
    lines = {split: good_lines(pairs) for split, pairs in zip(SPLITS, splits, strict=True)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "my_wmt", f"{bad}.jsonl")
        if fault == "empty_file":
            lines[bad], start, words = [], f"{path}: no sentence pairs", ()
        else:
            lines[bad], line, words = jsonl_with_fault(fault, data, splits[SPLITS.index(bad)], FOLDER_NON_STRING)
            start = f"{path}:{line + 1}: "
        folder = write_folder(path.parent, lines, how)
        check_error(lambda: load_corpus(str(folder)), start, *words)
