"""Parallel text: the built-in German-English corpus, local files and Hub datasets, as `datasets.DatasetDict`s.

Every corpus comes out in the Hub's translation convention, splits "train", "validation" and "test", rows
`{"translation": {"en": ..., "de": ...}}`, so the rest of the pipeline never cares where it came from.

- `"ding"` (the default): sentence pairs extracted at run time from Debian's `trans-de-en` package (the Ding
  dictionary, GPL-2+; fetched with `apt-get download`, never part of this repository), split by dictionary entry.
  `"ding+phrases"`: the same splits, plus the training entries' multi-word phrases in the training split.
- A local file: JSONL rows `{"translation": {...}}`, a TSV whose header names the languages, or a path prefix `P`
  with two aligned plain-text files `P.<src>` and `P.<tgt>`. Split deterministically by line.
- A directory saved with `DatasetDict.save_to_disk`; anything else goes to `datasets.load_dataset(name, config)`.

Bad data raises `DataError` naming the file, the line and the problem; nothing is dropped without a logged count.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path

import datasets

from vaswani_mt.system.messages import error_line

from .readers import (  # re-exported: the readers are part of this module's API
    DataError,
    _check_json_lines_files,
    _check_rows_are_objects,
    _local_pairs,
    check_translations,
    local_paths,
    looks_like_a_path,
    missing_file,
    read_jsonl,
    read_parallel_text,
    read_tsv,
    remove_damaged_cache_files,
)

logger = logging.getLogger(__name__)

BUILTIN_CORPUS = "ding"
BUILTIN_CORPUS_WITH_PHRASES = "ding+phrases"  # the same, plus dictionary phrases in the training split
# Each built-in corpus and the extra training data it adds to the sentences (see load_ding).
BUILTIN_CORPORA = {BUILTIN_CORPUS: None, BUILTIN_CORPUS_WITH_PHRASES: "phrases"}
# Extra training data: the non-sentence pairs of extract_ding_phrases with at least this many words on each side.
_EXTRA_MIN_WORDS = {"phrases": 2}
DING_PACKAGE = "trans-de-en"
DING_PATH_IN_PACKAGE = "usr/share/trans/de-en"
SPLITS = ("train", "validation", "test")
# Fractions of dictionary entries (not pairs) held out; about 340 dev and 620 test pairs out of ~19,200.
HELD_OUT = {"validation": 0.018, "test": 0.032}


# ---------------------------------------------------------------------------------------------------------------
# Deterministic splits


def _bucket(key: str, seed: int) -> float:
    """A stable number in [0, 1) for `key`: the same split on every machine and Python version."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_by_group(groups: Sequence[str], seed: int = 0) -> dict[str, list[int]]:
    """Assigns each item to train/validation/test by a hash of its group, so items of one group stay together."""
    out: dict[str, list[int]] = {name: [] for name in SPLITS}
    dev, test = HELD_OUT["validation"], HELD_OUT["test"]
    for index, group in enumerate(groups):
        u = _bucket(group, seed)
        out["validation" if u < dev else "test" if u < dev + test else "train"].append(index)
    return out


def _to_dataset_dict(pairs: Sequence[tuple[str, str]], groups: Sequence[str], source: str, target: str, seed: int):
    indices = split_by_group(groups, seed)
    return datasets.DatasetDict(
        {
            name: datasets.Dataset.from_dict({"translation": [{source: pairs[i][0], target: pairs[i][1]} for i in idx]})
            for name, idx in indices.items()
        }
    )


# ---------------------------------------------------------------------------------------------------------------
# The built-in corpus: sentence pairs from the Ding dictionary

_ANNOTATION = re.compile(r"\{[^}]*\}|\[[^\]]*\]")
_EXPLANATION = re.compile(r"\([^)]*\)|(?<!\S)/[^/]+/(?!\S)")  # (explanations) and /ABBR/ abbreviations


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", _ANNOTATION.sub("", text)).strip()


