"""Translate a file or standard input, one line per line, in batches (progress bar on stderr).

Streams: reads --chunk_size lines at a time (one at a time from a terminal), writes their translations in input
order as soon as they are done, so memory stays flat on any length of input. Any bytes are accepted: what is not
UTF-8 becomes U+FFFD, with a warning naming the line; lines longer than the model takes are cut, with a warning.

Decoding options: --nbest K (Marian's n-best format), --sampling (a random translation per line, for
back-translation), --max_tokens N (fairseq's --max-tokens: batches by source tokens; the same translations, faster).

Controls (docs/constraints.md): --constraints {unordered,ordered} reads fairseq's `source<TAB>term<TAB>term` lines,
each term forced into that line's translation; --target_prefix_file F forces line i's translation to start with F's
line i (with an --input file, F's length is checked before anything is translated); --block_file F keeps F's phrases
out of every translation; --disable_unk keeps <unk> out.

SIGINT (Ctrl-C) or SIGTERM writes every line translated so far up to the first one not finished, in order, says in
one line where to rerun from, and exits with status 130 or 143; a second signal ends it at once. With --output F,
the lines go to F.partial until all are done, the finished ones past the first unfinished to F.resume, and the same
command continues where it stopped. Status 1: bad input, or some lines not translated.

echo "The house is small." | python scripts/translate.py --model outputs/run
python scripts/translate.py --model outputs/run --input big.en --output big.de --threads 1   # resumable
python scripts/translate.py --model outputs/run --input text.en --nbest 4 > text.nbest
python scripts/translate.py --model outputs/run --input mono.de --sampling --seed 1 > mono.bt.en
python scripts/translate.py --model outputs/run --input text.en --max_tokens 1200 > text.de
printf 'The house is small.\\tGebäude\\n' | python scripts/translate.py --model outputs/run --constraints unordered
python scripts/translate.py --model outputs/run --input app.pot --output de.po   # gettext: fuzzy entries
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, NamedTuple, NoReturn

import vaswani_mt
from vaswani_mt.cli import (
    CatalogJob,
    add_catalog_options,
    add_compile_step,
    add_compute_type,
    agreed_plan,
    catalog_arguments,
    catalog_format,
    check_compute_type,
    compile_step_of,
    end_process,
    names_missing_extras,
    saved_search,
    start_command,
)
from vaswani_mt.model.constraints_vaswani import ORDERS  # loaded with vaswani_mt itself

if TYPE_CHECKING:
    from vaswani_mt.inference.controls import ControlReport
    from vaswani_mt.inference.options import TranslationOptions
    from vaswani_mt.system.signals import TranslationInterrupted

# --early_stopping's words and the values transformers' `early_stopping` takes (beam_search_vaswani.can_improve).
EARLY_STOPPING = {"never": "never", "true": True, "false": False}


def add_decoding_options(parser: argparse.ArgumentParser, sampling: bool = True) -> None:
    """--length_penalty, --max_tokens, --nbest, the controls (--constraints, --target_prefix_file, --block_file,
    --disable_unk), --compile_step and (with `sampling`) --sampling with --topk, --topp, --temperature, --seed."""
    add_compile_step(parser)
    parser.add_argument(
        "--length_penalty", type=float, default=None, metavar="ALPHA", help="GNMT alpha (default: the model's)"
    )
    parser.add_argument(
        "--early_stopping", choices=tuple(EARLY_STOPPING), default=None,
        help="when a sentence's beam search stops (default: the model's): never, once nothing running can win "
        "(the exact bound); true, once num_beams hypotheses have finished (fairseq's rule); false, once nothing "
        "running can win at its current length (transformers' heuristic)",
    )  # fmt: skip
    parser.add_argument(
        "--constrained_length_penalty", type=float, default=None, metavar="ALPHA",
        help="GNMT alpha of the lines with --constraints (default: the one the model saved, chosen on dev when it "
        "trained; with --length_penalty alone, that one)",
    )  # fmt: skip
    parser.add_argument(
        "--max_tokens",
        type=int,
        default=None,
        metavar="N",
        help="token-budget batches (fairseq's --max-tokens): lines sorted by length, at most N source "
        "tokens per batch counting padding (rows x longest line); a longer line goes alone, with a "
        "warning. Output in input order, the same as with --batch_size, which then only caps rows",
    )
    parser.add_argument(
        "--nbest",
        type=int,
        default=None,
        metavar="K",
        help="the K best translations of each line (K <= the beam size), best first, in Marian's "
        "n-best format: 'ID ||| translation ||| F0= log P(Y|X) ||| score', IDs from 0 in input order, "
        "score the search's (log P / ((5 + |Y|) / 6)^alpha); an empty line gets K lines "
        "'ID |||  ||| F0= 0.000000 ||| 0.000000'",
    )
    parser.add_argument(
        "--constraints",
        choices=ORDERS,
        default=None,
        help="terminology constraints: each input line is 'source<TAB>term<TAB>term...' (fairseq's format) and its "
        "translation contains every term (ordered: in that order), or is the best translation without a term that "
        "cannot fit its length limit, with a warning naming the line; a line without tabs is translated as without "
        "the option; a term written 'source phrase ||| term' also names what it translates (--markup: its tag)",
    )
    parser.add_argument(
        "--target_prefix_file",
        metavar="F",
        help="line i of F is the text the translation of input line i starts with (an empty line: none); the "
        "search goes on after it and its score counts it",
    )
    parser.add_argument("--block_file", metavar="F", help="phrases, one per line, that no translation may contain")
    parser.add_argument("--disable_unk", action="store_true", help="no translation contains <unk>")
    if sampling:
        _add_sampling_options(parser)


def _add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """--sampling with its --topk, --topp, --temperature and --seed."""
    parser.add_argument(
        "--sampling",
        action="store_true",
        help="for back-translation (Edunov et al., 2018): draw one translation per line from the "
        "model's distribution, token by token, instead of searching for the best one",
    )
    parser.add_argument(
        "--topk", type=int, default=None, metavar="K", help="with --sampling: only among the K likeliest tokens"
    )
    parser.add_argument(
        "--topp",
        type=float,
        default=None,
        metavar="P",
        help="with --sampling: only among the fewest tokens whose probability reaches P, in (0, 1]",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        metavar="T",
        help="with --sampling: divide the logits by T > 0 (below 1: closer to greedy search)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="S",
        help="with --sampling (default 1): the same seed gives the same output, whatever the batch "
        "size, --max_tokens or --chunk_size; each line's draws depend on the seed and its position",
    )


def decoding_options(args: argparse.Namespace, **fields) -> TranslationOptions:
    """The `TranslationOptions` of the command's options (their names are its field names, `fields` added), checked
    against the search the first --model folder saved (`saved_search`: its beam, whether it is a CTranslate2
    export) before any model loads; a bad combination ends the program with one line, `error: ...`."""
    from vaswani_mt.inference.loading import is_ctranslate2_folder
    from vaswani_mt.inference.options import OWN_SEARCH, SAMPLING_FIELDS, BackendFacts, TranslationOptions

    names = ("num_beams", "length_penalty", "constrained_length_penalty", "max_tokens", "nbest", "constraints",
             "disable_unk", "batch_size", "chunk_size", "compute_type", "threads", "alignments", "alignment_method",
             "markup", "sampling", *SAMPLING_FIELDS)  # fmt: skip
    values = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    values = {name: value for name, value in values.items() if value is not False}  # store_true flags not given
    values["compile_step"] = compile_step_of(args)
    if getattr(args, "early_stopping", None) is not None:
        values["early_stopping"] = EARLY_STOPPING[args.early_stopping]
    values["batch_size"] = args.batch_size  # None with --max_tokens: no limit on rows
    if args.block_file:
        values["block"] = read_phrases(args.block_file)
    ctranslate2 = is_ctranslate2_folder(args.model[0])
    if ctranslate2 and len(args.model) > 1:
        sys.exit("error: an ensemble (several --model) needs vaswani_mt's own models: a CTranslate2 folder translates "
                 "alone; translate the vaswani_mt folders they came from")  # fmt: skip
    try:
        options = TranslationOptions(**values, **fields)
        search = saved_search(args.model[0])
        if search is not None:
            name = f"the CTranslate2 folder {args.model[0]}" if ctranslate2 else args.model[0]
            facts = BackendFacts(name, search.num_beams, tuple(OWN_SEARCH) if ctranslate2 else ())
            options.check(facts, prefixes=bool(args.target_prefix_file))
    except ValueError as error:
        given = [f"--{name}" for name in SAMPLING_FIELDS if getattr(args, name, None) is not None]
        if given and not getattr(args, "sampling", False):
            sys.exit(f"error: {', '.join(given)} only go{'es' if len(given) == 1 else ''} with --sampling")
        sys.exit(f"error: {error}")
    return options


def starting_options(args: argparse.Namespace) -> TranslationOptions:
    """A command's start once its arguments are parsed: --compute_type checked for this machine, the options
    (`decoding_options`), no library bars. Until the signals are the command's, Ctrl-C ends it in one line."""
    try:
        check_compute_type(args)
        options = decoding_options(args)
        start_command()
    except KeyboardInterrupt:
        print(vaswani_mt.STOPPED_STARTING, file=sys.stderr)
        sys.exit(130)
    return options


