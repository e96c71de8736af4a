"""sacreBLEU, chrF and the paper's tokenized compound-split BLEU of a model on a test set, with the model's search
(its generation_config.json: beam size, GNMT alpha, input + b); or, with --hypotheses, of translations already
made (no model loaded).

python scripts/evaluate_model.py --model outputs/run                       # built-in corpus, test split
python scripts/evaluate_model.py --model DIR --dataset wmt14 --dataset_config de-en --source_lang en --target_lang de
python scripts/evaluate_model.py --model DIR --input test.en --reference_file test.de
python scripts/evaluate_model.py --hypotheses out.de --references test.de  # score existing output
python scripts/evaluate_model.py --model DIR --max_tokens 1200               # token-budget batches, same scores
python scripts/evaluate_model.py --model DIR --nbest 4 --nbest_file test.nbest  # also the 4-best lists
python scripts/evaluate_model.py --model DIR --input terms.tsv --reference_file terms.de --constraints unordered

SIGINT (Ctrl-C) or SIGTERM while translating writes the lines translated so far, in order, to OUTPUT.partial (and
NBEST_FILE.partial), leaves --output and --nbest_file as they were, says so in one line and exits with status 130 or
143, without scores; a second signal ends it at once.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from vaswani_mt.cli import add_compute_type, names_missing_extras, old_name
from vaswani_mt.cli.translate import (
    add_decoding_options,
    load_translator,
    report_controls,
    starting_options,
)


def read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 file, split at "\\n" only (as sacreBLEU and multi-bleu.perl read them); empty lines kept."""
    try:
        data = Path(path).read_bytes()
        text = data.decode("utf-8")
    except OSError as error:
        sys.exit(f"error: cannot read {path}: {error.strerror or error}")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        sys.exit(f"error: {path}:{line}: bytes that are not UTF-8 ({data[error.start : error.end]!r})")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


@names_missing_extras
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        action="append",
        help="saved model folder or Hub id; several (--model A --model B) translate with their ensemble: the mean "
        "of their probabilities at each step, searched with the first model's search (one vocabulary); or a "
        "CTranslate2 export (vaswani-mt-export --format ctranslate2), searched by CTranslate2 and ranked as ours "
        "(docs/export.md)",
    )
    parser.add_argument("--hypotheses", help="score-only mode: translations, one per line (with --references)")
    parser.add_argument("--references", help="score-only mode: references, line by line with --hypotheses")
    parser.add_argument("--dataset", default=None, help="a corpus as --dataset of train.py (default: the built-in one)")
    parser.add_argument("--dataset_config", default=None, help="the Hub dataset's configuration (e.g. de-en)")
    parser.add_argument("--split", default="test", choices=["train", "validation", "test"], help="the split scored")
    parser.add_argument("--source_lang", default="en", help="the source language's key in the corpus")
    parser.add_argument("--target_lang", default="de", help="also the Moses tokenizer's language (compound-split)")
    parser.add_argument("--input", dest="source_file", help="plain text, one sentence per line (with --reference_file)")
    old_name(parser, "--source_file", "source_file")
    parser.add_argument("--reference_file", help="the references of --input, line by line")
    parser.add_argument("--max_samples", type=int, default=None, help="score only the first N sentences")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="default 32, a CTranslate2 folder's 64; with --max_tokens: no limit")  # fmt: skip
    parser.add_argument("--num_beams", type=int, default=None, help="beam size (default: the model's)")
    parser.add_argument("--output", help="also write the translations here")
    add_decoding_options(parser, sampling=False)
    add_compute_type(parser)
    parser.add_argument("--nbest_file", help="with --nbest: write the n-best lists here (the best one is scored)")
    args = parser.parse_args(argv)
    if bool(args.nbest) != bool(args.nbest_file):
        sys.exit("error: --nbest and --nbest_file go together")

    if bool(args.hypotheses) != bool(args.references):
        parser.error("--hypotheses and --references go together")
    if bool(args.model) == bool(args.hypotheses):
        parser.error("give either --model (translate, then score) or --hypotheses with --references (score only)")
    if args.hypotheses:
        _score_only(args)
        return

    if bool(args.source_file) != bool(args.reference_file):
        parser.error("--input and --reference_file go together")
    options = starting_options(args)
    from vaswani_mt.inference.controls import ControlReport
    from vaswani_mt.system.signals import TranslationInterrupted, interruptible, stopping_on_signals

    outputs = " and ".join(path for path in (args.output, args.nbest_file) if path)
    translated = 0
    try:
        with stopping_on_signals():
            with interruptible():  # nothing is lost before translating
                translator, sources, references, controls = _load(args, options)
            control_report = ControlReport()
            translations = _translate(args, translator, sources, controls, control_report)
            translated = len(translations)
            with interruptible():
                from vaswani_mt.evaluation.metrics import score_translations

                result = score_translations(translations, references, args.target_lang)
    except TranslationInterrupted as stop:  # no scores for a partial set
        if not hasattr(stop, "written") and translated:
            where = f"written to {outputs}" if outputs else "not kept (no --output)"
            print(f"interrupted while scoring: all {translated} translations {where}; no scores", file=sys.stderr)
        elif not outputs:
            written = getattr(stop, "written", 0)
            print(f"interrupted at line {written}: {written} lines translated, not kept (no --output); no scores",
                  file=sys.stderr)  # fmt: skip
        else:
            written = getattr(stop, "written", 0)
            partial = " and ".join(f"{path}.partial" for path in (args.output, args.nbest_file) if path)
            print(f"interrupted at line {written}: {written} lines translated, written to {partial} ({outputs} "
                  "left as they were); no scores", file=sys.stderr)  # fmt: skip
        sys.exit(128 + stop.signum)
    report(result, len(sources))
    report_controls(control_report, len(sources))


