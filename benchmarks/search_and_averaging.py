#!/usr/bin/env python
"""What checkpoint averaging (§6.1) and beam search (§6.1) each add: test sacreBLEU of one training run for
{the final checkpoint, the mean of its last K checkpoints} x {the paper's beam search, greedy search}.

The paper's search is beam 4, GNMT length penalty alpha 0.6, at most input + 50 tokens; greedy is the same with one
beam; a run that saved another search in its generation config (train.py `--length_penalty`) also gets a row for
it. Each cell also gives chrF, the brevity penalty and the seconds spent.
`--average_last` takes several K (`3,5,8`) and `--length_penalties` other alphas for beam 4 (`0.8,1.0`): the
paper chose both on its dev set (§6.1), which `--split validation` gives. `--search` adds any other beam search
given as `generate()` keyword arguments (repeatable): `--search length_penalty=1.2,no_repeat_ngram_size=3`,
`--search max_len_a=1.2,max_len_b=5` (fairseq's per-sentence length limit a * |X| + b; the paper's is 1 * |X| + 50).

    python benchmarks/search_and_averaging.py outputs/ding-cpu --average_last 5 --json results.json
    python benchmarks/search_and_averaging.py outputs/ding-cpu --split validation --average_last 3,5,8 \
        --length_penalties 0.8,1.0,1.2 --search length_penalty=1.0,no_repeat_ngram_size=3
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

from vaswani_mt.data.corpus import BUILTIN_CORPUS, load_corpus, source_target
from vaswani_mt.evaluation.metrics import evaluate_bleu
from vaswani_mt.model.generation_vaswani import PAPER_SEARCH
from vaswani_mt.training.checkpoints import average_checkpoints, list_checkpoints

SEARCHES = {"beam 4 (paper)": dict(PAPER_SEARCH), "greedy": {**PAPER_SEARCH, "num_beams": 1}}


def parse_search(text: str) -> dict:
    """`length_penalty=1.2,no_repeat_ngram_size=3` -> {"length_penalty": 1.2, "no_repeat_ngram_size": 3}."""
    kwargs = {}
    for item in filter(None, text.split(",")):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise SystemExit(f"--search {text!r}: {item!r} is not KEY=VALUE")
        try:
            kwargs[key] = json.loads(value)  # 3, 1.2, true, false
        except json.JSONDecodeError:
            raise SystemExit(f"--search {text!r}: {value!r} is not a number or true/false") from None
    if not kwargs:
        raise SystemExit(f"--search {text!r}: no KEY=VALUE given")
    return kwargs


def saved_search(run: Path) -> str | None:
    """The row name of the search a run saved in its generation config, when it is not the paper's."""
    checkpoints = list_checkpoints(run)
    if not checkpoints:
        return None
    config = GenerationConfig.from_pretrained(checkpoints[-1])
    if all(getattr(config, key, None) == value for key, value in PAPER_SEARCH.items()):
        return None
    return f"beam {config.num_beams}, alpha {config.length_penalty} (saved)"


def score_run(
    run: Path,
    sources,
    references,
    average_last: list[int],
    batch_size: int = 64,
    searches: dict[str, dict] = SEARCHES,
) -> list[dict]:
    """One row per (weights, search): the final checkpoint and the mean of each last K, each with every search
    (name -> `generate()` keyword arguments)."""
    checkpoints = list_checkpoints(run)
    if not checkpoints:
        raise SystemExit(f"{run}: no complete checkpoint-N folders")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        weights = {f"final ({checkpoints[-1].name})": checkpoints[-1]}
        for last in average_last:
            if last > 1 and len(checkpoints) > 1:
                used = checkpoints[-last:]
                weights[f"mean of last {len(used)} ({used[0].name} .. {used[-1].name})"] = average_checkpoints(
                    run, last, Path(tmp) / f"averaged-{last}"
                )
        tokenizer = AutoTokenizer.from_pretrained(checkpoints[-1])
        for name, folder in weights.items():
            model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
            for search, kwargs in searches.items():
                start = time.perf_counter()
                result = evaluate_bleu(model, tokenizer, sources, references, batch_size=batch_size, **kwargs)
                rows.append(
                    {
                        "weights": name,
                        "search": search,
                        "bleu": round(result["score"], 2),
                        "chrf": round(result["chrf"], 2),
                        "bp": round(result["bp"], 3),
                        "seconds": round(time.perf_counter() - start, 1),
                        "signature": result["signature"],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a training output folder holding checkpoint-N folders")
    parser.add_argument("--dataset", default=BUILTIN_CORPUS, help="the corpus the run trained on (train.py's)")
    parser.add_argument("--split", default="test", choices=["validation", "test"])
    parser.add_argument("--average_last", default="5", help="K, or several: 3,5,8")
    parser.add_argument("--length_penalties", default="", help="also beam 4 with these GNMT alphas: 0.8,1.0")
    parser.add_argument(
        "--search", action="append", default=[], help="another beam-4 search as generate() kwargs: KEY=VALUE,KEY=VALUE"
    )
    parser.add_argument("--max_samples", type=int, default=None)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)

    sources, references = source_target(load_corpus(args.dataset)[args.split], "en", "de")
    if args.max_samples:
        sources, references = sources[: args.max_samples], references[: args.max_samples]
    average_last = [int(value) for value in args.average_last.split(",")]
    searches = dict(SEARCHES)
    saved = saved_search(Path(args.run))
    if saved is not None:
        searches[saved] = {}  # the model's own generation config
    for alpha in filter(None, args.length_penalties.split(",")):
        searches[f"beam 4, alpha {float(alpha)}"] = {"length_penalty": float(alpha)}
    searches.update({f"beam 4, {text}": parse_search(text) for text in args.search})
    rows = score_run(Path(args.run), sources, references, average_last, args.batch_size, searches)
    print(f"\n{args.run}, {args.split} split ({len(sources)} sentences), sacreBLEU {rows[0]['signature']}\n")
    print("| weights | search | BLEU | chrF | BP | seconds |\n|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['weights']} | {row['search']} | {row['bleu']} | {row['chrf']} | {row['bp']} | {row['seconds']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"run": args.run, "split": args.split, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
