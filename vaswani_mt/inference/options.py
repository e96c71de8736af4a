"""`TranslationOptions`: every option of a translation in one frozen object, checked in one place (as transformers'
`GenerationConfig` or CTranslate2's `translate_batch` keywords). The commands' options, the pipeline's keywords and
the demo's fields are its field names; `Translator` (translator.py) takes it.

A field left None is the model's own value (its `generation_config.json`: the paper's search, §6.1), so that an
option not given changes nothing. `check` raises `ValueError`, one line, for every pair of options that do not go
together; with the backend (`backend_facts`) it also checks what depends on the model: the beam an n-best list may
not exceed, the decoder layers an alignment method names, a supervised head, what CTranslate2 cannot do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from vaswani_mt.model.constraints_vaswani import ORDERS

ALIGNMENT_KINDS = ("hard", "soft")
MARKUP_FORMATS = ("xml", "directives")  # markup.py reads them; directives: format directives only, no tags
COMPUTE_TYPES = ("float32", "bfloat16", "int8", "auto")  # ours (inference/compute_types.py)
COMPILE_STEPS = ("on",)  # the decoder step torch.compile'd, its weights frozen (inference/compiled.py); None: eager
# CTranslate2's, which its folders take (its `compute_type`): the weights' type and the one products run in.
CTRANSLATE2_COMPUTE_TYPES = ("default", "auto", "float32", "float16", "bfloat16", "int8", "int8_float32",
                             "int8_float16", "int8_bfloat16", "int16")  # fmt: skip
# The fields that are `generate()` keywords of the model's search, passed on only when given.
SEARCH_FIELDS = ("num_beams", "length_penalty", "early_stopping", "constrained_length_penalty", "max_len_a",
                 "max_len_b", "max_new_tokens")  # fmt: skip
SAMPLING_FIELDS = ("topk", "topp", "temperature", "seed")


class Hypothesis(NamedTuple):
    """One translation of an n-best list: its `text`, `log_prob` (log P(Y|X), EOS included) and `score`, what the
    search ranks by: `log_prob / ((5 + |Y|) / 6)^alpha` (§6.1's GNMT penalty), for any search."""

    text: str
    log_prob: float
    score: float


@dataclass(frozen=True)
class Sampling:
    """Sampling instead of search, for back-translation (Edunov et al., 2018): each token is drawn from the model's
    distribution divided by `temperature`, among the `top_k` most likely tokens (None or 0: all) and the fewest whose
    probability reaches `top_p` (1: all). Each input line draws from its own random stream, seeded by `seed` and its
    position in the input, so that its sample does not depend on its batch."""

    seed: int = 1
    top_k: int | None = None
    top_p: float = 1.0
    temperature: float = 1.0

    def __post_init__(self):
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top-k must be 0 (all tokens) or more, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if not self.temperature > 0:
            raise ValueError(f"the temperature must be above 0, got {self.temperature}")


# What only vaswani_mt's own search and model do: a backend states those it cannot (`BackendFacts.lacks`), and an
# option that needs one is refused with this line when the Translator is made.
OWN_SEARCH = {
    "constraints": "constraints (--constraints) need vaswani_mt's own search: {name} takes target prefixes "
                   "(--target_prefix_file), --block_file and --disable_unk only",
    "sampling": "sampling (--sampling) needs vaswani_mt's own search (a seeded draw per line), not {name}",
    "early_stopping": "early_stopping={value!r} (--early_stopping {flag}) needs vaswani_mt's own search: {name} stops "
                      "a sentence once beam_size hypotheses have ended (true)",
    "alignments": "alignments (--alignments) need vaswani_mt's own model, not {name}",
    "alignment_method": "alignment_method (--alignment_method) needs vaswani_mt's own model, not {name}",
    "markup": "markup (--markup) needs vaswani_mt's own model (it aligns), not {name}",
    "compile_step": "compile_step={value!r} (--compile_step) needs vaswani_mt's own model, not {name}",
}  # fmt: skip


class BackendFacts(NamedTuple):
    """What `check` needs to know of a backend: its `name` (the folder, for messages), its search's beam
    (`num_beams`), what of `OWN_SEARCH` it `lacks`, the decoder depth of each member, and whether every member has
    a supervised alignment head, whether its n-best lists have K entries (`nbest_lists`), the keywords its
    search takes (`keywords`; None: any of `generate()`'s), and its batches where the options give no size: rows
    (`batch_size`), longest first by characters or, as CTranslate2's own, by source tokens (`by_tokens`)."""

    name: str
    num_beams: int
    lacks: tuple[str, ...] = ()
    depths: tuple[int, ...] = ()
    supervised: bool = False
    nbest_lists: bool = True
    keywords: frozenset[str] | None = None
    batch_size: int = 32
    by_tokens: bool = False


@dataclass(frozen=True)
class TranslationOptions:
    """How to translate. Search (None: the model's): `num_beams`, `length_penalty` (GNMT alpha), `early_stopping`
    (True: fairseq's rule, "never": the exact bound, False: transformers'), `constrained_length_penalty` (alpha of
    constrained lines), the length limit `max_len_a` · |X| + `max_len_b` or `max_new_tokens`.

    Sampling (back-translation): `sampling`, with `topk`, `topp`, `temperature`, `seed` (`Sampling`).

    Controls: `constraints` ("unordered" or "ordered"): each line carries its terms (fairseq's `source<TAB>term`, or
    the translator's `terms`); `block`, phrases no translation contains; `disable_unk`: no `<unk>`.

    Outputs: `nbest` (lists of `Hypothesis`), `alignments` ("hard" or "soft", with `alignment_method`), `markup`
    ("xml": tags, entities and format directives carried through; "directives": format directives only).

    Batching: `batch_size` rows (None: the backend's, 32, a CTranslate2 folder's 64; with `max_tokens` the budget
    alone), `max_tokens` (fairseq's token budget), `chunk_size`
    lines read at a time (None: 16 batches, or 1024 lines with `max_tokens`), `max_source_tokens` (longer sources are
    cut, with a warning; None: the model's). Compute: `compute_type` (CTranslate2's names; None: as saved, unlike
    "float32", which a CTranslate2 int8 export runs in), `threads` (None: torch's or CTranslate2's default),
    `compile_step` ("on": the decoder step torch.compile'd with its weights frozen, compiled.py; None: eager).
    `generate_kwargs`: any other `generate()` keyword (CTranslate2: `translate_batch`'s).
    """

    num_beams: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    constrained_length_penalty: float | None = None
    max_len_a: float | None = None
    max_len_b: int | None = None
    max_new_tokens: int | None = None
    sampling: bool = False
    topk: int | None = None
    topp: float | None = None
    temperature: float | None = None
    seed: int | None = None
    constraints: str | None = None
    block: tuple[str, ...] = ()
    disable_unk: bool = False
    nbest: int | None = None
    alignments: str | None = None
    alignment_method: str | None = None
    markup: str | None = None
    batch_size: int | None = None
    max_tokens: int | None = None
    chunk_size: int | None = None
    max_source_tokens: int | None = None
    compute_type: str | None = None
    threads: int | None = None
    compile_step: str | None = None
    generate_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "block", tuple(self.block))
        object.__setattr__(self, "generate_kwargs", dict(self.generate_kwargs))
        self.check()

    def replace(self, **changes) -> TranslationOptions:
        """A copy with `changes` (checked anew)."""
        return dataclasses.replace(self, **changes)

    @property
    def sampler(self) -> Sampling | None:
        """The `Sampling` of `sampling` and its knobs, or None."""
        if not self.sampling:
            return None
        return Sampling(seed=1 if self.seed is None else self.seed, top_k=self.topk,
                        top_p=1.0 if self.topp is None else self.topp,
                        temperature=1.0 if self.temperature is None else self.temperature)  # fmt: skip

    def search_kwargs(self) -> dict:
        """`generate()` keywords of the search fields given (the rest are the model's), then `generate_kwargs`."""
        given = {name: getattr(self, name) for name in SEARCH_FIELDS if getattr(self, name) is not None}
        return {**given, **self.generate_kwargs}

    @property
    def beams_given(self) -> int | None:
        return self.num_beams if self.num_beams is not None else self.generate_kwargs.get("num_beams")

    def chunk_lines(self) -> int:
        """Lines read at a time: `chunk_size`, else 1024 with `max_tokens` (fairseq-interactive's buffer), else 16
        batches (a stream from a terminal sets `chunk_size` 1: streams.translate_stream)."""
        if self.chunk_size is not None:
            return self.chunk_size
        return 1024 if self.max_tokens is not None else 16 * (self.batch_size or 32)

    def check(self, backend: BackendFacts | None = None, *, prefixes: bool = False) -> None:
        """ValueError, one line, for options that do not go together (`prefixes`: the lines come with target
        prefixes); with `backend`, also for what that model cannot do."""
        for name in ("batch_size", "max_tokens", "chunk_size", "nbest", "max_source_tokens", "threads"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.compute_type is not None and self.compute_type not in {*COMPUTE_TYPES, *CTRANSLATE2_COMPUTE_TYPES}:
            raise ValueError(f"unknown compute type {self.compute_type!r}: use {', '.join(COMPUTE_TYPES)} (a "
                             f"CTranslate2 folder: {', '.join(CTRANSLATE2_COMPUTE_TYPES)})")  # fmt: skip
        if self.compile_step is not None and self.compile_step not in COMPILE_STEPS:
            raise ValueError(f"compile_step must be one of {', '.join(COMPILE_STEPS)} (None: eager), not "
                             f"{self.compile_step!r}")  # fmt: skip
        self._check_sampling()
        if self.constraints is not None and self.constraints not in ORDERS:
            raise ValueError(f"constraint order must be one of {', '.join(ORDERS)}, not {self.constraints!r}")
        self._need_beams(prefixes, self.beams_given)
        self._check_outputs()
        if backend is not None:
            self._check_backend(backend, prefixes)

    def _need_beams(self, prefixes: bool, beams: int | None) -> None:
        """Constraints and target prefixes need beam search: the one check (`beams` None: not known yet)."""
        if self.constraints is not None or prefixes:
            what = "constraints" if self.constraints is not None else "target prefixes"
            if self.sampling:
                raise ValueError(f"{what} need beam search, not sampling")
            if beams is not None and beams <= 1:
                raise ValueError(f"{what} need beam search (num_beams > 1), not greedy search")

    def _check_sampling(self) -> None:
        given = [name for name in SAMPLING_FIELDS if getattr(self, name) is not None]
        if given and not self.sampling:
            raise ValueError(f"{', '.join(given)} only go{'es' if len(given) == 1 else ''} with sampling")
        self.sampler  # noqa: B018 (its own checks: top-k, top-p, temperature)
        if self.sampling and self.beams_given is not None and self.beams_given > 1:
            raise ValueError(f"sampling draws one translation per line with one beam, not num_beams={self.beams_given}")
        if self.sampling and self.nbest is not None and self.nbest > 1:
            raise ValueError(f"sampling draws one translation per line: nbest must be 1, got {self.nbest}")

    def _check_outputs(self) -> None:
        from vaswani_mt.inference.alignments import check_method  # the method names live with the methods

        if self.alignments is not None and self.alignments not in ALIGNMENT_KINDS:
            raise ValueError(f"alignments must be one of {', '.join(ALIGNMENT_KINDS)}, not {self.alignments!r}")
        if self.markup is not None:
            if self.markup not in MARKUP_FORMATS:
                raise ValueError(f"markup must be one of {', '.join(MARKUP_FORMATS)}, not {self.markup!r}")
            if self.alignments is not None:
                raise ValueError("markup and alignments do not go together: the alignments would index the text "
                                 "without tags")  # fmt: skip
            if self.nbest is not None:
                raise ValueError("markup and n-best lists do not go together")
        if self.alignment_method is not None:
            check_method(self.alignment_method)
            if self.alignments is None and self.markup is None:
                raise ValueError(f"alignment_method={self.alignment_method!r} needs alignments (or markup, which "
                                 "aligns): without them nothing is aligned")  # fmt: skip

    def _check_backend(self, backend: BackendFacts, prefixes: bool) -> None:
        beams = self.beams_given or backend.num_beams or 1
        self._need_beams(prefixes, beams)
        if self.nbest is not None and not self.sampling and self.nbest > beams:
            raise ValueError(f"nbest={self.nbest} is more than the beam size ({beams}): the search keeps {beams} "
                             "hypotheses")  # fmt: skip
        if self.nbest is not None and self.nbest > 1 and not backend.nbest_lists:
            raise ValueError(f"nbest={self.nbest}: {backend.name} gives one translation per line (CTranslate2's own "
                             "ranking): use ranking='paper', or nbest 1")  # fmt: skip
        unknown = sorted(set(self.generate_kwargs) - backend.keywords) if backend.keywords is not None else []
        if unknown:  # refused here, before any input is read, rather than at the first batch
            raise ValueError(f"{', '.join(unknown)}: not an option of {backend.name}'s search, which takes "
                             f"{', '.join(sorted(backend.keywords))}")  # fmt: skip
        for name in backend.lacks:
            value = getattr(self, name)
            given = value is not None and (value is not False or name == "early_stopping")  # sampling: a flag
            if given and not (name == "early_stopping" and value in (True, "true")):
                line = OWN_SEARCH[name].format(name=backend.name, value=value, flag=str(value).lower())
                raise ValueError(f"{line}; translate the vaswani_mt folder it came from")
        if self.alignments is None and self.markup is None:
            return
        from vaswani_mt.inference.alignments import check_method

        method = self.alignment_method or "default"
        _, layer = check_method(method)
        if layer is not None and backend.depths:  # no depths: not loaded yet (the commands check before loading)
            depths = sorted(set(backend.depths))
            if len(depths) > 1:
                counts = " and ".join(map(str, depths))
                raise ValueError(f"alignment method {method!r}: the ensemble's members have {counts} decoder layers: "
                                 "use mean or supervised")  # fmt: skip
            if layer >= depths[0]:
                raise ValueError(f"alignment method {method!r}: {backend.name} has {depths[0]} decoder layers "
                                 f"(layer0 to layer{depths[0] - 1})")  # fmt: skip
        if method == "supervised" and backend.depths and not backend.supervised:
            raise ValueError(f"alignment method 'supervised': {backend.name} has no supervised alignment head (train "
                             "it with --alignment_supervision)")  # fmt: skip


__all__ = ["ALIGNMENT_KINDS", "COMPILE_STEPS", "COMPUTE_TYPES", "CTRANSLATE2_COMPUTE_TYPES", "MARKUP_FORMATS",
           "OWN_SEARCH", "BackendFacts", "Hypothesis", "Sampling", "TranslationOptions"]  # fmt: skip