def _score_only(args: argparse.Namespace) -> None:
    """--hypotheses F --references F: scores the two files, line by line, without a model."""
    hypotheses, references = read_lines(args.hypotheses), read_lines(args.references)
    if len(hypotheses) != len(references):
        sys.exit(
            f"error: {args.hypotheses} has {len(hypotheses)} lines but {args.references} has {len(references)}: "
            "the files are not aligned"
        )
    if not hypotheses:
        sys.exit(f"error: {args.hypotheses}: no sentences to score")
    if args.max_samples:
        hypotheses, references = hypotheses[: args.max_samples], references[: args.max_samples]
    from vaswani_mt.evaluation.metrics import score_translations

    report(score_translations(hypotheses, references, args.target_lang), len(references))


def _load(args: argparse.Namespace, options) -> tuple:
    """The translator, the sources and references, and the per-line controls (`terms`, `prefixes`); one line,
    `error: ...`, for a folder that cannot be served, options it cannot take or a bad test set."""
    from vaswani_mt.data.corpus import BUILTIN_CORPUS, DataError, load_corpus, read_parallel_text, source_target
    from vaswani_mt.inference.controls import split_constrained_line, warn_no_tabs

    translator = load_translator(args, options)  # first: a folder that cannot serve is reported before a corpus
    order = options.constraints
    try:  # a missing or unreadable file, bad bytes, files of different lengths: one line naming it
        if args.source_file:
            # With constraints a source line is `source<TAB>term...`: read unstripped, or "\tterm" would lose its tab
            pairs = read_parallel_text(args.source_file, args.reference_file, strip_source=not order)
            sources, references = [p[0] for p in pairs], [p[1] for p in pairs]
        else:
            dataset = args.dataset or BUILTIN_CORPUS
            corpus = load_corpus(dataset, args.dataset_config, args.source_lang, args.target_lang)
            sources, references = source_target(corpus[args.split], args.source_lang, args.target_lang)
    except DataError as error:
        sys.exit(f"error: {error}")
    if not sources:
        sys.exit(f"error: {args.source_file or args.split}: no sentences to score")
    if args.max_samples:
        sources, references = sources[: args.max_samples], references[: args.max_samples]
    controls = {}
    if order:  # fairseq's constrained input: source<TAB>term<TAB>term
        if not any("\t" in source for source in sources):
            warn_no_tabs(len(sources))
        sources, terms = map(list, zip(*map(split_constrained_line, sources), strict=True))
        sources, controls["terms"] = [s.strip() for s in sources], [[t.strip() for t in line] for line in terms]
    if args.target_prefix_file:
        prefixes = read_lines(args.target_prefix_file)
        if len(prefixes) != len(sources):
            sys.exit(f"error: {args.target_prefix_file} has {len(prefixes)} lines for {len(sources)} sources")
        controls["prefixes"] = prefixes
    return translator, sources, references, controls


def _translate(args: argparse.Namespace, translator, sources: list[str], controls: dict, report) -> list[str]:
    """The translations of `sources`, written to --output (and the n-best lists to --nbest_file). Stopped by a
    signal, it writes those of the lines translated so far, and raises `TranslationInterrupted` with `written`."""
    from vaswani_mt.system.signals import TranslationInterrupted, interruptible

    try:
        with interruptible():
            outputs = translator.translate(sources, **controls, report=report, progress=True)
    except TranslationInterrupted as stop:  # the lines done go beside the files, which stay as they were
        stop.written = len(_write_translations(args, stop.done, ".partial"))
        raise
    return _write_translations(args, outputs)


def _write_translations(args: argparse.Namespace, outputs: list, suffix: str = "") -> list[str]:
    """Writes --output and --nbest_file (where given, their names + `suffix`) from `outputs` (translations, or
    n-best lists), each file whole before it replaces what was there; returns the translations (each list's best)."""
    from vaswani_mt.inference.translate import format_output

    nbest = bool(outputs) and isinstance(outputs[0], list)
    translations = [hypotheses[0].text for hypotheses in outputs] if nbest else outputs
    if args.nbest_file:
        text = "".join(format_output(hypotheses, i) for i, hypotheses in enumerate(outputs))
        _write_whole(args.nbest_file + suffix, text)
    if args.output:
        _write_whole(args.output + suffix, "".join(f"{translation}\n" for translation in translations))
    return translations


def _write_whole(path: str, text: str) -> None:
    """`text` into `path` through a temporary file beside it: what was there stays until the new file is whole."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(partial, path)


def report(result: dict, sentences: int) -> None:
    from vaswani_mt.evaluation.metrics import COMPOUND_SPLIT_LABEL

    print(f"sacreBLEU = {result['score']:.2f}  chrF = {result['chrf']:.2f}  ({sentences} sentences)")
    print(f"signature: {result['signature']}")
    print(f"{COMPOUND_SPLIT_LABEL} = {result['compound_split_bleu']:.2f}  (the paper's scoring; not sacreBLEU)")
    print(f"signature: {result['compound_split_signature']}")
    print(json.dumps({k: v for k, v in result.items() if k != "translations"}))


if __name__ == "__main__":
    main()