def load_translator(args: argparse.Namespace, options: TranslationOptions):
    """The `Translator` of the --model folders (ours, an ensemble, or a CTranslate2 export) with `options`; one line,
    `error: ...`, for a folder that cannot serve or options this model cannot take."""
    from vaswani_mt.inference.translator import Translator

    try:
        return Translator(args.model if len(args.model) > 1 else args.model[0], options=options)
    except ValueError as error:  # ModelFolderError among them
        message = str(error)
        if message.startswith("blocked phrase") and args.block_file:
            message = f"{args.block_file}: {message}"
        sys.exit(f"error: {message}")


def read_phrases(path: str) -> list[str]:
    """The non-empty lines of a UTF-8 file (--block_file), stripped; one line, `error: ...`, where it cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        return [line.strip() for line in data.decode("utf-8").splitlines() if line.strip()]
    except OSError as error:
        sys.exit(f"error: cannot read {path}: {error.strerror or error}")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        sys.exit(f"error: {path}:{line}: bytes that are not UTF-8 ({data[error.start : error.end]!r})")


def report_controls(report: ControlReport, lines: int) -> None:
    """One summary line on stderr for the lines whose controls were not all honoured (each was named already);
    exits with status 1 where a line was not translated or its markup could not be put back."""
    if report.unmet:
        print(f"warning: {len(report.unmet)} of {lines} lines miss a constraint (first: line {min(report.unmet)})",
              file=sys.stderr)  # fmt: skip
    if report.unrestored:
        first = min(report.unrestored)
        print(f"error: {len(report.unrestored)} of {lines} lines written as their source: their markup could not be "
              f"put back (first: line {first}: {report.unrestored[first]})", file=sys.stderr)  # fmt: skip
        if not report.failed:
            sys.exit(1)
    if report.failed:
        sys.exit(f"error: {len(report.failed)} of {lines} lines not translated: bad constraints or target prefixes "
                 f"(first: line {min(report.failed)}: {report.failed[min(report.failed)]})")  # fmt: skip


def check_prefix_lines(source: str | None, prefix_file: str | None) -> None:
    """--target_prefix_file against an --input file, before anything is translated: one line each, else one line,
    `error: ...` (from a pipe, the prefixes are checked as they are read)."""
    from vaswani_mt.inference.streams import count_lines

    if not (source and prefix_file and os.path.isfile(source) and os.path.isfile(prefix_file)):
        return
    try:
        inputs, prefixes = count_lines(source), count_lines(prefix_file)
    except OSError:  # reported where the file is opened
        return
    if inputs != prefixes:
        sys.exit(f"error: {prefix_file} has {prefixes} lines but {source} has {inputs}: give one target prefix per "
                 "input line")  # fmt: skip


def exit_interrupted(stop: TranslationInterrupted, written: int, output: str, first_line: int = 1) -> NoReturn:
    """The end of a command stopped by SIGINT or SIGTERM once the `written` lines translated are in `output`: one line
    on stderr that says how to rerun from there (the input from the next line, numbered as in the whole run), and
    exit status 128 + the signal's number (130, 143)."""
    print(f"interrupted at line {written}: {written} lines written to {output}; rerun with the input from line "
          f"{written + 1} and --first_line {first_line + written}", file=sys.stderr)  # fmt: skip
    sys.exit(128 + stop.signum)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        help="saved model folder or Hub id; several (--model A --model B) translate with their ensemble: the mean "
        "of their probabilities at each step, searched with the first model's search (one vocabulary); or a "
        "CTranslate2 export (vaswani-mt-export --format ctranslate2), searched by CTranslate2 and ranked as ours "
        "(docs/export.md)",
    )
    parser.add_argument("--input", help="text file, one sentence per line (default: standard input); or a gettext "
                        "catalog, .pot or .po (--format)")  # fmt: skip
    add_catalog_options(parser)
    parser.add_argument(
        "--first_line", type=int, default=1, metavar="N",
        help="the number of the input's first line (default 1): a rerun from line N of a stopped run gives n-best "
        "IDs and warnings as the whole run would",
    )  # fmt: skip
    parser.add_argument(
        "--output", default=None,
        help="write the translations to this file (default: standard output); it appears once every line is done, "
        "until then OUTPUT.partial; after Ctrl-C or SIGTERM the same command continues where it stopped",
    )  # fmt: skip
    parser.add_argument(
        "--batch_size",
        type=int,
        default=None,
        help="sentences per batch (default 32, a CTranslate2 folder's 64; with --max_tokens: no limit but the budget)",
    )
    parser.add_argument(
        "--chunk_size",
        "--buffer_size",
        type=int,
        default=None,
        help="lines read, sorted by length and translated together (default: 16 batches, or 1024 "
        "lines with --max_tokens as fairseq-interactive's --buffer-size; 1 from a terminal)",
    )
    parser.add_argument("--num_beams", type=int, default=None, help="beam size (default: the model's)")
    add_decoding_options(parser)
    add_compute_type(parser)
    parser.add_argument(
        "--alignments", choices=("hard", "soft"), default=None,
        help="word alignments, Marian's format after the translation: 'translation ||| 0-0 1-2 ...' (hard: source "
        "word - target word, words split on whitespace, from 0) or per target word the comma-separated "
        "probabilities of the source words (soft); from the cross-attention (--alignment_method)",
    )  # fmt: skip
    parser.add_argument(
        "--alignment_method", default=None, metavar="M",
        help="which attention aligns: mean (all layers and heads), layerK, shift-mean or shift-layerK (shift-att), "
        "supervised (the head a model trained with --alignment_supervision names); default: supervised for such a "
        "model, else mean (measured best by benchmarks/alignments.py)",
    )  # fmt: skip
    parser.add_argument(
        "--markup", choices=("xml", "directives"), default=None,
        help="xml: inline tags (<b>, <a href=...>, <br/>), entities and format directives ({0}, %%s, %%.250s, "
        "%%(name)s) carried through by word alignment (docs/markup.md); a line with broken markup is translated as "
        "plain text, with a warning; directives: the format directives only (no tags or entities)",
    )  # fmt: skip
    return parser


