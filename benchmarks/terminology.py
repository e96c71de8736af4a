#!/usr/bin/env python
"""Terminology constraints on the main job's model: a term test built from data we have; the typo warning's rules.

The term test: the built-in corpus's test split and the Ding dictionary's noun entries (German side marked `{m}`,
`{f}`, `{n}` or `{pl}`; `{...}`, `[...]`, `(...)` and `/.../` annotations removed; one German word of 4 or more
letters, an English side of one or two words of 4 or more letters, spelled differently). A pair is a term of a test
sentence where its English side occurs in the source as whole words (any case) and its German side in the reference
as a whole word (its case). Each such sentence gets one term, its longest German side (then alphabetical).

Reported, with and without constraints (`translate(..., constraints=...)`, the model's own search, batch 16): term
accuracy (the German term in the output as a whole word, exactly and lower-cased), constraint satisfaction (the
search's own account, `ControlReport`), sacreBLEU and chrF on the term sentences and on the whole split (the other
sentences unconstrained), and sentences per second over the split. The speed cost of one term a line against none:
`speed.py peers`.

    python benchmarks/terminology.py outputs/ding-cpu --json benchmarks/terminology_2026-11-26.json
    python benchmarks/terminology.py outputs/ding-cpu --length_penalty 0.6   # the paper's alpha
    python benchmarks/terminology.py outputs/ding-cpu --constrained_length_penalty 1.2   # terms at the model's alpha
    python benchmarks/terminology.py outputs/ding-cpu --typo_check   # the typo warning on the terms' real words
"""

import itertools
import re
import time
from pathlib import Path

from speed_common import MachineRecord, command_parser, split_pairs

from vaswani_mt.data.corpus import _fetch_ding_dictionary, cache_dir
from vaswani_mt.evaluation.metrics import bleu
from vaswani_mt.inference.controls import ControlReport
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.translate import translate
from vaswani_mt.system import native_bf16

NOUN = re.compile(r"\{(?:m|f|n|pl)\}")
ANNOTATIONS = re.compile(r"\{[^}]*\}|\[[^\]]*\]|\([^)]*\)|(?<!\S)/[^/]+/(?!\S)")
GERMAN_WORD = re.compile(r"^[A-ZÄÖÜ][a-zäöüß]{3,}$")
ENGLISH_WORDS = re.compile(r"^[a-z]{4,}( [a-z]{4,})?$")
BATCH = 16


