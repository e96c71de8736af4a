"""`--job_minutes`: the whole job, from the command's start to the printed result, on one clock.

The work after training (averaging the last checkpoints, the constrained alpha chosen on dev, the test set) takes
minutes on a CPU, and a time budget for training alone leaves them to the user's clock. With a job budget, training
stops early enough for that work: once, `lead_minutes` before the job's end, its time is estimated on this machine by
translating a sample of dev sentences with the weights of that moment, as the work after training will.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

from vaswani_mt.data.corpus import source_target
from vaswani_mt.evaluation.terminology import ALPHA_SENTENCES, alphas_to_try, reference_terms
from vaswani_mt.inference.translate import translate

logger = logging.getLogger(__name__)

FIXED_SECONDS = 15.0  # averaging, saving and scoring around the translations (the main job's: about 15 s)
MARGIN = 1.15  # the sample's rate against the whole sets': other lengths, other batches
# Sentences translated untimed first, plain and with terms: the first translation after training pays one-time costs
# (the weights packed for inference's shapes, new buffers), and timed, they made the estimate up to 3x too long.
WARM_UP = 4


class JobDeadline:
    """When training must stop for the job to end within `job_minutes` of `started` (`time.monotonic()`): as soon as
    what is left is what the work after training needs, `estimate()` seconds, measured once, when `lead_minutes` are
    left (or at the first step, where the job is shorter)."""

    def __init__(self, job_minutes: float, started: float, estimate: Callable[[], float], lead_minutes: float = 5.0):
        if not job_minutes > 0:
            raise ValueError(f"job_minutes must be above 0, got {job_minutes}")
        self.seconds, self.started, self.estimate = job_minutes * 60, started, estimate
        self.lead_seconds = lead_minutes * 60
        self.after_seconds: float | None = None  # the estimate, once made

    def left(self, now: float) -> float:
        return self.seconds - (now - self.started)

    def training_must_stop(self, now: float) -> bool:
        if self.after_seconds is None and self.left(now) <= self.lead_seconds:
            measuring = time.monotonic()
            self.after_seconds = self.estimate()
            now += time.monotonic() - measuring  # the estimate's own time counts too
            logger.info("the work after training: about %.1f minutes (estimated); the job ends within %.1f minutes",
                        self.after_seconds / 60, self.seconds / 60)  # fmt: skip
        return self.after_seconds is not None and self.left(now) <= self.after_seconds


def after_training_seconds(
    model, tokenizer, dev_sources: Sequence[str], dev_references: Sequence[str], *, test_sentences: int,
    choose_alpha: bool, batch_size: int, sample: int | None = None,
) -> float:  # fmt: skip
    """The seconds `_score_and_publish` will take: the test set and, with `choose_alpha`, each alpha of
    `choose_constrained_alpha` on its dev sentences with terms, at the rates of `sample` dev sentences translated
    now (plain, then with their terms); plus averaging and saving.

    `sample` defaults to one whole batch (`batch_size`), as the sets are translated: a batch runs as long as its
    longest sentence, and half a batch (32 of 64) made the rate of one checkpoint of the main job 2x its sets'."""
    sample = sample or batch_size
    was_training = model.training
    model.eval()
    try:
        terms = reference_terms(dev_sources, dev_references) if choose_alpha else []
        termed = [i for i, wanted in enumerate(terms) if wanted][:ALPHA_SENTENCES]
        translate(model, tokenizer, list(dev_sources[:WARM_UP]), batch_size=batch_size)
        if termed:
            translate(model, tokenizer, [dev_sources[i] for i in termed[:WARM_UP]], batch_size=batch_size,
                      constraints=[terms[i] for i in termed[:WARM_UP]])  # fmt: skip
        started = time.monotonic()
        plain = list(dev_sources[:sample])
        translate(model, tokenizer, plain, batch_size=batch_size)
        seconds = (time.monotonic() - started) / max(len(plain), 1) * test_sentences
        if choose_alpha:
            probe = termed[:sample]
            started = time.monotonic()
            if probe:
                translate(model, tokenizer, [dev_sources[i] for i in probe], batch_size=batch_size,
                          constraints=[terms[i] for i in probe])  # fmt: skip
            rate = (time.monotonic() - started) / max(len(probe), 1)
            seconds += rate * len(termed) * len(alphas_to_try(model))
    finally:
        model.train(was_training)
    return seconds * MARGIN + FIXED_SECONDS


def job_deadline(job_minutes: float, started: float, model, tokenizer, corpus, languages: tuple[str, str], *,
                 test_bleu: bool, choose_alpha: bool, batch_size: int) -> JobDeadline:  # fmt: skip
    """The main job's deadline: the work after training is `_score_and_publish`'s, on `corpus`' test and dev splits."""
    dev = source_target(corpus["validation"], *languages)
    estimate = partial(after_training_seconds, model, tokenizer, *dev, test_sentences=len(corpus["test"]) if test_bleu
                       else 0, choose_alpha=test_bleu and choose_alpha, batch_size=batch_size)  # fmt: skip
    return JobDeadline(job_minutes, started, estimate)


__all__ = ["JobDeadline", "after_training_seconds", "job_deadline"]
