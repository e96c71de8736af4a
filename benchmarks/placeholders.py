"""Placeholders through translation, two ways, on the main job's model: kept in the text as constraints (the default
with beam search) against taken out and put back by word alignment.

The test: each test sentence with a Ding dictionary word whose German side is in its reference (the pairs of
`alignments.py`'s markup test) gets `{0}` right before that English word, and the German term as a constraint. A
placement is right where `{0}` comes right before the German term in the output. Both ways give each placeholder
exactly once; the measure is where.

    python benchmarks/placeholders.py outputs/ding-cpu --json benchmarks/placeholders_2026-11-26.json
"""

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from alignments import BATCH, dictionary_pairs, markup_test
from speed_common import MachineRecord

from vaswani_mt.data.corpus import BUILTIN_CORPUS, _fetch_ding_dictionary, cache_dir, load_corpus, source_target
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.markup import placeholders, restore_markup, take_out_markup, well_formed
from vaswani_mt.inference.translate import translate
from vaswani_mt.system import native_bf16


def placeholder_lines(rows) -> list[tuple[str, str]]:
    """(source with `{0}` before the dictionary word, German term) of `markup_test`'s rows."""
    return [(source.replace("<b>", "{0} ").replace("</b>", ""), term) for source, _, term in rows]


def by_alignment(model, tokenizer, lines, terms) -> list[str]:
    """Placeholders taken out and put back by word alignment (what markup does without beam search)."""
    plans = take_out_markup(lines)
    texts = translate(model, tokenizer, [p.text for p in plans], BATCH, alignments="hard", constraints=terms)
    return restore_markup(plans, texts)


def score(lines, outputs) -> dict:
    right = once = formed = 0
    for (source, term), output in zip(lines, outputs, strict=True):
        right += re.search(rf"(?i)\{{0\}}\s+{re.escape(term)}\b", output) is not None
        once += placeholders(output) == placeholders(source)
        formed += well_formed(output)
    n = len(lines)
    return {"placed_before_the_term": round(100 * right / n, 1), "placeholder_once": round(100 * once / n, 1),
            "well_formed": round(100 * formed / n, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="the main job's output folder")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args()
    record = MachineRecord()
    model, tokenizer = load_for_inference(args.model)
    corpus = load_corpus(BUILTIN_CORPUS, None, "en", "de")
    sources, references = source_target(corpus["test"], "en", "de")
    pairs = dictionary_pairs(_fetch_ding_dictionary(cache_dir() / "ding"))
    lines = placeholder_lines(markup_test(sources, references, pairs))
    texts, terms = [line for line, _ in lines], [[term] for _, term in lines]
    result = {"model": args.model, "native_bf16": native_bf16(), "lines": len(lines)}
    runs = {
        "constraints": lambda: translate(model, tokenizer, texts, BATCH, markup="xml", constraints=terms),
        "alignment": lambda: by_alignment(model, tokenizer, texts, terms),
    }
    for name, run in runs.items():
        start = time.perf_counter()
        outputs = run()
        seconds = round(time.perf_counter() - start, 1)
        examples = [{"source": s, "output": o} for (s, _), o in zip(lines[:5], outputs, strict=False)]
        result[name] = {**score(lines, outputs), "seconds": seconds, "examples": examples}
    result.update(record.finish())
    text = json.dumps(result, indent=1, ensure_ascii=False)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