def dictionary_entries(dictionary: Path):
    """(German, English) of each `;`-separated sub-entry of the Ding dictionary, as written (annotations included)."""
    with open(dictionary, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or "::" not in line:
                continue
            german, english = line.rstrip("\n").split("::", 1)
            if german.count("|") != english.count("|"):
                continue
            for german_sub, english_sub in zip(german.split("|"), english.split("|"), strict=True):
                yield from zip(german_sub.split(";"), english_sub.split(";"), strict=False)


def noun_pairs(dictionary: Path) -> dict[str, set[str]]:
    """English term -> the German nouns the dictionary gives for it (the rules in the module's docstring)."""
    pairs: dict[str, set[str]] = {}
    for de, en in dictionary_entries(dictionary):
        if not NOUN.search(de):
            continue
        de, en = (re.sub(r"\s+", " ", ANNOTATIONS.sub("", text)).strip() for text in (de, en))
        en = en.removeprefix("to ").lower()
        if GERMAN_WORD.match(de) and ENGLISH_WORDS.match(en) and de.lower() != en:
            pairs.setdefault(en, set()).add(de)
    return pairs


def term_test(sources: list[str], references: list[str], pairs: dict[str, set[str]]) -> list[list[str]]:
    """Each test sentence's term (a list of one German word, or empty): see the module's docstring."""
    terms = []
    for source, reference in zip(sources, references, strict=True):
        words = re.findall(r"[a-z]+", source.lower())
        english = set(words) | {f"{a} {b}" for a, b in itertools.pairwise(words)}
        in_reference = set(re.findall(r"\w+", reference))
        found = sorted({de for en in english & pairs.keys() for de in pairs[en] if de in in_reference},
                       key=lambda de: (-len(de), de))  # fmt: skip
        terms.append(found[:1])
    return terms


def accuracy(translations: list[str], terms: list[list[str]]) -> dict:
    rows = [(text, term) for text, wanted in zip(translations, terms, strict=True) for term in wanted]
    exact = sum(bool(re.search(rf"\b{re.escape(t)}\b", text)) for text, t in rows)
    lower = sum(bool(re.search(rf"\b{re.escape(t.lower())}\b", text.lower())) for text, t in rows)
    return {
        "terms": len(rows),
        "exact": round(100 * exact / len(rows), 1),
        "lowercased": round(100 * lower / len(rows), 1),
    }


def quality(model, tokenizer, sources, references, terms, constrained: bool, search: dict) -> dict:
    subset = [i for i, wanted in enumerate(terms) if wanted]
    report = ControlReport()
    kwargs = {**search, **({"constraints": terms, "report": report} if constrained else {})}
    start = time.perf_counter()
    translations = translate(model, tokenizer, sources, batch_size=BATCH, **kwargs)
    seconds = time.perf_counter() - start
    whole = bleu(translations, references)
    part = bleu([translations[i] for i in subset], [references[i] for i in subset])
    row = {
        "constraints": constrained,
        "words": sum(len(text.split()) for text in translations),
        "words_terms": sum(len(translations[i].split()) for i in subset),
        "term_accuracy": accuracy([translations[i] for i in subset], [terms[i] for i in subset]),
        "bleu_whole": round(whole["score"], 2), "chrf_whole": round(whole["chrf"], 2),
        "bleu_terms": round(part["score"], 2), "chrf_terms": round(part["chrf"], 2),
        "sentences_per_second": round(len(sources) / seconds, 2),
    }  # fmt: skip
    if constrained:
        row["satisfied"] = round(100 * (1 - len(report.unmet) / len(subset)), 1)
        row["unmet_lines"] = sorted(report.unmet)
        row["failed_lines"] = report.failed
    return row, translations


def old_rule(tokenizer, word: str) -> bool:
    """The typo warning before 2026-11-28: 3 or more pieces of under 2.5 characters on average."""
    pieces = tokenizer.tokenize(" " + word, add_special_tokens=False)
    return len(pieces) >= 3 and len(word) / len(pieces) < 2.5


def typo_check(tokenizer, terms: list[list[str]]) -> dict:
    """How often each rule warns: on the term test's real German words (false alarms), and on typos made from them
    (the middle letter left out; the two middle letters swapped), which it should catch."""
    from vaswani_mt.model.pipeline_vaswani import unusual_pieces

    words = sorted({term for line in terms for term in line})
    middle = [len(w) // 2 for w in words]
    typos = {
        "dropped": [w[:m] + w[m + 1 :] for w, m in zip(words, middle, strict=True)],
        "swapped": [w[: m - 1] + w[m] + w[m - 1] + w[m + 1 :] for w, m in zip(words, middle, strict=True)],
    }
    typos = {kind: [t for t, w in zip(made, words, strict=True) if t != w] for kind, made in typos.items()}
    rules = {"old": lambda w: old_rule(tokenizer, w), "new": lambda w: unusual_pieces(tokenizer, w) is not None}
    result = {"words": len(words), "term_lines": sum(map(bool, terms))}
    for name, rule in rules.items():
        warned = [w for w in words if rule(w)]
        line_share = sum(any(rule(t) for t in line) for line in terms if line) / max(1, result["term_lines"])
        result[name] = {
            "false_alarms_share_of_words": round(len(warned) / len(words), 4),
            "false_alarms_share_of_term_lines": round(line_share, 4),
            "false_alarm_examples": warned[:12],
            **{f"typos_{kind}_caught": round(sum(map(rule, made)) / len(made), 4) for kind, made in typos.items()},
        }
    return result


def held_out_term_sets(terms: list[list[str]], sources: list[str], references: list[str]) -> dict[str, list]:
    """The term sets the typo warning is measured on (issue 62, item 7), each a list of per-line term lists: the term
    test's dictionary terms; the held-back term of each test line (`reference_terms`, what `speed.py peers` forces);
    and that of each line of benchmarks/markup_heldout.jsonl with a reference (its tags taken out)."""
    import json

    from vaswani_mt.evaluation.terminology import reference_terms

    rows = [json.loads(line) for line in (Path(__file__).parent / "markup_heldout.jsonl").read_text().splitlines()]
    rows = [row for row in rows if row.get("reference")]
    untagged = [[re.sub(r"<[^>]*>", "", row[side]) for row in rows] for side in ("source", "reference")]
    return {"dictionary terms (term test)": terms, "test split, held-back terms": reference_terms(sources, references),
            "markup held-out, held-back terms": reference_terms(*untagged)}  # fmt: skip


def main() -> None:
    parser = command_parser(__doc__)
    parser.add_argument("model", help="the main job's output folder (its averaged model)")
    parser.add_argument("--length_penalty", type=float, default=None, help="GNMT alpha (default: the model's)")
    parser.add_argument("--constrained_length_penalty", type=float, default=None,
                        help="the constrained sentences' alpha (default: the model's, else its alpha)")  # fmt: skip
    parser.add_argument("--typo_check", action="store_true",
                        help="only the typo warning's rules on the term test's words (MODEL: a folder with the "
                        "main job's tokenizer.json, its model not needed)")  # fmt: skip
    args = parser.parse_args()
    record = MachineRecord()
    sources, references = split_pairs("test")
    terms = term_test(sources, references, noun_pairs(_fetch_ding_dictionary(cache_dir() / "ding")))
    if args.typo_check:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        sets = held_out_term_sets(terms, sources, references)
        record.report({"tokenizer": args.model, **{name: typo_check(tokenizer, lines) for name, lines in sets.items()}},
                      args.json)  # fmt: skip
        return
    model, tokenizer = load_for_inference(args.model)
    result = {
        "model": args.model, "native_bf16": native_bf16(), "search": model.generation_config.to_diff_dict(),
        "sentences": len(sources), "term_sentences": sum(map(bool, terms)),
        "examples": [(s, t) for s, t in zip(sources, terms, strict=True) if t][:8],
    }  # fmt: skip
    alphas = ("length_penalty", "constrained_length_penalty")
    search = {key: getattr(args, key) for key in alphas if getattr(args, key) is not None}  # else the model's own
    result.update({key: search.get(key, getattr(model.generation_config, key, None)) for key in alphas})
    plain, plain_out = quality(model, tokenizer, sources, references, terms, False, search)
    constrained, constrained_out = quality(model, tokenizer, sources, references, terms, True, search)
    same = [a == b for a, b, t in zip(plain_out, constrained_out, terms, strict=True) if not t]
    result["runs"] = [plain, constrained]
    result["unconstrained_lines_identical"] = f"{sum(same)} of {len(same)}"
    record.report(result, args.json)


if __name__ == "__main__":
    main()
