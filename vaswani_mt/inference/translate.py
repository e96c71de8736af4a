"""`translate(model, tokenizer, sentences, **options)`: the README's one-call API, one line over the `Translator`
(translator.py), and the output formats the commands write (Marian's n-best lines, `text ||| alignment`).

`options` are `TranslationOptions` fields (options.py), any other `generate()` keyword, and the per-line controls:
`constraints` (a list of terms per sentence; `constraint_order`, "unordered" or "ordered") and `target_prefixes` (a
prefix per sentence, "" for none); `sampling` may also be a `Sampling`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from vaswani_mt.inference.alignments import AlignedTranslation, format_aligned_line
from vaswani_mt.inference.controls import ControlReport
from vaswani_mt.inference.options import Hypothesis, Sampling, TranslationOptions
from vaswani_mt.inference.translator import TranslationInterrupted, Translator

_FIELDS = {f.name for f in dataclasses.fields(TranslationOptions)}


def split_options(keywords: dict) -> tuple[TranslationOptions, dict]:
    """`TranslationOptions` of keyword arguments (the rest go to its `generate_kwargs`), and the per-line data
    (`terms`, `prefixes`) that `Translator.translate` takes: the keyword API of `translate` in one place."""
    keywords = dict(keywords)
    data = {"terms": keywords.pop("constraints", None), "prefixes": keywords.pop("target_prefixes", None)}
    if isinstance(data["terms"], str):  # the order alone: the sentences are fairseq's tabbed lines
        keywords["constraints"], data["terms"] = data["terms"], None
    elif data["terms"] is not None:
        keywords["constraints"] = keywords.pop("constraint_order", None) or "unordered"
    order = keywords.pop("constraint_order", None)
    if order is not None and keywords.get("constraints") is None:
        keywords["constraints"] = order
    sampling = keywords.get("sampling")
    if isinstance(sampling, Sampling):
        keywords.update(sampling=True, seed=sampling.seed, topk=sampling.top_k, topp=sampling.top_p,
                        temperature=sampling.temperature)  # fmt: skip
    elif sampling is None:
        keywords.pop("sampling", None)
    fields = {name: keywords.pop(name) for name in list(keywords) if name in _FIELDS}
    return TranslationOptions(**fields, generate_kwargs=keywords), data


def translate(model, tokenizer, sentences: Sequence[str], *, report: ControlReport | None = None,
              progress: bool = False, **options) -> list:  # fmt: skip
    """The translations of `sentences`, in input order: `Translator(model, tokenizer, options).translate(...)`."""
    options, data = split_options(options)
    return Translator(model, tokenizer, options).translate(sentences, **data, report=report, progress=progress)


def translate_nbest(model, tokenizer, sentences: Sequence[str], nbest: int, **options) -> list[list[Hypothesis]]:
    """`translate` with `nbest`: each sentence's `nbest` best `Hypothesis`es, best first."""
    return translate(model, tokenizer, sentences, nbest=nbest, **options)


def format_nbest(line_id: int, hypotheses: Sequence[Hypothesis]) -> str:
    """Marian's n-best format, one line (ending in "\\n") per hypothesis, best first:
    `ID ||| translation ||| F0= log-probability ||| score` (with alignments, `translation ||| alignment` in its place,
    as Marian writes them)."""
    return "".join(
        f"{line_id} ||| {format_translation(h.text)} ||| F0= {h.log_prob:.6f} ||| {h.score:.6f}\n" for h in hypotheses
    )


def format_translation(translation: str) -> str:
    """A translation as a command writes it: the text, or for an `AlignedTranslation` Marian's
    `text ||| alignment`."""
    return format_aligned_line(translation) if isinstance(translation, AlignedTranslation) else translation


class FormattedOutput(str):
    """An output already as `format_output` writes it (a resumed run's line, read back): written as it is."""


def format_output(output, line_id: int) -> str:
    """One input line's output as the commands write it (ending in "\\n"): a translation, or an n-best list in
    Marian's format with `line_id`."""
    if isinstance(output, FormattedOutput):
        return str(output)
    if isinstance(output, list):
        return format_nbest(line_id, output)
    return f"{format_translation(output)}\n"


__all__ = [
    "ControlReport",
    "FormattedOutput",
    "Hypothesis",
    "Sampling",
    "TranslationInterrupted",
    "TranslationOptions",
    "Translator",
    "format_nbest",
    "format_output",
    "format_translation",
    "split_options",
    "translate",
    "translate_nbest",
]