@names_missing_extras
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if catalog_format(args) == "po":
        catalog_arguments(args)
    options = starting_options(args)
    from vaswani_mt.system.signals import TranslationInterrupted, stopping_on_signals

    written = None
    try:
        with stopping_on_signals():
            written = _translate_input(args, options)
    except TranslationInterrupted as stop:  # the lines translated are written; from the stream, it says how many
        if hasattr(stop, "line"):  # --output: where they are, and that the same command continues
            print(stop.line, file=sys.stderr)
        elif written is None and not hasattr(stop, "written"):  # loading: the same line as a stop while importing
            print(vaswani_mt.STOPPED_STARTING, file=sys.stderr)
        elif args.output:  # held to the end: every line is in --output
            print(f"interrupted at the end: all {written} lines written to {args.output}", file=sys.stderr)
        else:
            exit_interrupted(stop, getattr(stop, "written", written), "<stdout>", args.first_line)
        sys.exit(128 + stop.signum)


class Part(NamedTuple):
    """The lines of the input one output holds: `first` lines before them, from byte `offset`, `lines` of them (None:
    to the end)."""

    first: int = 0
    offset: int = 0
    lines: int | None = None


def _translate_input(args: argparse.Namespace, options: TranslationOptions) -> int:
    """What `main` does once the arguments are checked: translates --input (or standard input; a gettext catalog:
    the lines of its entries) to --output (or standard output), sharded where several processes were launched;
    returns how many lines."""
    from vaswani_mt.inference.controls import ControlReport
    from vaswani_mt.system.outputs import ResumableOutput
    from vaswani_mt.system.signals import interruptible

    check_prefix_lines(args.input, args.target_prefix_file)
    job = CatalogJob(args) if catalog_format(args) == "po" else _TextJob(args)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return translate_shards(args, options, job)
    if isinstance(job, CatalogJob):  # to standard output whole, else resumable as (a stopped run's) shards
        return _alone(args, options, job) if args.output else job.to_stdout(options, load_translator, report_controls)
    output = ResumableOutput(args.output, _run_identity(args, options), options.nbest or 1) if args.output else None
    try:
        if output is not None:
            output.check()  # another run's files: refused before the model loads
    except ValueError as error:
        sys.exit(f"error: {error}")
    with interruptible():
        translator = load_translator(args, options)
    report = ControlReport()
    count = translate_part(args, translator, output, report, Part(), progress=True)
    report_controls(report, count)
    return count


