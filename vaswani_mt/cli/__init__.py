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
import time
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
        "intra_threads, the same count): on a busy machine 1 can be several times faster than 2",
    )  # fmt: skip


def add_compile_step(parser: argparse.ArgumentParser) -> None:
    """--compile_step, for the commands that translate with `decoding_options` (translate.py, evaluate.py)."""
    parser.add_argument(
        "--compile_step", choices=("auto", "on", "off"), default="auto",
        help="torch.compile the decoder step with its weights frozen into the graph (inductor; docs/translating.md): "
        "on, off, or auto (default: on for an --input long enough to pay the compile back, one vaswani_mt model, "
        "CPU; else off)",
    )  # fmt: skip


def compile_step_of(args: argparse.Namespace) -> str | None:
    """--compile_step as `TranslationOptions.compile_step` (None: eager): auto by --input's lines, counted up to
    `inference.compiled.COMPILE_FROM_LINES` (standard input, a CTranslate2 folder or an ensemble: eager)."""
    choice = getattr(args, "compile_step", "off")
    if choice != "auto":
        return None if choice == "off" else choice
    from vaswani_mt.inference.compiled import COMPILE_FROM_LINES, auto_compile_step
    from vaswani_mt.inference.loading import is_ctranslate2_folder

    path = getattr(args, "input", None)
    if len(args.model) != 1 or is_ctranslate2_folder(args.model[0]) or not path or not os.path.isfile(path):
        return None
    lines = 0
    with open(path, "rb") as text:
        while lines < COMPILE_FROM_LINES and (block := text.read(1 << 20)):
            lines += block.count(b"\n")
    return auto_compile_step(lines)


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
        "unordered), with its source term (the tag around it wraps the target term)",
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


