"""The demo web app: `python app.py` (for a Hugging Face Space, this file is the entry point).

The model is the first argument, else VASWANI_MODEL (a folder or a Hub id), else outputs/ding-cpu:
    python app.py outputs/ding-cpu
then open http://127.0.0.1:7860. It listens on this machine only unless told otherwise: `--host 0.0.0.0` (or
GRADIO_SERVER_NAME, which a Space sets) and `--port` (or GRADIO_SERVER_PORT). A folder that is not a loadable model
ends it with one line, `error: ...`, and exit status 1.
"""

import argparse
import os
import sys

from vaswani_mt.cli import add_compute_type, missing_extra, names_missing_extras, start_command


@names_missing_extras
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The vaswani_mt translation demo (Gradio).")
    default = os.environ.get("VASWANI_MODEL", "outputs/ding-cpu")
    parser.add_argument("--model", default=None, help="model folder or Hub id (default: VASWANI_MODEL, else "
                        "outputs/ding-cpu)")  # fmt: skip
    parser.add_argument("positional_model", nargs="?", default=None, help=argparse.SUPPRESS)  # `app.py MODEL`
    parser.add_argument("--host", help="address to listen on (default: GRADIO_SERVER_NAME, else 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: GRADIO_SERVER_PORT, else 7860)")
    add_compute_type(parser)
    args = parser.parse_args(argv)
    missing = missing_extra("gradio", "the demo")  # before the model loads
    if missing:
        sys.exit(missing)
    from vaswani_mt.inference.compute_types import resolve_compute_type

    try:  # before the model loads and anything listens
        compute_type = resolve_compute_type(args.compute_type or "float32")
    except ValueError as error:
        sys.exit(f"error: --compute_type: {error}")
    start_command()
    from vaswani_mt.app.demo import launch
    from vaswani_mt.inference.loading import ModelFolderError

    try:
        launch(args.model or args.positional_model or default, host=args.host, port=args.port,
               compute_type=compute_type)  # fmt: skip
    except ModelFolderError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