class _TextJob(NamedTuple):
    """A text file's shards (translate_shards): planned on its lines, each translated by `translate_part`, joined
    byte for byte (`write` None)."""

    args: argparse.Namespace
    identity: dict = {}
    write: None = None

    @property
    def source(self) -> str:
        return self.args.input

    def translate(self, translator, output, report, shard, progress: bool) -> int:
        part = Part(shard.first, shard.offset, shard.lines)
        return translate_part(self.args, translator, output, report, part, progress)


def _alone(args: argparse.Namespace, options: TranslationOptions, job: CatalogJob) -> int:
    """`job` (a gettext catalog) translated by one process into --output: as one shard, or the shards of a stopped
    run of several processes; resumable as they are."""
    from vaswani_mt.inference.controls import ControlReport
    from vaswani_mt.inference.shards import ShardedOutput
    from vaswani_mt.system.signals import interruptible

    sharded = ShardedOutput(args.output, {**_run_identity(args, options), **job.identity})
    try:
        if sharded.manifest.exists():
            sharded.shards()  # another run's files: refused before the model loads
        with interruptible():
            translator = load_translator(args, options)
        shards = sharded.plan(job.source, translator.tokenizer, options.chunk_lines(), 1)
    except ValueError as error:
        sys.exit(f"error: {error}")
    report = ControlReport()
    count = _translate_shards(job, translator, sharded, shards, report, args.first_line, progress=True)
    sharded.join(shards, job.write)
    report_controls(report, count)
    return count


