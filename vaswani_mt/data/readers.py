"""Reading parallel text and checking it: local files (JSON lines, TSV, `P.<src>`/`P.<tgt>`), the rows of Hub and
`save_to_disk` splits and of local dataset folders, and `datasets`' cache files.

Every problem is one `DataError` whose message names the file and line (or the dataset, split and row) and what is
wrong, in one short line: bytes that are not UTF-8, a NUL character, a stray carriage return, broken JSON, a missing
language, a side that is not a string or is empty after stripping, a missing tab, files of different lengths.
`vaswani_mt.data.corpus` builds the corpora from these readers.
"""

from __future__ import annotations

import codecs
import functools
import json
import logging
import mmap
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.compute as pc

from vaswani_mt.system.messages import error_line

logger = logging.getLogger(__name__)


class DataError(ValueError):
    """Bad input data; the message names the file, the line and the problem."""


def _preview(value, limit: int = 60) -> str:
    """`repr(value)`, cut to `limit` characters: a message stays one short line whatever the value holds."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, checked; what counts as a line is the same for every local format.

    A UTF-8 byte-order mark at the start is dropped. A line ends at "\n" or "\r\n", and the last one may have no
    end. Other Unicode line breaks (U+2028, NEL, form feed) are text inside a line, not line ends: both files of a
    parallel corpus then split alike, and line numbers are those of any editor's `:N`. Bytes that are not UTF-8,
    a NUL character (a binary or UTF-16 file) and a "\r" that ends no line (old Mac line ends, which would make one
    line of the whole file) raise `DataError` naming the line.
    """
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror})") from None
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: bytes that are not UTF-8 ({data[error.start : error.end]!r})") from None
    text = text.replace("\r\n", "\n")  # the same number of "\n" before every position: line numbers hold
    problems = {"\0": "a NUL character (a binary or UTF-16 file?)",
                "\r": "a carriage return (\\r) that ends no line; line ends are \\n or \\r\\n"}  # fmt: skip
    found = [(text.find(character), problem) for character, problem in problems.items() if character in text]
    if found:
        position, problem = min(found)
        line = text.count("\n", 0, position) + 1
        raise DataError(f"{path}:{line}: {problem}")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the end of the last line (or an empty file), not a line of its own
    return lines


def _side_problem(lang: str, text) -> str | None:
    """What makes `text` unusable as the `lang` side of a pair (one line), or None. Shared by every reader."""
    if not isinstance(text, str):
        return f"the {lang!r} side is not a string: {_preview(text)}"
    if not text.strip():
        return f"the {lang!r} side is empty"
    if "\0" in text:
        return f"the {lang!r} side contains a NUL character: {_preview(text)}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a JSON escape such as "\ud800": a lone surrogate, which is no character
        return f"the {lang!r} side contains a lone surrogate, which is not text: {_preview(text)}"
    return None


def _check_side(path: Path, line: int, lang: str, text, strip: bool = True) -> str:
    problem = _side_problem(lang, text)
    if problem is not None:
        raise DataError(f"{path}:{line}: {problem}")
    return text.strip() if strip else text


