"""Publish a trained model on the Hugging Face Hub: build the exact folder the Hub gets, check it, upload it.

python scripts/push_to_hub.py --model outputs/ding-cpu --repo_id USER/vaswani-mt-small-en-de --dry_run
python scripts/push_to_hub.py --model outputs/ding-cpu --repo_id USER/vaswani-mt-small-en-de
python scripts/push_to_hub.py --model outputs/ding-cpu --repo_id USER/vaswani-mt-small-en-de-marian --native marian

The folder (default: MODEL-hub, or MODEL-hub-marian) holds safetensors weights, the remote code with its auto_map
and translation pipeline, the tokenizer, the generation config and README.md, the model card retargeted to the
repository. Before any upload it must load through the Auto classes with trust_remote_code in a fresh process
without vaswani_mt; --dry_run stops there. --native marian publishes the exact MarianMTModel conversion instead,
which hosted inference can serve without remote code. A failed upload says why, and the folder is kept.
"""

import argparse
import sys

from vaswani_mt.cli import add_overwrite, names_missing_extras, start_command


@names_missing_extras
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model folder written by scripts/train.py (with README.md)")
    parser.add_argument("--repo_id", required=True, help="USER/NAME on the Hub")
    parser.add_argument("--output", help="where to build the folder (default: MODEL-hub or MODEL-hub-marian)")
    parser.add_argument(
        "--native",
        default="vaswani",
        choices=["vaswani", "marian"],
        help="vaswani: our model with its remote code; marian: the exact MarianMTModel conversion",
    )
    parser.add_argument("--dry_run", action="store_true", help="build and check the folder, do not upload")
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the one `hf auth login` saved)")
    parser.add_argument("--private", action="store_true", help="create the Hub repository private")
    add_overwrite(parser)
    args = parser.parse_args(argv)
    start_command()
    from vaswani_mt.hub.publish import HubUploadError, publish

    try:
        publish(
            args.model, args.repo_id, args.output, args.native, args.dry_run, args.token, args.private, args.overwrite
        )
    except (HubUploadError, ValueError, RuntimeError) as error:  # RuntimeError: the folder failed its check
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