def _translate_shards(job, translator, sharded, shards: list, report, first_line: int, progress: bool) -> int:
    """Translates `shards` of `job` into their files (those a stopped run finished: what their controls did reported
    as if done now); returns their lines."""
    count = 0
    for shard in shards:
        if sharded.is_done(shard):
            for line, outcome in sorted(sharded.outcomes(shard).items()):
                report.restore(first_line + shard.first - 1 + line, outcome)
        else:
            job.translate(translator, sharded.part(shard), report, shard, progress)
        count += shard.lines
    return count


def translate_part(args: argparse.Namespace, translator, output, report, part: Part, progress: bool) -> int:
    """Translates `part` of --input (or standard input) to `output` (a `ResumableOutput`, continued where a stopped
    run of it ended; None: standard output) and returns its lines; a stop by a signal writes what is finished and
    raises `TranslationInterrupted` again with `line`, the one line saying where it stopped."""
    import contextlib

    from vaswani_mt.inference.streams import LineLimit, Recorded, has_tab, read_text_lines, skip_lines, translate_stream
    from vaswani_mt.inference.translate import FormattedOutput, format_output
    from vaswani_mt.inference.translator import Resume
    from vaswani_mt.system.signals import TranslationInterrupted

    first, start = args.first_line + part.first, 0
    resume = Resume(first)
    if output is not None:
        try:
            start, kept = output.resume(translator.options.chunk_lines())
        except ValueError as error:
            sys.exit(f"error: {error}")
        # Lines this run does not read may hold the tabs of constrained input: then it does not say there are none.
        elsewhere = bool(translator.options.constraints and args.input and (start or part.lines is not None))
        resume = Resume(first + start, {first - 1 + line: FormattedOutput(text) for line, text in kept.items()},
                        elsewhere and has_tab(args.input))  # fmt: skip
        for line, outcome in sorted(output.outcomes.items()):  # the kept lines' controls, reported as if done now
            report.restore(first - 1 + line, outcome)
    try:
        stream = open(args.input, "rb") if args.input else sys.stdin.buffer
        prefix_stream = open(args.target_prefix_file, "rb") if args.target_prefix_file else None
        sink = Recorded(output, report, first - 1, start) if output is not None else sys.stdout.buffer
    except OSError as error:
        sys.exit(f"error: cannot open {error.filename}: {error.strerror or error}")
    except ValueError as error:  # another run writes the output
        sys.exit(f"error: {error}")
    if part.offset:
        stream.seek(part.offset)
    skip_lines(stream, start)  # the whole chunks a stopped run wrote
    if part.lines is not None:
        stream = LineLimit(stream, part.lines - start)
    prefixes = None
    if prefix_stream is not None:
        skip_lines(prefix_stream, part.first + start)
        prefixes = read_text_lines(prefix_stream, args.target_prefix_file, first=resume.first_line)
    count = None
    try:
        with stream, sink if output is not None else contextlib.nullcontext():  # standard output stays open
            count = translate_stream(translator, stream, sink, args.input or "<stdin>", prefixes=prefixes,
                                     report=report, resume=resume, progress=progress)  # fmt: skip
        if prefixes is not None and part.lines is None and next(prefixes, None) is not None:
            sys.exit(f"error: {args.target_prefix_file} has more lines than the input ({count})")
    except TranslationInterrupted as stop:
        if output is None:
            raise
        later = {line - first + 1: format_output(result, line - 1) for line, result in stop.later.items()}
        outcomes = {line - first + 1: report.outcome(line) for line in stop.later if report.outcome(line)}
        # No `written`: the stop came before the stream started (none) or after it ended (all: `count`).
        stop.line = output.stopped(start + getattr(stop, "written", count or 0), later, outcomes)
        raise
    except ValueError as error:  # the prefix file ended before the input
        sys.exit(f"error: {args.target_prefix_file}: {error}")
    except BrokenPipeError:  # the reader stopped early (`| head`): stop quietly, without a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout again at exit
        sys.exit(1)
    if output is not None:
        output.finished()
    return start + count


