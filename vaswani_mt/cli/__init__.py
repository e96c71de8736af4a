"""The commands (`vaswani-mt-train`, `-translate`, ...): argument parsing only, the work is the library's. They share
option names: `--model` for the model folder read, `--input` for the text read, `--output` for what is written.

Each parses its arguments, and checks what it can without the model, before it imports the library (the modules it
needs are imported in `main`, after `parse_args`): `--help` and a bad option cost no more than `import vaswani_mt`
(whose registration with transformers' Auto classes loads torch), the model's own values read from its folder's
JSON files where a check needs them (`saved_search`). train.py alone parses with the library: its options are
transformers' Seq2SeqTrainingArguments."""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

# The optional packages, each with the extra of pyproject.toml that installs it.
EXTRAS = {"ctranslate2": "ctranslate2", "gradio": "demo", "eflomal": "align", "playwright": "dev"}


def missing_extra(module: str, needed_for: str) -> str | None:
    """The one line, `error: ...`, for a command that needs the optional `module` where it cannot be imported;
    None where it can."""
    try:
        importlib.import_module(module)
    except ImportError:
        return f"error: {needed_for} needs {module}, which is not installed: pip install 'vaswani-mt[{EXTRAS[module]}]'"
    return None


def names_missing_extras(main: Callable) -> Callable:
    """A command's `main` that ends in one line naming the extra to install (`missing_extra`) where an optional
    package of EXTRAS is not installed, instead of a ModuleNotFoundError's traceback."""

    @functools.wraps(main)
    def command(argv: list[str] | None = None):
        try:
            return main(argv)
        except ModuleNotFoundError as error:
            module = (error.name or "").split(".")[0]
            if module not in EXTRAS:
                raise
            sys.exit(missing_extra(module, "this command") or f"error: {error}")

    return command


def old_name(parser: argparse.ArgumentParser, name: str, dest: str) -> None:
    """`name` as a hidden alias of the option that stores into `dest` (a former name, kept for one release)."""
    parser.add_argument(name, dest=dest, help=argparse.SUPPRESS)


def start_command() -> None:
    """What every command does once its arguments are parsed: no library progress bars (`quiet_library_bars`), and
    the objects of the libraries imported so far frozen out of the garbage collector's way (`gc.freeze`). torch's
    and transformers' hundreds of thousands of objects live as long as the process: the collector's full passes, the
    one at exit included, then skip them (a command's exit took about 2 s of a 2-core CPU, 0.3 s frozen). Only in a
    process that is the command: a program that calls `main()` keeps its collector as it was."""
    import vaswani_mt

    quiet_library_bars()
    if vaswani_mt._started_as_a_command():
        gc.freeze()


def quiet_library_bars() -> None:
    """No library progress bars on a command's stderr: transformers' ("Loading weights", "Writing model shards"),
    huggingface_hub's (downloads, uploads) and datasets' ("Map", "Filter", "Saving the dataset", the corpus's
    "tokenizing" maps); they share lines with our warnings and logs. Our own bars (translating, training) stay."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # huggingface_hub's too
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()
    else:  # read when datasets is imported (not here: the commands that never use it would pay for its import)
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


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


def saved_search(model: str) -> SimpleNamespace | None:
    """The beam size a model folder saved (`num_beams` of its generation_config.json, read as JSON), for the checks
    an option can have before the model loads; None for a Hub id, or a folder without a readable one (loading
    reports that; the model's own search is checked once it has loaded)."""
    try:
        values = json.loads((Path(model) / "generation_config.json").read_text(encoding="utf-8"))
        beams = values.get("num_beams", 1)  # transformers' default where the file has none
    except (OSError, ValueError, AttributeError):
        return None
    return SimpleNamespace(num_beams=beams) if type(beams) is int and beams >= 1 else None


def add_compute_type(parser: argparse.ArgumentParser) -> None:
    """--compute_type, CTranslate2's option by its name, and --threads, for every command that loads a model to
    translate."""
    parser.add_argument(
        "--compute_type", default=None, metavar="TYPE",
        help="float32 (default: the saved weights, exact), bfloat16 (matrix products in bf16, where the CPU or GPU "
        "has it natively), int8 (int8 linear layers, CPU), or auto (the fastest measured within 0.1 BLEU of "
        "float32 on this kind of hardware); the search scores in float32 with each",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=None, metavar="N",
        help="CPU threads of the matrix products (CTranslate2's intra_threads; default: torch's, one per core): on a "
        "busy machine 1 can be several times faster than 2",
    )  # fmt: skip


def check_compute_type(args: argparse.Namespace) -> None:
    """--compute_type checked for this machine before any model loads (`inference.compute_types`): a name it does
    not know, or bfloat16 where it is not native, ends the command with one line, `error: ...`."""
    if args.compute_type is None:
        return
    from vaswani_mt.inference.compute_types import COMPUTE_TYPES, resolve_compute_type
    from vaswani_mt.inference.loading import is_ctranslate2_folder

    try:
        if args.model and is_ctranslate2_folder(args.model[0]) and args.compute_type in COMPUTE_TYPES:
            return  # CTranslate2 runs each of them on its own kernels, int8 on a GPU too
        resolve_compute_type(args.compute_type)
    except ValueError as error:
        sys.exit(f"error: --compute_type: {error}")
