#!/usr/bin/env python
"""sacreBLEU of a model on a test set, with the paper's search (beam 4, GNMT alpha 0.6, input + 50).

python scripts/evaluate_model.py --model outputs/run                       # built-in corpus, test split
python scripts/evaluate_model.py --model DIR --dataset wmt14 --dataset_config de-en --source_lang en --target_lang de
python scripts/evaluate_model.py --model DIR --source_file test.en --reference_file test.de
"""

import argparse
import json

from vaswani_mt.data import BUILTIN_CORPUS, load_corpus, read_parallel_text, source_target
from vaswani_mt.evaluation import evaluate_bleu, load_for_inference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="saved model folder or Hub id")
    parser.add_argument("--dataset", default=BUILTIN_CORPUS)
    parser.add_argument("--dataset_config", default=None)
    parser.add_argument("--split", default="test", choices=["train", "validation", "test"])
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--source_file", help="plain text, one sentence per line (with --reference_file)")
    parser.add_argument("--reference_file")
    parser.add_argument("--max_samples", type=int, default=None)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, default=None, help="default: the model's (4)")
    parser.add_argument("--length_penalty", type=float, default=None, help="GNMT alpha; default: the model's (0.6)")
    parser.add_argument("--output", help="also write the translations here")
    args = parser.parse_args()

    if bool(args.source_file) != bool(args.reference_file):
        parser.error("--source_file and --reference_file go together")
    if args.source_file:
        sources, references = map(list, zip(*read_parallel_text(args.source_file, args.reference_file), strict=True))
    else:
        corpus = load_corpus(args.dataset, args.dataset_config, args.source_lang, args.target_lang)
        sources, references = source_target(corpus[args.split], args.source_lang, args.target_lang)
    if args.max_samples:
        sources, references = sources[: args.max_samples], references[: args.max_samples]
    model, tokenizer = load_for_inference(args.model)
    kwargs = {"num_beams": args.num_beams} if args.num_beams else {}
    if args.length_penalty is not None:
        kwargs["length_penalty"] = args.length_penalty
    result = evaluate_bleu(model, tokenizer, sources, references, batch_size=args.batch_size, progress=True, **kwargs)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write("\n".join(result["translations"]) + "\n")
    print(f"sacreBLEU = {result['score']:.2f}  chrF = {result['chrf']:.2f}  ({len(sources)} sentences)")
    print(f"signature: {result['signature']}")
    print(json.dumps({k: v for k, v in result.items() if k != "translations"}))


if __name__ == "__main__":
    main()