# ---------------------------------------------------------------------------------------------------------------
# Under `accelerate launch` with several processes, on one machine or many: the first process splits --input into
# shards (inference/shards.py), every process translates the shards `index % processes == rank` into files of its own
# beside --output, and the first joins them in input order once all are done. A rerun of the same command (with any
# number of processes) continues each shard where it stopped; a lost process or machine stops the others, each
# keeping what it finished, with one line that names it. The machines must share --output's folder.

SHARDS_AGAIN = "every finished line is kept: run the same command again to continue"


def translate_shards(args: argparse.Namespace, options: TranslationOptions, job) -> int:
    """Translates this process's shards of --input (`job`: a text file's, or a gettext catalog's) and, in the first
    process, joins them into --output; returns how many lines its shards hold. Its end (an error, a stop, a lost
    peer) is one line and its status."""
    import torch
    from accelerate import PartialState

    from vaswani_mt.inference.controls import ControlReport
    from vaswani_mt.inference.shards import ShardedOutput
    from vaswani_mt.system.peers import Peers
    from vaswani_mt.system.signals import TranslationInterrupted, interruptible

    world = int(os.environ["WORLD_SIZE"])
    if not args.output:
        sys.exit(f"error: {world} processes translate into files: give --output (each writes its shards beside it)")
    if not args.input or not os.path.isfile(args.input):
        given = args.input or "standard input"
        sys.exit(f"error: {world} processes split the input between them: give --input, a file (not {given})")
    from vaswani_mt.training.machines import end_with_launcher

    end_with_launcher()  # a worker whose launcher died would go on alone: killed, it is a lost machine, named
    state = PartialState(cpu=not torch.cuda.is_available())  # this process's GPU, where there are GPUs
    rank, peers = state.process_index, Peers()
    sharded = ShardedOutput(args.output, {**_run_identity(args, options), **job.identity}, options.nbest or 1)
    report = ControlReport()
    peers.start(SHARDS_AGAIN)
    try:  # interruptible while it loads and waits; translating, a signal stops only where nothing is cut
        with interruptible():
            translator = load_translator(args, options)
            shards = agreed_plan(peers, sharded, job.source, translator, world)
        count = _translate_shards(job, translator, sharded, shards[rank::world], report, args.first_line,
                                  progress=os.environ.get("LOCAL_RANK", "0") == "0")  # fmt: skip
        with interruptible():
            peers.mark("translated")
            peers.wait_for("translated")
        if rank == 0:
            sharded.join(shards, job.write)
            peers.mark("joined")
        with interruptible():
            peers.wait_for("joined", [0])
    except TranslationInterrupted as stop:
        line = getattr(stop, "line", f"interrupted before translating: {SHARDS_AGAIN}")
        end_process(peers, peers.lost or line, 1 if peers.lost else 128 + stop.signum)
    except SystemExit as exit:
        failed = isinstance(exit.code, str)
        end_process(peers, exit.code if failed else None, 1 if failed else exit.code)
    peers.close()
    if rank == 0:
        print(f"{args.output}: {sum(s.lines for s in shards)} lines, {len(shards)} shards on {world} processes",
              file=sys.stderr)  # fmt: skip
    report_controls(report, count)
    torch.distributed.destroy_process_group()
    return count


