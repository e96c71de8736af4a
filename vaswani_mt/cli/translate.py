"""Translate a file or standard input, one line per line, in batches (progress bar on stderr).

Streams: reads --chunk_size lines at a time (one at a time from a terminal), writes their translations in input
order as soon as they are done, so memory stays flat on any length of input. Any bytes are accepted: what is not
UTF-8 becomes U+FFFD, with a warning naming the line; lines longer than the model takes are cut, with a warning.

echo "The house is small." | python scripts/translate.py --model outputs/run
python scripts/translate.py --model outputs/run --input text.en > text.de
"""

import argparse
import os
import sys

from vaswani_mt.inference.loading import ModelFolderError, load_for_inference
from vaswani_mt.inference.translate import translate_stream


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="saved model folder or Hub id")
    parser.add_argument("--input", help="text file, one sentence per line (default: standard input)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--chunk_size", type=int, default=None,
                        help="lines read and translated together (default: 16 batches; 1 from a terminal)")  # fmt: skip
    parser.add_argument("--num_beams", type=int, default=None, help="default: the model's (4)")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or (args.chunk_size is not None and args.chunk_size < 1):
        parser.error(f"--batch_size and --chunk_size must be at least 1, got {args.batch_size} and {args.chunk_size}")

    try:
        model, tokenizer = load_for_inference(args.model)
    except ModelFolderError as error:
        sys.exit(f"error: {error}")
    try:
        stream = open(args.input, "rb") if args.input else sys.stdin.buffer
    except OSError as error:
        sys.exit(f"error: cannot read {args.input}: {error.strerror or error}")
    kwargs = {"num_beams": args.num_beams} if args.num_beams else {}
    try:
        with stream:
            translate_stream(
                model, tokenizer, stream, sys.stdout.buffer, args.input or "<stdin>", batch_size=args.batch_size,
                chunk_size=args.chunk_size, progress=True, **kwargs,
            )  # fmt: skip
    except BrokenPipeError:  # the reader stopped early (`| head`): stop quietly, without a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout again at exit
        sys.exit(1)


if __name__ == "__main__":
    main()