def read_jsonl(path: Path, source_lang: str, target_lang: str) -> list[tuple[str, str]]:
    """Pairs from JSON lines `{"translation": {source_lang: ..., target_lang: ...}}`; blank lines are skipped."""
    pairs = []
    for line, raw in enumerate(_read_lines(path), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{line}: not valid JSON ({error.msg} at column {error.colno})") from None
        except (ValueError, RecursionError) as error:  # an integer of > 4300 digits; nesting deeper than the stack
            reason = "nested too deeply" if isinstance(error, RecursionError) else str(error).split(";")[0]
            raise DataError(f"{path}:{line}: not usable JSON ({reason})") from None
        translation = row.get("translation") if isinstance(row, dict) else None
        if not isinstance(translation, dict):
            raise DataError(f'{path}:{line}: expected {{"translation": {{...}}}}, got {_preview(raw, 80)}')
        for lang in (source_lang, target_lang):
            if lang not in translation:
                raise DataError(f"{path}:{line}: language {lang!r} missing (has {_preview(sorted(translation))})")
        pairs.append(tuple(_check_side(path, line, lang, translation[lang]) for lang in (source_lang, target_lang)))
    return pairs


def read_tsv(path: Path, source_lang: str, target_lang: str) -> list[tuple[str, str]]:
    """Pairs from tab-separated lines under a header line that names the languages (`en<TAB>de`)."""
    lines = _read_lines(path)
    if not lines:
        raise DataError(f"{path}:1: empty file; expected a header naming the languages")
    header = lines[0].split("\t")
    for lang in (source_lang, target_lang):
        if header.count(lang) != 1:
            problem = "does not name" if lang not in header else "names more than once"
            raise DataError(f"{path}:1: the header {_preview(header)} {problem} language {lang!r}")
    columns = [header.index(source_lang), header.index(target_lang)]
    pairs = []
    for line, raw in enumerate(lines[1:], 2):
        fields = raw.split("\t")
        if len(fields) != len(header):
            raise DataError(f"{path}:{line}: {len(fields)} tab-separated fields, the header has {len(header)}")
        pairs.append(tuple(_check_side(path, line, header[c], fields[c]) for c in columns))
    return pairs


def read_parallel_text(
    source_path: str | Path, target_path: str | Path, strip_source: bool = True
) -> list[tuple[str, str]]:
    """Pairs from `P.<src>`-style line-aligned files, each side checked and stripped; `strip_source=False` keeps
    the source lines as they are (fairseq's constrained `source<TAB>term` lines, whose leading tab means something)."""
    source_path, target_path = Path(source_path), Path(target_path)
    sources, targets = _read_lines(source_path), _read_lines(target_path)
    if len(sources) != len(targets):
        raise DataError(
            f"{source_path} has {len(sources)} lines but {target_path} has {len(targets)}: the files are not aligned "
            f"(line {min(len(sources), len(targets)) + 1} has no partner)"
        )
    return [
        (_check_side(source_path, i, "source", s, strip_source), _check_side(target_path, i, "target", t))
        for i, (s, t) in enumerate(zip(sources, targets, strict=True), 1)
    ]


# A --dataset with one of these endings, or a path's start, names a file of the user's, never a Hub id.
FILE_SUFFIXES = (".jsonl", ".json", ".tsv", ".tab", ".csv", ".parquet", ".txt")


def looks_like_a_path(dataset: str) -> bool:
    """Whether `dataset` names a file of the user's, never a Hub id: `/`, `./`, `~` first, more than the one `/` of
    a Hub id, or a file ending of FILE_SUFFIXES."""
    return (dataset.startswith(("/", "./", "../", "~")) or dataset.count("/") > 1
            or dataset.lower().endswith(FILE_SUFFIXES))  # fmt: skip


def local_paths(dataset: str, languages: Sequence[str] = ()) -> list[Path]:
    """The files or folders `dataset` can name here: itself, and `dataset.<lang>` for each of `languages`."""
    return [Path(dataset).expanduser(), *(Path(f"{dataset}.{lang}").expanduser() for lang in languages)]


def missing_file(dataset: str, languages: Sequence[str] = ()) -> str | None:
    """Why `dataset` cannot be read, where it looks like a path (`looks_like_a_path`) and nothing it can name
    exists (`local_paths`): said before any Hub call, which would retry for seconds and then answer that the Hub
    has no such dataset. None otherwise."""
    if not looks_like_a_path(dataset) or any(path.exists() for path in local_paths(dataset, languages)):
        return None
    header = " (a .tsv starts with a header line naming the languages: en<TAB>de)" if dataset.endswith(".tsv") else ""
    return f"{dataset}: no such file{header}"


def _local_pairs(dataset: str, source_lang: str, target_lang: str) -> list[tuple[str, str]] | None:
    path = Path(dataset)
    if path.is_file() and path.suffix in (".jsonl", ".json"):
        return read_jsonl(path, source_lang, target_lang)
    if path.is_file() and path.suffix in (".tsv", ".tab"):
        return read_tsv(path, source_lang, target_lang)
    source, target = Path(f"{dataset}.{source_lang}"), Path(f"{dataset}.{target_lang}")
    if source.is_file() or target.is_file():
        for p in (source, target):
            if not p.is_file():
                raise DataError(f"{p}: missing; plain-text corpora need both {source} and {target}")
        return read_parallel_text(source, target)
    if path.is_file():
        raise DataError(
            f"{path}: unknown format; use .jsonl, .tsv, or two files PREFIX.{source_lang} PREFIX.{target_lang}"
        )
    return None


def _json_lines_files(folder: Path) -> list[Path]:
    """The JSON-lines files of a local dataset folder: every `.jsonl`, and each `.json` whose first line is a JSON
    value of its own (not the start of an array or an object over several lines); none in a hidden folder."""
    files = []
    for path in sorted(folder.rglob("*.json*")):
        if path.suffix not in (".jsonl", ".json") or not path.is_file() or "/." in path.relative_to(folder).as_posix():
            continue
        if path.suffix == ".json":
            with open(path, "rb") as f:
                first = f.readline(2**20).removeprefix(codecs.BOM_UTF8)
            try:
                json.loads(first)
            except ValueError:
                continue
        files.append(path)
    return files


def _check_json_lines_files(folder: Path, source_lang: str, target_lang: str) -> None:
    """Reads the JSON-lines files of a local dataset folder that `datasets` could not load or whose rows are bad with
    `read_jsonl`, and raises its `DataError`, which names the file and the line, for the first bad one (an empty file
    too); returns if it finds none. Only when loading failed: a good folder is read by `datasets` alone."""
    for path in _json_lines_files(folder):
        if not read_jsonl(path, source_lang, target_lang):
            raise DataError(f"{path}: no sentence pairs (empty file)")


# A line of a JSON-lines file that is not blank and does not start an object.
_NOT_AN_OBJECT = re.compile(rb"(?m)^[ \t\r]*[^{\s]")


def _check_rows_are_objects(folder: Path, source_lang: str, target_lang: str) -> None:
    """`_check_json_lines_files` for a folder with a row that is not a JSON object, before `datasets` reads it.

    pyarrow's JSON reader (26.0), which `datasets` uses, crashes the process (a segmentation fault) on a block of a
    file that starts with the row `null`; a row that is not an object is an error anyway. One regular-expression pass
    over each memory-mapped file: a second or so per GB.
    """
    for path in _json_lines_files(folder):
        if path.stat().st_size == 0:
            continue
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found = _NOT_AN_OBJECT.search(data, len(codecs.BOM_UTF8) if data[:3] == codecs.BOM_UTF8 else 0)
        if found:
            read_jsonl(path, source_lang, target_lang)  # raises, naming the line


@functools.cache
def _blank_pattern() -> str:
    """An RE2 pattern for text that `str.strip()` empties: Python's whitespace, so that a Hub row is blank by the
    very rule that makes a line of a local file blank."""
    spaces = (code for code in range(sys.maxunicode + 1) if chr(code).isspace())
    return "^[" + "".join(f"\\x{{{code:x}}}" for code in spaces) + "]*$"


def _row_problem(translation, languages: Sequence[str]) -> str | None:
    """What makes a Hub row's translation unusable (one line), or None."""
    if not isinstance(translation, dict):
        return f"the translation is {_preview(translation)}, not {{language: text}}"
    for lang in languages:
        if lang not in translation:
            return f"language {lang!r} missing (has {_preview(sorted(translation))})"
        if translation[lang] is None:
            return f"language {lang!r} missing (null)"
        problem = _side_problem(lang, translation[lang])
        if problem is not None:
            return problem
    return None


def _is_json(kind: pa.DataType) -> bool:
    """datasets' `Json` feature: values of mixed types (rows with different keys, a number among texts), stored as
    JSON text and decoded per row."""
    return isinstance(kind, pa.ExtensionType) and kind.extension_name == "arrow.json"


def _check_rows(dataset: datasets.Dataset, where: str, languages: Sequence[str], batch_size: int) -> None:
    """`check_translations` row by row in Python, for a column Arrow cannot check: datasets' `Json`."""
    start = 0
    for batch in dataset.select_columns("translation").iter(batch_size=batch_size):
        for index, translation in enumerate(batch["translation"]):
            problem = _row_problem(translation, languages)
            if problem is not None:
                raise DataError(f"{where}, row {start + index}: {problem}")
        start += len(batch["translation"])


def check_translations(dataset: datasets.Dataset, where: str, languages: Sequence[str], batch_size: int = 100_000):
    """Checks that every row of a Hub or `save_to_disk` split holds a usable text for each of `languages`, with
    Arrow's vectorised kernels over batches (a few seconds for millions of rows, in bounded memory): the first row
    whose translation is null, or whose side is null, blank, holds a NUL character or bytes that are not UTF-8,
    raises `DataError` naming `where` (the dataset and split) and the row's index in the split."""
    if "translation" not in dataset.column_names:
        raise DataError(f"{where}: no 'translation' column (has {_preview(dataset.column_names)})")
    kind = dataset.features.arrow_schema.field("translation").type
    if _is_json(kind) or (pa.types.is_struct(kind) and any(_is_json(field.type) for field in kind)):
        return _check_rows(dataset, where, languages, batch_size)
    if not pa.types.is_struct(kind):
        raise DataError(f"{where}: the 'translation' column holds {kind}, expected rows {{language: text}}")
    names = [kind.field(i).name for i in range(kind.num_fields)]
    for lang in languages:
        if lang not in names:
            raise DataError(f"{where}: language {lang!r} missing (has {_preview(sorted(names))})")
        if not (pa.types.is_string(kind.field(lang).type) or pa.types.is_large_string(kind.field(lang).type)):
            raise DataError(f"{where}: the {lang!r} side holds {kind.field(lang).type}, not text")
    start = 0
    try:
        for batch in dataset.with_format("arrow").iter(batch_size=batch_size):
            column = batch.column("translation").combine_chunks()
            bad = column.is_null()
            for lang in languages:
                side = pc.struct_field(column, lang)
                _check_utf8(side, where, start, lang)
                for mask in (side.is_null(), pc.match_substring_regex(side, _blank_pattern()),
                             pc.match_substring(side, "\0")):  # fmt: skip
                    bad = pc.or_(bad, pc.fill_null(mask, True))
            first = pc.index(bad, True).as_py()
            if first >= 0:
                row = batch.slice(first, 1).column("translation").to_pylist()[0]
                problem = _row_problem(row, languages) or "unusable"  # not reached: both checks agree
                raise DataError(f"{where}, row {start + first}: {problem}")
            start += batch.num_rows
    except (OSError, pa.ArrowException) as error:  # a truncated or damaged Arrow file
        raise DataError(f"{where}: cannot be read after row {start} ({error_line(error)})") from None


def _check_utf8(side: pa.Array, where: str, start: int, lang: str) -> None:
    try:
        side.validate(full=True)
    except pa.ArrowInvalid:
        for index, value in enumerate(side.cast(pa.binary()).to_pylist()):
            try:
                (value or b"").decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{where}, row {start + index}: the {lang!r} side holds bytes that are not UTF-8 "
                    f"({value[error.start : error.end]!r})"
                ) from None
        raise


