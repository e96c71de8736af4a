#!/usr/bin/env python
"""Translate a file or standard input, one line per line, in batches (progress bar on stderr).

echo "The house is small." | python scripts/translate.py --model outputs/run
python scripts/translate.py --model outputs/run --input text.en > text.de
"""

import argparse
import sys

from vaswani_mt.evaluation import load_for_inference, translate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="saved model folder or Hub id")
    parser.add_argument("--input", help="text file, one sentence per line (default: standard input)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, default=None, help="default: the model's (4)")
    args = parser.parse_args()

    model, tokenizer = load_for_inference(args.model)
    stream = open(args.input, encoding="utf-8") if args.input else sys.stdin
    with stream:
        lines = [line.rstrip("\n") for line in stream]
    kwargs = {"num_beams": args.num_beams} if args.num_beams else {}
    for line in translate(model, tokenizer, lines, batch_size=args.batch_size, progress=True, **kwargs):
        print(line)


if __name__ == "__main__":
    main()
