"""Draw a translation's attention, like the paper's appendix figures: encoder self-attention, decoder
self-attention and encoder-decoder attention, one PNG per kind and layer with a panel per head.

python scripts/visualize_attention.py --model outputs/ding-cpu --text "The house is small." --output attention
"""

import argparse
import sys

from vaswani_mt.cli import names_missing_extras, old_name, start_command


@names_missing_extras
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="saved model folder or Hub id")
    parser.add_argument("--text", required=True, help="the source sentence")
    parser.add_argument("--output", default="attention", help="the folder the PNG files go to")
    old_name(parser, "--output_dir", "output")
    parser.add_argument("--num_beams", type=int, default=None, help="beam size (default: the model's)")
    args = parser.parse_args(argv)
    kwargs = {"num_beams": args.num_beams} if args.num_beams else {}
    start_command()
    from vaswani_mt.app.attention_plots import visualize

    try:
        attentions, paths = visualize(args.model, args.text, args.output, **kwargs)
    except ValueError as error:
        sys.exit(f"error: {error}")
    print(f"translation: {attentions.translation}")
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
