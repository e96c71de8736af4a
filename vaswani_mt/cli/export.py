"""Export a trained model as a native MarianMTModel folder or as a CTranslate2 model.

python scripts/export.py --model outputs/ding-cpu --format marian --output outputs/ding-cpu-marian
python scripts/export.py --model outputs/ding-cpu --format ctranslate2 --output outputs/ding-cpu-ct2
python scripts/export.py --model outputs/ding-cpu --format ctranslate2 --quantization int8 --output ct2-int8

marian: the exact conversion (same greedy tokens) with the tokenizer; transformers loads it without remote code.
ctranslate2: that Marian folder through CTranslate2's converter (float32 unless --quantization), with
tokenizer.json and the model's generation_config.json (its search) beside it. Translating with it, with the
model's beam size and length limit: docs/export.md.
"""

import argparse
import sys

from vaswani_mt.cli import add_overwrite, check_output, missing_extra, names_missing_extras, start_command


@names_missing_extras
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="saved model folder or Hub id")
    parser.add_argument(
        "--format",
        required=True,
        choices=["marian", "ctranslate2"],
        help="marian: the exact MarianMTModel conversion; ctranslate2: a CTranslate2 model (from it)",
    )
    parser.add_argument("--output", required=True, help="folder to write; one that is not empty needs --overwrite")
    add_overwrite(parser)
    parser.add_argument("--quantization", help="ctranslate2 only: int8, int8_float32, float16, bfloat16, ...")
    args = parser.parse_args(argv)
    check_output(args.output, args.overwrite, [args.model])
    missing = missing_extra("ctranslate2", "--format ctranslate2") if args.format == "ctranslate2" else None
    if missing:
        sys.exit(missing)
    start_command()
    from vaswani_mt.export.marian import export_model

    try:
        output = export_model(args.model, args.format, args.output, args.quantization)
    except ValueError as error:
        sys.exit(f"error: {error}")
    print(f"{args.format} model written to {output}")


if __name__ == "__main__":
    main()
