"""Average the last K checkpoints of a run (§6.1: 5 for base, 20 for big) into a folder for from_pretrained.

python scripts/average_checkpoints.py --checkpoint_dir outputs/run --last 5 --output outputs/run-avg5
"""

import argparse
import logging
import sys

from vaswani_mt.training.checkpoints import average_checkpoints


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint_dir", required=True, help="folder holding checkpoint-N folders")
    parser.add_argument("--last", type=int, default=5, help="how many of the newest checkpoints to average")
    parser.add_argument("--up_to_step", type=int, default=None, help="only checkpoints of this step or earlier")
    parser.add_argument("--output", required=True, help="folder to write (replaced if it is a model folder)")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error(f"--last must be at least 1, got {args.last}")
    try:
        print(average_checkpoints(args.checkpoint_dir, args.last, args.output, up_to_step=args.up_to_step))
    except (FileNotFoundError, ValueError) as error:  # no checkpoints there, or ones that do not go together
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