_ARROW_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the last 8 bytes of a complete Arrow IPC stream


def remove_damaged_cache_files(dataset: datasets.Dataset) -> list[Path]:
    """Deletes the `datasets.map` / `filter` cache files (`cache-*.arrow`) beside `dataset`'s Arrow files that are
    not whole, and returns them; `map` then computes them again instead of stopping with an Arrow error.

    datasets writes a cache file under a temporary name and moves it into place once complete, so a killed run
    leaves none half-written (only a `tmp*` file that nothing reads); a file cut short afterwards (a copy, a disk
    error) could still end at a record batch's boundary and read as fewer rows. A whole file ends with Arrow's
    end-of-stream marker and reads through; the reading is memory-mapped (no copy of the data), so checking
    gigabytes of cache costs milliseconds.
    """
    removed = []
    for folder in sorted({Path(f["filename"]).parent for f in dataset.cache_files}):
        for path in sorted(folder.glob("cache-*.arrow")):
            try:
                with open(path, "rb") as f:
                    f.seek(max(path.stat().st_size - len(_ARROW_END_OF_STREAM), 0))
                    whole = f.read() == _ARROW_END_OF_STREAM
                if whole:
                    with pa.memory_map(str(path)) as source:
                        for _ in pa.ipc.open_stream(source):
                            pass
            except FileNotFoundError:
                continue  # another process's cleanup
            except (OSError, pa.ArrowException):
                whole = False
            if not whole:
                logger.warning("%s is not a whole Arrow file: removed, to be computed again", path)
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


__all__ = [
    "DataError",
    "check_translations",
    "local_paths",
    "looks_like_a_path",
    "missing_file",
    "read_jsonl",
    "read_parallel_text",
    "read_tsv",
    "remove_damaged_cache_files",
]