def _is_sentence(text: str) -> bool:
    return len(text.split()) >= 3 and text[0].isupper() and text[-1] in ".!?"


def _ratio_ok(de: str, en: str) -> bool:
    words_de, words_en = len(de.split()), len(en.split())
    return max(words_de, words_en) <= 2 * min(words_de, words_en)


def _sub_entries(lines: Iterable[str]) -> Iterable[tuple[int, str, str]]:
    """(line number, German, English) for every sub-entry variant, `{...}` and `[...]` annotations removed: a line
    reads `de1 | de2 ... :: en1 | en2 ...`, sub-entries and their `;`-separated variants pair by position (lines
    whose sides have different numbers of sub-entries are skipped)."""
    for lineno, line in enumerate(lines, 1):
        if line.startswith("#") or "::" not in line:
            continue
        german, english = line.rstrip("\n").split("::", 1)
        german_subs, english_subs = german.split("|"), english.split("|")
        if len(german_subs) != len(english_subs):
            continue
        for german_sub, english_sub in zip(german_subs, english_subs, strict=True):
            for de, en in zip(german_sub.split(";"), english_sub.split(";"), strict=False):
                yield lineno, _clean(de), _clean(en)


def extract_ding_pairs(lines: Iterable[str]) -> list[tuple[int, str, str]]:
    """(line number, German, English) for the sub-entries that are whole sentences on both sides: >= 3 words,
    capitalised, ending in . ! or ?, word-count ratio <= 2, each German sentence once."""
    pairs, seen = [], set()
    for lineno, de, en in _sub_entries(lines):
        if not (_is_sentence(de) and _is_sentence(en)) or de in seen or not _ratio_ok(de, en):
            continue
        seen.add(de)
        pairs.append((lineno, de, en))
    return pairs


def extract_ding_phrases(lines: Iterable[str], min_words: int = 2) -> list[tuple[int, str, str]]:
    """(line number, German, English) for the multi-word sub-entries that are not sentences (`to resign from a
    union`), the extra data of `ding+phrases`: at least `min_words` words on each side without `(...)` and `/ABBR/`,
    word-count ratio <= 2, neither side a sentence, each pair once."""
    pairs, seen = [], set()
    for lineno, de, en in _sub_entries(lines):
        de, en = (re.sub(r"\s+", " ", _EXPLANATION.sub("", text)).strip() for text in (de, en))
        if min(len(de.split()), len(en.split())) < min_words or not _ratio_ok(de, en):
            continue
        if _is_sentence(de) or _is_sentence(en) or (de, en) in seen:
            continue
        seen.add((de, en))
        pairs.append((lineno, de, en))
    return pairs


def cache_dir() -> Path:
    root = os.environ.get("VASWANI_MT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "vaswani_mt"
    )
    return Path(root)


def _fetch_ding_dictionary(directory: Path) -> Path:
    """The dictionary file: an installed package's, else `apt-get download` + `dpkg-deb -x` into the cache."""
    installed = Path("/") / DING_PATH_IN_PACKAGE
    if installed.is_file():
        return installed
    target = directory / "de-en"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        for tool in ("apt-get", "dpkg-deb"):
            if shutil.which(tool) is None:
                raise DataError(
                    f"the built-in corpus needs Debian's {tool} to fetch the {DING_PACKAGE} package; install "
                    f"{DING_PACKAGE} or pass --dataset with your own parallel text"
                )
        result = subprocess.run(["apt-get", "download", DING_PACKAGE], cwd=tmp, capture_output=True, text=True)
        debs = list(Path(tmp).glob(f"{DING_PACKAGE}_*.deb"))
        if result.returncode != 0 or not debs:
            raise DataError(f"apt-get download {DING_PACKAGE} failed: {result.stderr.strip() or result.stdout.strip()}")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), os.path.join(tmp, "root")], check=True)
        # Move into place only once complete, so an interrupted download never looks like a finished one.
        os.replace(os.path.join(tmp, "root", DING_PATH_IN_PACKAGE), target)
    return target


