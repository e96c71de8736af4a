#!/usr/bin/env python
"""How many words of the test references each training corpus never shows: the lexical side of "what limits it".

For each corpus, the share of the test split's word tokens (lower-cased `\\w+` runs, per language) that never
occur in its training split, and the share that occur fewer than 3 times. The built-in corpora differ only in their
training split, so this isolates what the extra dictionary data adds.

    python benchmarks/vocabulary_coverage.py --datasets ding ding+phrases ding+dictionary
"""

import argparse
import json
import re
from collections import Counter

from vaswani_mt.data import BUILTIN_CORPORA, load_corpus

WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def coverage(dataset: str, languages=("en", "de"), rare_below: int = 3) -> list[dict]:
    corpus = load_corpus(dataset)
    train, test = corpus["train"]["translation"], corpus["test"]["translation"]
    rows = []
    for lang in languages:
        counts = Counter(w for pair in train for w in words(pair[lang]))
        tokens = [w for pair in test for w in words(pair[lang])]
        rows.append(
            {
                "dataset": dataset,
                "language": lang,
                "training pairs": len(train),
                "test tokens": len(tokens),
                "unseen %": round(100 * sum(counts[w] == 0 for w in tokens) / len(tokens), 2),
                f"seen < {rare_below}x %": round(100 * sum(counts[w] < rare_below for w in tokens) / len(tokens), 2),
            }
        )
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(BUILTIN_CORPORA))
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    rows = [row for dataset in args.datasets for row in coverage(dataset)]
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(str(v) for v in row.values()) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
