"""Translation and BLEU: batched `generate()` with the paper's defaults (§6.1), sacreBLEU through `evaluate`.

`evaluate.load("sacrebleu")` fetches its script from the Hugging Face Hub, which is not reachable offline, so the
metric is defined here as an `evaluate.Metric` around the sacreBLEU library: the same computation and the same
signature string, with no download.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import datasets
import evaluate
import sacrebleu
import torch

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


@torch.no_grad()
def translate(
    model,
    tokenizer,
    sentences: Sequence[str],
    batch_size: int = 32,
    progress: bool = False,
    max_source_tokens: int | None = None,
    **generate_kwargs,
) -> list[str]:
    """Translates `sentences` in batches of similar length (order preserved) with `model.generate`.

    Without `generate_kwargs` this is the paper's search (§6.1): beam 4, GNMT alpha 0.6, input length + 50. Empty
    lines stay empty; a source longer than `max_source_tokens` (default: `config.max_position_embeddings`) is cut
    with a warning; characters outside the vocabulary are named in a warning (the translation pipeline's rules).
    """
    from .pipeline_vaswani import default_max_source_tokens, encode_source

    limit = max_source_tokens or default_max_source_tokens(model, tokenizer)
    model.eval()
    results: list[str] = [""] * len(sentences)
    blank = [i for i, sentence in enumerate(sentences) if not sentence.strip()]
    if blank:  # nothing to translate: the line stays empty, so output lines still match input lines
        logger.warning("%d empty or whitespace-only lines left empty (first: line %d)", len(blank), blank[0] + 1)
    order = sorted(
        (i for i, sentence in enumerate(sentences) if sentence.strip()), key=lambda i: len(sentences[i]), reverse=True
    )
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(order), desc="translating", unit="sent", file=sys.stderr)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        encoded = [encode_source(tokenizer, sentences[i], limit) for i in chunk]
        batch = tokenizer.pad({"input_ids": encoded}, return_tensors="pt").to(model.device)
        output = model.generate(**batch, **generate_kwargs)
        for i, text in zip(chunk, tokenizer.batch_decode(output, skip_special_tokens=True), strict=True):
            results[i] = text.strip()
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return results


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


def load_for_inference(model: str, device: str | None = None, attn_implementation: str | None = None):
    """A saved vaswani_mt model (folder or Hub id) and its tokenizer, in eval mode on `device` (default: GPU if
    there is one). Anything else gets an error that says what the folder is. `attn_implementation="eager"` is
    what `output_attentions` needs."""
    from pathlib import Path

    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

    import vaswani_mt  # noqa: F401 - registers the Auto classes

    path = Path(model)
    if path.exists() and not Path(model, "config.json").is_file():
        raise ValueError(f"{model} is not a model folder: it has no config.json")
    if not path.exists() and (path.is_absolute() or model.startswith((".", "~")) or len(path.parts) != 2
                              or path.parent.is_dir()):  # fmt: skip
        raise ValueError(f"{model}: no such folder (and not a Hub id of the form USER/NAME)")
    try:
        model_type = AutoConfig.from_pretrained(model).model_type
    except OSError as error:
        raise ValueError(f"{model} is not a folder here, and loading it from the Hub failed: {error}") from error
    if model_type != "vaswani_mt":
        raise ValueError(f"{model} holds a {model_type!r} model, not a vaswani_mt one")
    if Path(model).is_dir() and not Path(model, "tokenizer.json").is_file():
        raise ValueError(f"{model} has no tokenizer.json: save the tokenizer next to the model")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    options = {"attn_implementation": attn_implementation} if attn_implementation else {}
    loaded = AutoModelForSeq2SeqLM.from_pretrained(model, **options).to(device).eval()
    return loaded, AutoTokenizer.from_pretrained(model)


def evaluate_bleu(model, tokenizer, sources: Sequence[str], references: Sequence[str], **kwargs) -> dict:
    """Translates `sources` and scores them against `references`; the result also holds the `translations`."""
    translations = translate(model, tokenizer, sources, **kwargs)
    return {**bleu(translations, references), "translations": translations}


__all__ = ["SacreBLEU", "bleu", "evaluate_bleu", "load_for_inference", "token_nll", "translate"]