class CatalogJob:
    """A gettext catalog (`--format po`) as translate.py translates it: read from the input alone, so that every
    process and every rerun has the same lines (`catalogs.CatalogWork`: a stopped run's output is never read as
    input, so `--retranslate` does not refill what it filled); with --output, planned into shards of whole chunks of
    its lines as a text file is (`source`), each shard's translations one line per catalog line in a resumable file
    of its own (`translate`), and the .po written from them once all are done (`write`)."""

    def __init__(self, args: argparse.Namespace):
        from vaswani_mt.inference.catalogs import catalog_language, catalog_work, read_catalog, read_glossary

        self.args = args
        try:
            self.catalog = read_catalog(args.input)
            self.language = catalog_language(self.catalog, args.language, _card_language(args.model[0]))
            self.glossary = read_glossary(args.glossary) if args.glossary else []
            self.work = catalog_work(self.catalog, self.language, retranslate=args.retranslate,
                                     glossary=self.glossary)  # fmt: skip
        except ValueError as error:
            sys.exit(f"error: {error}")
        self.source = self.work.lines
        # What makes the lines besides the options and the input's contents: the entries taken, their terms.
        self.identity = {"--retranslate": args.retranslate, "--glossary's terms": self.glossary}

    def translate(self, translator, output, report, shard, progress: bool) -> int:
        """Translates `shard` of the lines into `output` (a `ResumableOutput`, continued where a stopped run of it
        ended), one line per catalog line; a stop writes what is finished and raises again with `line`."""
        from vaswani_mt.inference.streams import Recorded, write_translations
        from vaswani_mt.inference.translate import FormattedOutput, format_output
        from vaswani_mt.inference.translator import Resume
        from vaswani_mt.system.signals import TranslationInterrupted

        try:
            start, kept = output.resume(translator.options.chunk_lines())
            sink = Recorded(output, report, shard.first, start)
        except ValueError as error:  # another run's files, or another run writes them
            sys.exit(f"error: {error}")
        for line, outcome in sorted(output.outcomes.items()):  # the kept lines', reported as if done now
            report.restore(shard.first + line, outcome)
        first, end = shard.first + start, shard.first + shard.lines  # lines before this run's first; its end
        resume = Resume(first + 1, {shard.first + line: FormattedOutput(text) for line, text in kept.items()})
        terms = self.work.terms[first:end] if self.work.terms is not None else None
        count = None
        try:
            with sink:
                outputs = translator.translate_iterable(self.work.lines[first:end], terms=terms, report=report,
                                                        resume=resume, progress=progress)  # fmt: skip
                count = write_translations(outputs, sink, first + 1)
        except TranslationInterrupted as stop:
            later = {line - shard.first: format_output(result, line - 1) for line, result in stop.later.items()}
            outcomes = {line - shard.first: report.outcome(line) for line in stop.later if report.outcome(line)}
            stop.line = output.stopped(start + getattr(stop, "written", count or 0), later, outcomes)
            raise
        output.finished()
        return start + count

    def write(self, partial: Path, sharded, shards: list) -> None:
        """The .po at `partial`, from the finished `shards` of `sharded` (a `ShardedOutput`): their lines fill the
        entries, but those with a line whose markup could not be put back (its outcome), which stay empty."""
        from vaswani_mt.inference.catalogs import fill_catalog

        outputs, failed = [], set()
        for shard in shards:
            outputs += sharded.path(shard).read_bytes().decode("utf-8").split("\n")[:-1]
            failed |= {shard.first + line for line, outcome in sharded.outcomes(shard).items()
                       if "unrestored" in outcome}  # fmt: skip
        self._summary(fill_catalog(self.catalog, self.work, self.language, outputs, failed), self.args.output)
        self.catalog.save(str(partial))

    def to_stdout(self, options, load_translator, report_controls) -> int:
        """The catalog translated by one process to standard output, written once every entry is done (nothing to
        resume: a stop writes nothing); returns its lines. `load_translator` and `report_controls` are translate.py's
        (given, not imported: translate.py imports this package)."""
        from vaswani_mt.inference.catalogs import translate_catalog
        from vaswani_mt.inference.controls import ControlReport
        from vaswani_mt.system.signals import TranslationInterrupted, interruptible

        report = ControlReport()
        with interruptible():
            translator = load_translator(self.args, options)
        try:
            run = translate_catalog(translator, self.catalog, self.language, retranslate=self.args.retranslate,
                                    report=report, progress=True, glossary=self.glossary)  # fmt: skip
        except TranslationInterrupted as stop:
            stop.line = "interrupted: nothing written to <stdout>"
            raise
        sys.stdout.write(str(self.catalog))
        sys.stdout.flush()
        self._summary(run, "<stdout>")
        report_controls(report, run.lines)
        return run.lines

    @staticmethod
    def _summary(run, output: str) -> None:
        print(f"{output}: {run.filled} entries translated (fuzzy), {run.kept} kept, {len(run.failed)} left empty",
              file=sys.stderr)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# translate.py's shards under `accelerate launch` (translate_shards): the plan every process agrees on, the end.


def agreed_plan(peers, sharded, source: str, translator, world: int) -> list:
    """The shards, planned once by the first process (or read from a stopped run's manifest); every process gets
    them, or the first one's error, in one line."""
    key = "vaswani_mt/plan"
    if peers.rank == 0:
        try:
            options = translator.options  # the default chunk: a short input is cut into a chunk a process
            sharded.plan(source, translator.tokenizer, options.chunk_lines(), world, options.chunk_size is None)
            peers.store.set(key, "")
        except ValueError as error:
            peers.store.set(key, str(error))
            sys.exit(f"error: {error}")
    while not peers.store.check([key]):
        time.sleep(0.2)
    error = peers.store.get(key).decode()
    if error:
        sys.exit(f"error: {error}")
    try:
        return sharded.shards()
    except ValueError as error:
        sys.exit(f"error: {error}")


def end_process(peers, line: str | None, code: int):
    """Ends this process with `line` on stderr: through `os._exit` once the streams are flushed, since a process
    group left open at exit can abort in gloo's teardown and closing it can wait on a lost peer."""
    import logging

    peers.close(failed=code not in (0, None))
    if line:
        print(line, file=sys.stderr)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
