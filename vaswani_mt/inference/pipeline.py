"""The translation pipeline with word alignments and markup (`translation_pipeline(folder, alignments="hard")`).

The Hub payload's `TranslationPipeline` imports only torch and transformers; alignments and markup live in this
package, so the pipeline that takes them is this subclass: the same pipeline, and where a call (or the construction)
asks for `alignments` or `markup`, the texts go through the `Translator` with them (one search, the same
translations).
"""

from __future__ import annotations

from collections.abc import Sequence

from vaswani_mt.inference.alignments import format_alignment
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.translate import split_options
from vaswani_mt.inference.translator import Translator
from vaswani_mt.model.pipeline_vaswani import TranslationPipeline

_OPTIONS = ("alignments", "alignment_method", "markup")
# Pipeline's own construction arguments: not options of a translation.
_PIPELINE_ARGUMENTS = {"model", "tokenizer", "feature_extractor", "image_processor", "video_processor", "processor",
                       "task", "device", "binary_output", "dtype", "torch_dtype", "args_parser", "num_workers",
                       "framework", "device_map"}  # fmt: skip


class AligningTranslationPipeline(TranslationPipeline):
    """`TranslationPipeline` that also takes, at construction or per call, `alignments` ("hard" or "soft"),
    `alignment_method` and `markup` ("xml"), as `translate()` does.

    With `alignments`, each result is `{"translation_text": t, "alignment": "0-0 1-2 ..."}`: `t` an
    `AlignedTranslation` (a `str` with `links`, `soft`, `source_words`, `target_words`), the field Marian's (soft: the
    per-word distributions). With `markup="xml"`, `translation_text` has the source's tags put back. `constraints`
    (terms for every text), `max_source_tokens`, `batch_size`, `num_return_sequences` (n-best, alignments only) and
    `generate()` keywords work as without them.
    """

    def __init__(self, *args, alignments: str | None = None, alignment_method: str | None = None,
                 markup: str | None = None, **kwargs):  # fmt: skip
        self._extras = {"alignments": alignments, "alignment_method": alignment_method, "markup": markup}
        # The construction's options (generate() keywords, terms, batch size, ...), for the calls that go through
        # translate(): kept here rather than read back from Pipeline's private attributes.
        self._defaults = {k: v for k, v in kwargs.items() if k not in _PIPELINE_ARGUMENTS}
        super().__init__(*args, **kwargs)

    def __call__(self, inputs: str | list[str], *args, **kwargs) -> list:
        extras = {name: kwargs.pop(name, None) for name in _OPTIONS}
        extras = {name: extras[name] if extras[name] is not None else self._extras[name] for name in _OPTIONS}
        if extras["alignments"] is None and extras["markup"] is None:
            return super().__call__(inputs, *args, **kwargs)
        if args:
            raise TypeError("the translation pipeline takes its options as keywords")
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        if not all(isinstance(text, str) for text in texts):
            raise TypeError("the translation pipeline takes text (a str or a list of str)")
        results = self._translate(texts, extras, kwargs)
        return results[0] if isinstance(inputs, str) and isinstance(results[0], list) else results

    def _translate(self, texts: Sequence[str], extras: dict, kwargs: dict) -> list:
        """One result per text (a list of them with n-best), through the `Translator`."""
        keywords = {**self._defaults, **kwargs, **{name: value for name, value in extras.items() if value is not None}}
        keywords.pop("clean_up_tokenization_spaces", None)  # the translator decodes as the commands do
        terms = keywords.pop("constraints", None)
        if terms is not None:  # the pipeline's terms hold for every text
            keywords["constraints"] = [[terms] if isinstance(terms, str) else list(terms)] * len(texts)
        nbest = keywords.pop("num_return_sequences", None)
        if nbest is not None and nbest > 1:
            keywords["nbest"] = nbest
        keywords["batch_size"] = keywords.get("batch_size") or 32
        options, data = split_options(keywords)
        outputs = Translator(self.model, self.tokenizer, options).translate(texts, **data)
        if options.nbest is not None:
            return [[self._record(h.text, options) for h in hypotheses] for hypotheses in outputs]
        return [self._record(text, options) for text in outputs]

    @staticmethod
    def _record(text, options) -> dict:
        if options.alignments is None:
            return {"translation_text": text}
        return {"translation_text": text, "alignment": format_alignment(text)}


def translation_pipeline(model: str, compute_type: str = "float32", device: str | None = None, **kwargs):
    """The translation pipeline of a saved model (folder or Hub id), loaded by `load_for_inference` with its checks
    and `compute_type`; `kwargs` go to the pipeline (`max_source_tokens`, `batch_size`, `alignments`, `markup`,
    generate() keywords). It is `AligningTranslationPipeline`: transformers' `pipeline(
    "translation", model=folder, trust_remote_code=True)` builds the payload's `TranslationPipeline`, the same without
    alignments and markup, in float32."""
    loaded, tokenizer = load_for_inference(model, device=device, compute_type=compute_type)
    return AligningTranslationPipeline(model=loaded, tokenizer=tokenizer, **kwargs)


__all__ = ["AligningTranslationPipeline", "translation_pipeline"]