def _run_identity(args: argparse.Namespace, options: TranslationOptions) -> dict:
    """What makes the output of a run, by name: every option; each file of each model its translations depend on
    (weights, configs, tokenizer); the contents of --input and --target_prefix_file, not their names; --first_line.
    A rerun of --output that differs in one is refused in one line that names it (`system.outputs.other_run`)."""
    import dataclasses

    from vaswani_mt.inference.loading import model_files
    from vaswani_mt.system.outputs import file_digest

    identity: dict = {f"--{name}": value for name, value in dataclasses.asdict(options).items()}
    for number, model in enumerate(args.model, 1):
        which = "the model's" if len(args.model) == 1 else f"model {number}'s"
        try:
            identity.update({f"{which} {path.name}": file_digest(path) for path in model_files(model)})
        except (OSError, ValueError) as error:  # ModelFolderError among them
            sys.exit(f"error: {error}")
    for option, path in (("--input", args.input), ("--target_prefix_file", args.target_prefix_file)):
        try:
            identity[f"{option}'s contents"] = file_digest(path) if path and os.path.isfile(path) else path
        except OSError:  # reported where the file is opened
            identity[f"{option}'s contents"] = path
    identity["--first_line"] = args.first_line
    return identity


if __name__ == "__main__":
    main()
