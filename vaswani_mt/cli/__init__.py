"""The commands (`vaswani-mt-train`, `-translate`, ...): argument parsing only, the work is the library's. They share
option names: `--model` for the model folder read, `--input` for the text read, `--output` for what is written."""

from __future__ import annotations

import argparse


def old_name(parser: argparse.ArgumentParser, name: str, dest: str) -> None:
    """`name` as a hidden alias of the option that stores into `dest` (a former name, kept for one release)."""
    parser.add_argument(name, dest=dest, help=argparse.SUPPRESS)


def quiet_library_bars() -> None:
    """No transformers progress bars ("Loading weights", "Writing model shards") on a command's stderr: they share
    lines with our warnings. Our own bars (translating, training) stay."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
