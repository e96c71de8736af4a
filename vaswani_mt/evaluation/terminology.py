"""The constrained search's GNMT alpha, chosen on the dev split as §6.1 chose alpha ("chosen after experimentation
on the development set").

Forced terms cost log-probability that the free tokens cannot win back; divided by `((5 + |Y|) / 6)^alpha`, that
cost shrinks as the hypothesis grows, so a large alpha lets constrained hypotheses run long (RESULTS.md). The
constrained sentences get an alpha of their own (`constrained_length_penalty` in generation_config.json), chosen
here by dev BLEU with terms taken from the references: any corpus has them, and the terminology benchmark's
dictionary terms stay for the test.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from vaswani_mt.evaluation.metrics import bleu
from vaswani_mt.inference.translate import translate

logger = logging.getLogger(__name__)

# The alphas tried: the paper's 0.6 and steps of 0.3 from 0 up to the model's own (at most 1.5).
ALPHAS = (0.0, 0.3, 0.6, 0.9, 1.2, 1.5)
ALPHA_SENTENCES = 200  # the dev sentences with a term that the choice translates at each alpha, at most
_WORD = re.compile(r"\w{5,}")


def reference_terms(sources: Sequence[str], references: Sequence[str]) -> list[list[str]]:
    """One dev term per sentence where there is one: the reference's longest word of 5 or more letters that the
    source lacks (so that copying the source cannot meet it); then alphabetical. [] where none."""
    terms = []
    for source, reference in zip(sources, references, strict=True):
        in_source = {word.lower() for word in _WORD.findall(source)}
        words = sorted({w for w in _WORD.findall(reference) if not w.isdigit() and w.lower() not in in_source},
                       key=lambda w: (-len(w), w))  # fmt: skip
        terms.append(words[:1])
    return terms


def alphas_to_try(model) -> list[float]:
    """The alphas `choose_constrained_alpha` tries: those of `ALPHAS` up to the model's own, and its own."""
    own = float(model.generation_config.length_penalty or 0.0)
    return sorted({a for a in ALPHAS if a <= own} | {own})


def choose_constrained_alpha(
    model, tokenizer, sources: Sequence[str], references: Sequence[str], *, batch_size: int = 32,
    max_sentences: int = ALPHA_SENTENCES,
) -> tuple[float, dict[float, float]]:  # fmt: skip
    """The alpha of `ALPHAS` (up to the model's own) with the best BLEU on the dev sentences that have a term
    (`reference_terms`, at most `max_sentences`), each translated with its term under the model's search; ties go to
    the alpha nearest the model's. Returns it and the BLEU of each alpha tried."""
    terms = reference_terms(sources, references)
    chosen = [i for i, wanted in enumerate(terms) if wanted][:max_sentences]
    own = float(model.generation_config.length_penalty or 0.0)
    alphas = alphas_to_try(model)
    if not chosen:
        return own, {}
    texts, wanted, refs = ([seq[i] for i in chosen] for seq in (sources, terms, references))
    scores = {}
    controls_logger = logging.getLogger("vaswani_mt.inference.controls")
    level = controls_logger.level
    controls_logger.setLevel(logging.ERROR)  # the dev terms' notes (rare words, unmet terms) are not the user's
    try:
        for alpha in alphas:
            out = translate(
                model, tokenizer, texts, batch_size=batch_size, constraints=wanted, constrained_length_penalty=alpha
            )
            scores[alpha] = round(bleu(out, refs)["score"], 2)
    finally:
        controls_logger.setLevel(level)
    best = max(alphas, key=lambda a: (scores[a], -abs(a - own)))
    logger.info("constrained alpha %s: dev BLEU with a reference term on %d sentences %s", best, len(chosen),
                ", ".join(f"{a}: {s}" for a, s in scores.items()))  # fmt: skip
    return best, scores


__all__ = ["ALPHAS", "ALPHA_SENTENCES", "alphas_to_try", "choose_constrained_alpha", "reference_terms"]
