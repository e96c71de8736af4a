"""Import a MarianMTModel checkpoint (OPUS-MT: Helsinki-NLP/opus-mt-*) exactly, as a vaswani_mt model folder.

python scripts/import_model.py --model Helsinki-NLP/opus-mt-en-de --output outputs/opus-mt-en-de
python scripts/import_model.py --model path/to/marian-folder --output outputs/imported

The folder holds the weights (the same logits as MarianMTModel), the code, the checkpoint's MarianTokenizer, the
paper's search in generation_config.json (beam 4, GNMT alpha 0.6, |X| + 50) and a card naming the source, its
license and citation. Every command takes it as --model. What the paper's architecture cannot represent (separate
vocabularies, pre-LN, learned positions, ...) is refused in one line: docs/export.md.
"""

import argparse
import sys

from vaswani_mt.cli import add_overwrite, check_output, start_command


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="MarianMTModel folder or Hub id (Helsinki-NLP/opus-mt-en-de)")
    parser.add_argument("--output", required=True, help="folder to write; one that is not empty needs --overwrite")
    add_overwrite(parser)
    args = parser.parse_args(argv)
    check_output(args.output, args.overwrite, [args.model])
    start_command()
    from vaswani_mt.hub.importing import import_model

    try:
        output = import_model(args.model, args.output)
    except ValueError as error:
        sys.exit(f"error: {error}")
    print(f"{args.model} imported into {output}")


if __name__ == "__main__":
    main()
