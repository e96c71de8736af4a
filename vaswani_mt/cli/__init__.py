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
        "float32 on this kind of hardware); the search scores in float32 with each. A CTranslate2 folder takes "
        "CTranslate2's names (default: the type it was exported in; int8_float32, int8_bfloat16, float16, ...)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=None, metavar="N",
        help="CPU threads of the matrix products (default: torch's, one per core; a CTranslate2 folder: its "
        "intra_threads, default `THREADS` in inference/ctranslate2.py): on a busy machine 1 can be several times "
        "faster than 2",
    )  # fmt: skip


def check_compute_type(args: argparse.Namespace) -> None:
    """--compute_type checked for this machine before any model loads (`inference.compute_types`): a name it does
    not know, or bfloat16 where it is not native, ends the command with one line, `error: ...`."""
    if args.compute_type is None:
        return
    from vaswani_mt.inference.compute_types import resolve_compute_type
    from vaswani_mt.inference.loading import is_ctranslate2_folder
    from vaswani_mt.inference.options import CTRANSLATE2_COMPUTE_TYPES

    try:
        if args.model and is_ctranslate2_folder(args.model[0]):  # CTranslate2's names, on its own kernels
            if args.compute_type not in CTRANSLATE2_COMPUTE_TYPES:
                raise ValueError(f"unknown compute type {args.compute_type!r} for a CTranslate2 folder: use "
                                 f"{', '.join(CTRANSLATE2_COMPUTE_TYPES)}")  # fmt: skip
            return
        resolve_compute_type(args.compute_type)
    except ValueError as error:
        sys.exit(f"error: --compute_type: {error}")


# ---------------------------------------------------------------------------------------------------------------
# translate.py's gettext catalogs (`--input app.pot --output de.po`, inference/catalogs.py): its options and its run.

CATALOG_SUFFIXES = (".po", ".pot")


def add_catalog_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", choices=("text", "po"), default=None,
        help="the input's format: text (one sentence per line) or po, a gettext catalog (.po or .pot) translated "
        "entry by entry into a .po, its format directives kept and the machine translations marked fuzzy (default: "
        "po for an --input ending in .po or .pot, else text)",
    )  # fmt: skip
    parser.add_argument(
        "--language", default=None, metavar="LL",
        help="a catalog's target language, for its Language and Plural-Forms headers (default: the catalog's "
        "Language, else the model card's target language)",
    )  # fmt: skip
    parser.add_argument(
        "--glossary", default=None, metavar="F",
        help="a catalog's terms: F's lines are 'source term<TAB>target term'; each msgid line that has a source "
        "term (a whole word or phrase, any case) gets its target term as a constraint (--constraints, default "
        "unordered)",
    )  # fmt: skip
    parser.add_argument(
        "--retranslate", action="store_true",
        help="a catalog's fuzzy entries are translated again too (default: only the empty ones; reviewed ones are "
        "always kept)",
    )  # fmt: skip


def catalog_format(args: argparse.Namespace) -> str:
    """ "po" or "text": --format, else by --input's extension."""
    if args.format:
        return args.format
    return "po" if args.input and Path(args.input).suffix.lower() in CATALOG_SUFFIXES else "text"


def catalog_arguments(args: argparse.Namespace) -> None:
    """A catalog's arguments checked before anything loads (one line, `error: ...`), and --markup set: a catalog's
    format directives are always kept (`directives`, or `xml` where given)."""
    if not args.input:
        sys.exit("error: --format po reads a catalog file: give --input (a .pot or .po)")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.exit("error: a gettext catalog is translated by one process: run it without accelerate launch")
    refused = [name for name in ("target_prefix_file", "nbest", "alignments") if getattr(args, name)]
    if refused:
        sys.exit(f"error: --{refused[0]} does not go with a gettext catalog (--format po)")
    if args.constraints and not args.glossary:
        sys.exit("error: a gettext catalog's terms come from --glossary (its msgids have no tabs): give --glossary F")
    if args.glossary:
        args.constraints = args.constraints or "unordered"
    args.markup = args.markup or "directives"


def _card_language(model: str) -> list[str]:
    """The model card's target language (`language: [source, target]` in the folder's README.md), if any."""
    from vaswani_mt.hub.card import split_card

    try:
        metadata, _ = split_card((Path(model) / "README.md").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    languages = metadata.get("language") if isinstance(metadata, dict) else None
    return [str(languages[1])] if isinstance(languages, list) and len(languages) == 2 else []


def translate_catalog_file(args: argparse.Namespace, options, load_translator, report_controls) -> None:
    """Translates the catalog --input into --output (or standard output); what cannot be done is one line, `error:
    ...`. The output appears whole once every entry is done (OUTPUT.partial until then). A stop by a signal leaves
    the entries finished in OUTPUT.partial, and the same command continues from there (only empty msgstrs are
    filled); to standard output it writes nothing. `load_translator` and `report_controls` are translate.py's (given,
    not imported: translate.py imports this package)."""
    from vaswani_mt.inference.catalogs import catalog_language, read_catalog, read_glossary, translate_catalog
    from vaswani_mt.inference.controls import ControlReport
    from vaswani_mt.system.signals import TranslationInterrupted, interruptible

    partial = f"{args.output}.partial" if args.output else None
    try:
        catalog = _continued(read_catalog(args.input), partial, read_catalog)
        language = catalog_language(catalog, args.language, _card_language(args.model[0]))
        glossary = read_glossary(args.glossary) if args.glossary else ()
    except ValueError as error:
        sys.exit(f"error: {error}")
    report = ControlReport()
    try:
        with interruptible():
            translator = load_translator(args, options)
        run = translate_catalog(translator, catalog, language, retranslate=args.retranslate, report=report,
                                progress=True, glossary=glossary)  # fmt: skip
    except TranslationInterrupted as stop:
        run = getattr(stop, "run", None)
        if partial and run is not None:
            catalog.save(partial)
            print(f"interrupted: {run.filled} entries written to {partial}; run the same command again to continue",
                  file=sys.stderr)  # fmt: skip
        else:
            print(f"interrupted: nothing written to {args.output or '<stdout>'}", file=sys.stderr)
        sys.exit(128 + stop.signum)
    except ValueError as error:
        sys.exit(f"error: {error}")
    if partial:
        catalog.save(partial)
        os.replace(partial, args.output)
    else:
        sys.stdout.write(str(catalog))
        sys.stdout.flush()
    print(f"{args.output or '<stdout>'}: {run.filled} entries translated (fuzzy), {run.kept} kept, "
          f"{len(run.failed)} left empty", file=sys.stderr)  # fmt: skip
    report_controls(report, run.lines)


def _continued(catalog, partial: str | None, read):
    """The catalog to fill: `partial`, a stopped run's output, where it holds the same entries as `catalog` (the
    input), else `catalog`."""
    if not partial or not os.path.isfile(partial):
        return catalog
    kept = read(partial)

    def keys(entries) -> list:
        return [(e.msgctxt, e.msgid, e.msgid_plural) for e in entries if not e.obsolete]

    if keys(kept) != keys(catalog):
        print(f"warning: {partial} holds other entries than the input: started over", file=sys.stderr)
        return catalog
    print(f"continuing {partial}", file=sys.stderr)
    return kept