# Bump when extract_ding_pairs / extract_ding_phrases change what they keep: every cached extraction is then redone.
_EXTRACTION_VERSION = 1


def _cached_extraction(name: str, extract) -> list[dict]:
    """Rows `{"entry", "de", "en"}` of `extract(dictionary lines)`, cached as `<cache>/ding/<name>.jsonl`.

    Each file is written under a name of its own and moved into place, so several processes may write it at once.
    Beside it, `<name>.done.json` records the rows' count, SHA-256 and what they were made from (the dictionary,
    `_EXTRACTION_VERSION`, `extract` and its options): rows without a matching record are extracted again.
    """
    directory = cache_dir() / "ding"
    path, done = directory / f"{name}.jsonl", directory / f"{name}.done.json"
    dictionary = _fetch_ding_dictionary(directory)
    stat = dictionary.stat()
    function = getattr(extract, "func", extract)  # a functools.partial's function, with its keywords
    options = {k: p.default for k, p in inspect.signature(function).parameters.items() if p.default is not p.empty}
    options = {"function": function.__name__, **options, **getattr(extract, "keywords", {})}
    made_from = {"dictionary": [stat.st_size, stat.st_mtime_ns], "version": _EXTRACTION_VERSION, "options": options}
    made_from = json.loads(json.dumps(made_from))  # as it reads back from the file
    rows = _read_extraction(path, done, made_from)
    if rows is not None:
        return rows
    with open(dictionary, encoding="utf-8") as f:
        extracted = extract(f)
    rows = [{"entry": entry, "de": de, "en": en} for entry, de, en in extracted]
    data = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
    record = {"rows": len(rows), "sha256": hashlib.sha256(data).hexdigest(), "made_from": made_from}
    directory.mkdir(parents=True, exist_ok=True)  # not made by _fetch_ding_dictionary when the package is installed
    _write_atomically(path, data)
    _write_atomically(done, json.dumps(record).encode())  # last: the rows before it are complete
    logger.info("extracted %d %s from %s into %s", len(rows), name, dictionary, path)
    return rows


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")  # this writer's own
    with open(tmp, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_extraction(path: Path, done: Path, made_from: dict) -> list[dict] | None:
    """The rows of `path` when `done` vouches for them and they were made from `made_from`, else None (and a log
    line saying why)."""
    if not path.is_file():
        return None
    try:
        record = json.loads(done.read_text(encoding="utf-8"))
        data = path.read_bytes()
    except (OSError, ValueError):
        record, data = None, b""
    if not isinstance(record, dict) or record.get("sha256") != hashlib.sha256(data).hexdigest():
        logger.warning("%s is incomplete or damaged: extracting again", path)
        return None
    if record.get("made_from") != made_from:
        logger.warning("%s was made from another dictionary or extraction: extracting again", path)
        return None
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def load_ding(
    source_lang: str = "en",
    target_lang: str = "de",
    seed: int = 0,
    extra: str | None = None,
    upsample_primary: int = 1,
) -> datasets.DatasetDict:
    """The built-in en-de corpus (about 19,200 sentence pairs), split by dictionary entry; cached after extraction.

    `extra="phrases"` (`--dataset ding+phrases`) adds the training entries' multi-word phrase pairs
    (`extract_ding_phrases`) to the training split only; validation and test stay the same sentences.
    `upsample_primary=N` puts each training sentence in the split N times (fairseq's `--upsample-primary`).
    """
    if extra is not None and extra not in _EXTRA_MIN_WORDS:
        raise DataError(f"extra must be one of {sorted(_EXTRA_MIN_WORDS)} or None, got {extra!r}")
    if upsample_primary < 1 or (upsample_primary > 1 and extra is None):
        raise DataError(
            f"upsample_primary must be >= 1, and > 1 only with extra data (ding+phrases); got {upsample_primary}"
        )
    if {source_lang, target_lang} != {"en", "de"}:
        raise DataError(f"the built-in corpus is German-English; got languages {source_lang!r} and {target_lang!r}")
    rows = _cached_extraction("pairs", extract_ding_pairs)
    pairs = [(row[source_lang], row[target_lang]) for row in rows]
    corpus = _to_dataset_dict(pairs, [str(row["entry"]) for row in rows], source_lang, target_lang, seed)
    corpus["train"] = datasets.concatenate_datasets([corpus["train"]] * upsample_primary)
    if extra is not None:
        extracted = _cached_extraction(extra, partial(extract_ding_phrases, min_words=_EXTRA_MIN_WORDS[extra]))
        train = split_by_group([str(row["entry"]) for row in extracted], seed)["train"]
        rows = [{source_lang: extracted[i][source_lang], target_lang: extracted[i][target_lang]} for i in train]
        added = datasets.Dataset.from_dict({"translation": rows}, features=corpus["train"].features)
        corpus["train"] = datasets.concatenate_datasets([corpus["train"], added])
    return corpus


# ---------------------------------------------------------------------------------------------------------------
# Entry point


def load_corpus(
    dataset: str = BUILTIN_CORPUS,
    dataset_config: str | None = None,
    source_lang: str = "en",
    target_lang: str = "de",
    seed: int = 0,
    upsample_primary: int = 1,
) -> datasets.DatasetDict:
    """Loads `dataset` (see the module docstring) as train/validation/test in the translation convention.

    `upsample_primary` (> 1 only for `ding+phrases`): each training sentence that many times per epoch.
    """
    if source_lang == target_lang:
        raise DataError(f"source and target language are both {source_lang!r}")
    if dataset in BUILTIN_CORPORA:
        extra = BUILTIN_CORPORA[dataset]
        return load_ding(source_lang, target_lang, seed, extra, upsample_primary)
    if upsample_primary != 1:
        raise DataError(f"upsample_primary needs a corpus with extra data (ding+phrases), not {dataset!r}")
    missing = missing_file(dataset, (source_lang, target_lang))  # a path, not a Hub id: no Hub call
    if missing:
        raise DataError(missing)
    pairs = _local_pairs(dataset, source_lang, target_lang)
    if pairs is not None:
        if not pairs:
            raise DataError(f"{dataset}: no sentence pairs (empty file)")
        corpus = _to_dataset_dict(pairs, [str(i) for i in range(len(pairs))], source_lang, target_lang, seed)
    else:
        saved = Path(dataset, "dataset_dict.json").is_file()
        folder = Path(dataset) if Path(dataset).is_dir() and not saved else None  # a local dataset folder
        if folder is not None:
            _check_rows_are_objects(folder, source_lang, target_lang)
        try:
            if saved:
                corpus = datasets.load_from_disk(dataset)
            else:
                corpus = datasets.load_dataset(dataset, dataset_config)  # a Hub id, or a local dataset folder
        except Exception as error:  # datasets raises many kinds (StopIteration for an empty JSON file)
            if folder is not None:
                _check_json_lines_files(folder, source_lang, target_lang)  # the file and line, where it can tell
            # datasets' own message, cause included, in one line: what failed to load, and why
            cause = error.__cause__ if isinstance(error, datasets.exceptions.DatasetGenerationError) else None
            kind = "a save_to_disk folder" if saved else "a dataset"
            detail = error_line(error) + (f" ({error_line(cause)})" if cause is not None else "")
            raise DataError(f"{dataset}: cannot be loaded as {kind}: {detail}") from None
        try:
            corpus = _normalise_hub_corpus(corpus, dataset, source_lang, target_lang, seed)
        except DataError:
            if folder is not None:
                _check_json_lines_files(folder, source_lang, target_lang)
            raise
    return corpus


def is_hub_id(dataset: str, languages: Sequence[str] = ()) -> bool:
    """Whether `load_corpus` asks the Hub for `dataset`: not a built-in corpus, not a path, nothing local it names."""
    return not (dataset in BUILTIN_CORPORA or looks_like_a_path(dataset)
                or any(path.exists() for path in local_paths(dataset, languages)))  # fmt: skip


def load_run_corpus(data_args) -> datasets.DatasetDict:
    """`load_corpus` with a run's `DataArguments`. The split never depends on `--seed`: every run of a corpus is
    scored on the same test pairs."""
    return load_corpus(
        data_args.dataset,
        data_args.dataset_config,
        data_args.source_lang,
        data_args.target_lang,
        upsample_primary=data_args.upsample_primary,
    )


def _normalise_hub_corpus(corpus, name: str, source_lang: str, target_lang: str, seed: int) -> datasets.DatasetDict:
    aliases = {"valid": "validation", "dev": "validation"}
    corpus = datasets.DatasetDict({aliases.get(k, k): v for k, v in corpus.items()})
    if "train" not in corpus:
        raise DataError(f"{name}: no 'train' split (has {sorted(corpus)})")
    for split in SPLITS:
        if split in corpus:
            check_translations(corpus[split], f"{name}: split {split!r}", (source_lang, target_lang))
    for split in SPLITS:
        if split in corpus and len(corpus[split]) == 0:
            raise DataError(f"{name}: split {split!r} has no rows")
    train = corpus["train"]
    if "validation" not in corpus or "test" not in corpus:
        # Hold out from train deterministically by row, as for local files.
        held = split_by_group([str(i) for i in range(len(train))], seed)
        keep = list(held["train"])
        for split in ("validation", "test"):
            if split in corpus:
                keep += held[split]  # that split exists: its bucket of train rows stays in train
            else:
                corpus[split] = train.select(held[split])
        corpus["train"] = train.select(sorted(keep))
    return datasets.DatasetDict({split: corpus[split] for split in SPLITS})


def describe_corpus(dataset: str, dataset_config: str | None = None, upsample_primary: int = 1) -> dict:
    """What a model card says of the training data (`vaswani_mt.hub.card.card_values`): licence, name, a note on
    what was used, and the limitations it implies. The built-in corpora carry the Ding dictionary's GPL-2+."""
    if dataset not in BUILTIN_CORPORA:
        return {
            "license": "apache-2.0",
            "dataset_id": dataset,
            "dataset_name": dataset,
            "dataset_note": f"{dataset} {dataset_config or ''}".strip(),
            "limitations": "Quality outside the training domain is unknown.",
        }
    return {
        "license": "gpl-2.0",
        "dataset_id": "trans-de-en (Debian, Ding dictionary)",
        "dataset_name": "Ding de-en dictionary sentence pairs",
        "dataset_note": "sentence-like example pairs of the Ding dictionary (GPL-2+), split by dictionary entry"
        + (", plus the multi-word phrases of the training entries" if dataset != BUILTIN_CORPUS else "")
        + (f"; each sentence {upsample_primary} times" if upsample_primary > 1 else ""),
        "limitations": "Trained on short dictionary example sentences (about 8 words): expect poor output on long, "
        "technical or informal text, and on names and numbers the dictionary does not contain.",
    }


def source_target(corpus: datasets.Dataset, source_lang: str, target_lang: str) -> tuple[list[str], list[str]]:
    """The source and target sentences of a split, as two aligned lists."""
    rows = corpus["translation"]
    return [row[source_lang] for row in rows], [row[target_lang] for row in rows]


__all__ = [
    "BUILTIN_CORPORA",
    "BUILTIN_CORPUS",
    "BUILTIN_CORPUS_WITH_PHRASES",
    "DataError",
    "check_translations",
    "describe_corpus",
    "extract_ding_pairs",
    "extract_ding_phrases",
    "is_hub_id",
    "load_corpus",
    "load_ding",
    "load_run_corpus",
    "read_jsonl",
    "read_parallel_text",
    "read_tsv",
    "remove_damaged_cache_files",
    "source_target",
    "split_by_group",
]
