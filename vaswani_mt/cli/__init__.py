"""The commands (`vaswani-mt-train`, `-translate`, ...): argument parsing only, the work is the library's. They share
option names: `--model` for the model folder read, `--input` for the text read, `--output` for what is written."""

from __future__ import annotations

import argparse


def old_name(parser: argparse.ArgumentParser, name: str, dest: str) -> None:
    """`name` as a hidden alias of the option that stores into `dest` (a former name, kept for one release)."""
    parser.add_argument(name, dest=dest, help=argparse.SUPPRESS)
