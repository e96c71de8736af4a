#!/usr/bin/env python
"""WMT-scale data preparation on one machine: wall time and peak memory of each stage at 4.5M sentence pairs.

A synthetic corpus with WMT14 en-de's shape (4.5M training pairs of log-normal lengths, about 23 words a side;
newstest-sized dev and test splits), saved with `save_to_disk` as the Hub's `wmt14` would be, then the stages the
training job runs, each in a process of its own so that its peak RSS is its own (`ru_maxrss` of the stage and of
its worker processes):

1. `tokenizer`: the joint BPE (`data.tokenization.build_tokenizer`, from a stream of `--tokenizer_sample` pairs);
2. `tokenize`: `data.tokenization.tokenize_corpus` (`datasets.map` in `--num_proc` processes, cached beside the corpus);
3. `tokenize_again`: the same call, which must find that cache (a rerun or a resumed job);
4. `sampler`: the token-budget sampler from the length arrays (`batching.length_array`), and one epoch of batches;
5. `resume`: the sampler built again and set to the middle of the epoch the way the Trainer resumes (accelerate's
   `SkipBatchSampler`); the first batch after the skip must be the one a straight run reaches there.

    python benchmarks/data_scale.py --work_dir outputs/wmt_scale                 # 4.5M pairs, the WMT recipe's options
    python benchmarks/data_scale.py --work_dir outputs/small --pairs 20000 --vocab_size 2000 --json out.json

Target on a 2-core machine (the WMT recipe issue): the whole preparation in at most 20 minutes and 8 GiB.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from speed_common import MachineRecord, child_argv, command_parser, peak_rss_mib

STAGES = ("tokenizer", "tokenize", "tokenize_again", "sampler", "resume")


def parse(argv=None) -> argparse.Namespace:
    parser = command_parser(__doc__, json_help="also write the figures here")
    parser.add_argument("--work_dir", required=True, help="holds the synthetic corpus, its caches and the tokenizer")
    parser.add_argument("--pairs", type=int, default=4_500_000, help="training pairs (WMT14 en-de: about 4.5M)")
    parser.add_argument("--vocab_size", type=int, default=37000, help="the joint BPE's size (the WMT recipe's)")
    parser.add_argument("--tokenizer_sample", type=int, default=1_000_000, help="pairs the BPE is learned from")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count() or 1, help="tokenization processes")
    parser.add_argument("--max_tokens", type=int, default=3125, help="token budget per batch (the 8-GPU recipe's)")
    parser.add_argument("--seed", type=int, default=1, help="of the synthetic corpus and the sampler")
    parser.add_argument("--stage", choices=(*STAGES, "corpus"), help=argparse.SUPPRESS)  # in a process of its own
    return parser.parse_args(argv)


# --- The synthetic corpus --------------------------------------------------------------------------------------------


def _words(rng, count: int, vocabulary: int, length: int) -> list[str]:
    """`count` distinct pseudo-words (letters, so that BPE has pieces to learn), Zipf-ranked by position."""
    letters = list("abcdefghijklmnopqrstuvwxyzäöüß")
    lengths = rng.integers(2, length, count)
    return ["".join(rng.choice(letters, n)) for n in lengths][:vocabulary]


def _sentences(rng, words, mean_words: float, count: int) -> list[str]:
    import numpy as np

    lengths = np.clip(rng.lognormal(np.log(mean_words) - 0.18, 0.6, count).astype(int), 1, 250)
    ranks = (rng.zipf(1.1, int(lengths.sum())) - 1) % len(words)  # Zipf-ranked, the long tail wrapped round
    flat = np.asarray(words, dtype=object)[ranks]
    ends = np.cumsum(lengths)
    return [" ".join(flat[end - n : end]).capitalize() + "." for n, end in zip(lengths, ends, strict=True)]


def make_corpus(folder: Path, pairs: int, seed: int) -> None:
    """A `save_to_disk` DatasetDict shaped like the Hub's wmt14 de-en: train / validation / test of
    `{"translation": {"de": ..., "en": ...}}`, 3000 dev and 3003 test pairs."""
    import datasets
    import numpy as np

    rng = np.random.default_rng(seed)
    english, german = _words(rng, 60_000, 50_000, 10), _words(rng, 80_000, 70_000, 12)
    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})

    def rows(count: int, chunk: int = 200_000):
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            en, de = _sentences(rng, english, 23.0, n), _sentences(rng, german, 21.5, n)
            yield from ({"translation": {"de": d, "en": e}} for d, e in zip(de, en, strict=True))

    splits = {"train": pairs, "validation": 3000, "test": 3003}
    corpus = datasets.DatasetDict(
        {
            name: datasets.Dataset.from_generator(
                rows, gen_kwargs={"count": count}, features=features, cache_dir=str(folder.parent / "generator_cache")
            )
            for name, count in splits.items()
        }
    )
    corpus.save_to_disk(str(folder))


# --- The stages, each in its own process -----------------------------------------------------------------------------


def run_stage(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from vaswani_mt.data.batching import TokenBudgetBatchSampler, length_array
    from vaswani_mt.data.corpus import load_corpus
    from vaswani_mt.data.tokenization import build_tokenizer, tokenize_corpus
    from vaswani_mt.training.arguments import parse_args as training_args

    work = Path(args.work_dir)
    model_args, data_args, _, _ = training_args(
        ["--dataset", str(work / "corpus"), "--vocab_size", str(args.vocab_size), "--tokenizer_sample",
         str(args.tokenizer_sample), "--preprocessing_num_workers", str(args.num_proc), "--report_to", "none"]
    )  # fmt: skip
    started = time.perf_counter()
    corpus = load_corpus(data_args.dataset, None, "en", "de")
    figures: dict = {"load_seconds": round(time.perf_counter() - started, 2)}
    started = time.perf_counter()
    if args.stage == "tokenizer":
        shutil.rmtree(work / "tokenizer", ignore_errors=True)  # learned afresh, not the run's saved one
        tokenizer = build_tokenizer(corpus, ("en", "de"), work, vocab_size=model_args.vocab_size,
                                    sample=model_args.tokenizer_sample)  # fmt: skip
        figures["vocabulary"] = len(tokenizer)
    elif args.stage in ("tokenize", "tokenize_again"):
        tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
        train = tokenize_corpus(corpus, tokenizer, "en", "de", num_proc=data_args.preprocessing_num_workers)["train"]
        figures["train_pairs_kept"] = len(train)
        figures["cache_files"] = sorted({Path(f["filename"]).name for f in train.cache_files})
    else:
        tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
        train = tokenize_corpus(corpus, tokenizer, "en", "de", num_proc=data_args.preprocessing_num_workers)["train"]
        figures["cached_tokenization_seconds"] = round(time.perf_counter() - started, 2)
        started = time.perf_counter()
        lengths = length_array(train, "source_length"), length_array(train, "target_length")
        figures["length_array_seconds"] = round(time.perf_counter() - started, 3)
        sampler = TokenBudgetBatchSampler(*lengths, args.max_tokens, shuffle=True, seed=args.seed)
        figures["sampler_build_seconds"] = round(time.perf_counter() - started, 2)
        figures["batches"] = len(sampler)
        figures["target_tokens"] = int(lengths[1].sum())
        middle = len(sampler) // 2
        if args.stage == "sampler":
            epoch_start = time.perf_counter()
            batches = sum(1 for _ in sampler)
            figures["epoch_of_batches_seconds"] = round(time.perf_counter() - epoch_start, 2)
            assert batches == len(sampler)
            figures["batch_at_middle"] = next(b for i, b in enumerate(sampler) if i == middle)[:5]
        else:
            from accelerate.data_loader import SkipBatchSampler

            skip_start = time.perf_counter()
            first = next(iter(SkipBatchSampler(sampler, skip_batches=middle)))
            figures["skip_to_middle_seconds"] = round(time.perf_counter() - skip_start, 3)
            straight = next(b for i, b in enumerate(sampler) if i == middle)
            figures["resumed_batch_is_the_straight_runs"] = first == straight
            figures["batch_at_middle"] = first[:5]
    figures["seconds"] = round(time.perf_counter() - started, 2)
    # the largest of the finished worker processes' peaks: an upper bound (a forked worker starts with our pages)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {**figures, "peak_rss_mib": round(peak_rss_mib()), "peak_worker_rss_mib": round(workers)}


def main(argv=None) -> dict:
    args = parse(argv)
    if args.stage == "corpus":
        make_corpus(Path(args.work_dir) / "corpus", args.pairs, args.seed)
        return {}
    if args.stage:
        print(json.dumps(run_stage(args)))
        return {}
    record = MachineRecord()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {"pairs": args.pairs, "num_proc": args.num_proc, "tokenizer_sample": args.tokenizer_sample,
                    "vocab_size": args.vocab_size, "max_tokens": args.max_tokens, "cpus": os.cpu_count()}  # fmt: skip
    forwarded = child_argv(sys.argv[1:] if argv is None else argv)  # the stages take the same options, but --json
    if not (work / "corpus" / "dataset_dict.json").is_file():  # made in a process of its own: this one stays small
        started = time.perf_counter()
        subprocess.run([sys.executable, __file__, *forwarded, "--stage", "corpus"], check=True, capture_output=True)
        report["synthesis_seconds (not part of the preparation)"] = round(time.perf_counter() - started, 1)
    total = 0.0
    for stage in STAGES:
        started = time.perf_counter()
        result = subprocess.run([sys.executable, __file__, *forwarded, "--stage", stage], capture_output=True,
                                text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "true"})  # fmt: skip
        if result.returncode:
            raise SystemExit(f"stage {stage} failed:\n{result.stderr[-3000:]}")
        figures = json.loads(result.stdout.strip().splitlines()[-1])
        figures["process_seconds"] = round(time.perf_counter() - started, 1)  # with imports and process start
        report[stage] = figures
        total += figures["process_seconds"]
        print(f"{stage:15s} {figures['process_seconds']:8.1f} s   peak RSS {figures['peak_rss_mib']:6d} MiB"
              f" (workers {figures['peak_worker_rss_mib']} MiB)", flush=True)  # fmt: skip
    report["preparation_seconds"] = round(total, 1)
    report["peak_rss_mib"] = max(report[s]["peak_rss_mib"] for s in STAGES)
    report["peak_worker_rss_mib"] = max(report[s]["peak_worker_rss_mib"] for s in STAGES)
    return record.report(report, args.json)


if __name__ == "__main__":
    main()
