"""BLEU: sacreBLEU through `evaluate`, the paper's own scoring (tokenized BLEU with compound splitting) beside it,
the perplexity of references under teacher forcing, and a model's test BLEU with the paper's search (§6.1).

The sacreBLEU metric is an `evaluate.Metric` defined here, as `evaluate.load("sacrebleu")` downloads its script from
the Hub: the same computation and signature, offline.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence

import datasets
import evaluate
import sacrebleu
import torch

from vaswani_mt.inference.translate import translate

logger = logging.getLogger(__name__)


class SacreBLEU(evaluate.Metric):
    """Corpus BLEU with sacreBLEU's defaults (13a tokenisation, exp smoothing), one reference per sentence."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="sacreBLEU corpus BLEU (Post, 2018)",
            citation="@inproceedings{post-2018-call, title={A Call for Clarity in Reporting {BLEU} Scores}}",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references):
        bleu = sacrebleu.metrics.BLEU()
        streams = [list(stream) for stream in zip(*references, strict=True)]
        result = bleu.corpus_score(list(predictions), streams)
        chrf = sacrebleu.metrics.CHRF()
        return {
            "score": result.score,
            "signature": str(bleu.get_signature()),
            "bp": result.bp,
            "precisions": result.precisions,
            "sys_len": result.sys_len,
            "ref_len": result.ref_len,
            "chrf": chrf.corpus_score(list(predictions), streams).score,
        }


def bleu(predictions: Sequence[str], references: Sequence[str]) -> dict:
    """sacreBLEU of `predictions` against one reference each; `score`, `signature`, `chrf` and the details."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} translations but {len(references)} references")
    return SacreBLEU().compute(predictions=list(predictions), references=[[r] for r in references])


COMPOUND_SPLIT_LABEL = "tokenized BLEU, compound-split (tensor2tensor get_ende_bleu.sh)"
# perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' reads bytes: its \S is anything but ASCII whitespace, as here with
# re.ASCII. Both match left to right without overlap: "a-b-c" becomes "a ##AT##-##AT## b-c" (the match took the b).
_COMPOUND = re.compile(r"(\S)-(\S)", re.ASCII)


@functools.cache
def _moses_tokenizer(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


def compound_split(text: str, lang: str = "de") -> str:
    """One line as tensor2tensor's `get_ende_bleu.sh` gives it to `multi-bleu.perl`: Moses `tokenizer.perl -l LANG`
    with its default escaping (`&` -> `&amp;`, `"` -> `&quot;`, `'` -> `&apos;`, `<`, `>`, `|`, `[`, `]`), then
    every `X-Y` compound as `X ##AT##-##AT## Y`. sacremoses ports tokenizer.perl as it was before November 2018 (a
    sentence-final `Art.` or `5.` stays whole), so as in 2017: it gives tokenizer.perl's lines of December 2016."""
    tokenized = _moses_tokenizer(lang).tokenize(text, escape=True, return_str=True)
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def compound_split_bleu(predictions: Sequence[str], references: Sequence[str], lang: str = "de") -> dict:
    """The paper's BLEU (tensor2tensor's `get_ende_bleu.sh`): both sides through `compound_split`, then
    `multi-bleu.perl`'s corpus BLEU over whitespace tokens (case-sensitive, n = 1-4, no smoothing), computed by
    sacreBLEU with `tokenize="none"`; not comparable with sacreBLEU, which reads lower. The script as it stood when
    the paper appeared (June 2017, without the unicode punctuation step added in 2018). Returns `score`, `label`,
    `signature`, `bp`, `precisions`, `sys_len`, `ref_len` and the split lines (`hypotheses`, `references`).
    """
    import sacremoses

    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} translations but {len(references)} references")
    hypotheses = [compound_split(text, lang) for text in predictions]
    split_references = [compound_split(text, lang) for text in references]
    metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    result = metric.corpus_score(hypotheses, [split_references])
    return {
        "score": result.score,
        "label": COMPOUND_SPLIT_LABEL,
        "signature": f"moses:{lang}|escape:yes|compound:##AT##|sacremoses:{sacremoses.__version__}|"
        f"{metric.get_signature()}",
        "bp": result.bp,
        "precisions": result.precisions,
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
        "hypotheses": hypotheses,
        "references": split_references,
    }


def score_translations(predictions: Sequence[str], references: Sequence[str], target_lang: str = "de") -> dict:
    """`bleu` (sacreBLEU, chrF) plus the paper's compound-split BLEU as `compound_split_bleu` with its
    `compound_split_signature`."""
    scores = bleu(predictions, references)
    paper = compound_split_bleu(predictions, references, target_lang)
    return {**scores, "compound_split_bleu": paper["score"], "compound_split_signature": paper["signature"]}


@torch.no_grad()
def token_nll(model, tokenizer, sources: Sequence[str], references: Sequence[str], batch_size: int = 64) -> float:
    """Mean negative log-likelihood (nats per target token, `</s>` included, no label smoothing) of `references`
    given `sources` under teacher forcing; `exp` of it is the perplexity. Works for any seq2seq model whose
    forward builds its decoder inputs from `labels` (ours, MarianMTModel)."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(sources), batch_size):
        batch = tokenizer(
            list(sources[start : start + batch_size]),
            text_target=list(references[start : start + batch_size]),
            padding=True,
            return_tensors="pt",
        ).to(model.device)
        labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).logits
        total += float(
            torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")
        )
        count += int(labels.ne(-100).sum())
    return total / max(count, 1)


def evaluate_bleu(
    model, tokenizer, sources: Sequence[str], references: Sequence[str], *, target_lang: str = "de", **kwargs
) -> dict:
    """Translates `sources` and scores them against `references` (`score_translations`: sacreBLEU, chrF and the
    compound-split BLEU, whose Moses tokenizer takes `target_lang`); the result also holds the `translations`."""
    translations = translate(model, tokenizer, sources, **kwargs)
    return {**score_translations(translations, references, target_lang), "translations": translations}


__all__ = [
    "COMPOUND_SPLIT_LABEL",
    "SacreBLEU",
    "bleu",
    "compound_split",
    "compound_split_bleu",
    "evaluate_bleu",
    "score_translations",
    "token_nll",
]
