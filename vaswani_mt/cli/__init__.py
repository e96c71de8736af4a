"""The commands (`vaswani-mt-train`, `-translate`, ...): argument parsing only, the work is the library's. They share
option names: `--model` for the model folder read, `--input` for the text read, `--output` for what is written."""

from __future__ import annotations

import argparse
import sys


def old_name(parser: argparse.ArgumentParser, name: str, dest: str) -> None:
    """`name` as a hidden alias of the option that stores into `dest` (a former name, kept for one release)."""
    parser.add_argument(name, dest=dest, help=argparse.SUPPRESS)


def quiet_library_bars() -> None:
    """No transformers progress bars ("Loading weights", "Writing model shards") on a command's stderr: they share
    lines with our warnings. Our own bars (translating, training) stay."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def check_output(output: str, overwrite: bool, reads: list[str]) -> None:
    """The commands' one rule for the folder they write (`system.folders.check_replaceable`): an `--output` that
    exists and is not empty is replaced only with `--overwrite`, never when it is or holds a folder read; else one
    line, `error: ...`, exit status 1 (publish's), before any model loads."""
    from vaswani_mt.system.folders import check_replaceable

    try:
        check_replaceable(output, overwrite, reads)
    except ValueError as error:
        sys.exit(f"error: {error}")


def add_overwrite(parser: argparse.ArgumentParser) -> None:
    """--overwrite, for every command that writes a folder (`check_output`)."""
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --output (once the new folder "
                        "is whole: a failed run leaves it as it was)")  # fmt: skip
