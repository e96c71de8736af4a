"""Average the last K checkpoints of a run (§6.1: 5 for base, 20 for big) into a folder for from_pretrained.

python scripts/average_checkpoints.py --model outputs/run --last 5 --output outputs/run-avg5
"""

import argparse
import logging
import sys

from vaswani_mt.cli import add_overwrite, check_output, names_missing_extras, old_name, start_command


@names_missing_extras
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a run's output folder, holding its checkpoint-N folders")
    old_name(parser, "--checkpoint_dir", "model")
    parser.add_argument("--last", type=int, default=5, help="how many of the newest checkpoints to average")
    parser.add_argument("--up_to_step", type=int, default=None, help="only checkpoints of this step or earlier")
    parser.add_argument("--output", required=True, help="folder to write; one that is not empty needs --overwrite")
    add_overwrite(parser)
    args = parser.parse_args(argv)
    if args.model is None:
        parser.error("the following arguments are required: --model")
    if args.last < 1:
        parser.error(f"--last must be at least 1, got {args.last}")
    check_output(args.output, args.overwrite, [args.model])
    start_command()
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    from vaswani_mt.training.checkpoints import average_checkpoints

    try:
        print(average_checkpoints(args.model, args.last, args.output, up_to_step=args.up_to_step))
    except (FileNotFoundError, ValueError) as error:  # no checkpoints there, or ones that do not go together
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
