"""A CTranslate2 export translating with the paper's ranking (issue 44, item 5): CTranslate2's scores undone to
log P(Y|X), its hypotheses re-ranked by §6.1's GNMT score (the commands taking such a folder as --model:
tests/cli/test_ctranslate2_commands.py)."""

import pytest
from conftest import ENGLISH

pytestmark = pytest.mark.transformers_internals

pytest.importorskip("ctranslate2")

# The fitted sentences and some it never saw: varied lengths, so that the length penalty has something to rank.
SOURCES = [*ENGLISH, "The girl reads a book in the café.", "How are you?", "The snow is closed.", "I like the apple."]
ALPHA = 1.2  # the main job's GNMT alpha: far from CTranslate2's |Y|^alpha ranking


@pytest.fixture(scope="module")
def folders(fitted_folder, tmp_path_factory):
    """The fitted model and its CTranslate2 export, as `vaswani-mt-export --format ctranslate2` writes it."""
    from vaswani_mt.export.marian import export_model

    return fitted_folder, export_model(fitted_folder, "ctranslate2", tmp_path_factory.mktemp("ct2") / "ct2")


@pytest.fixture
def engine(folders, restore_threads):
    # restore_threads: a CTranslate2 translator sets the OpenMP thread count, which is torch's too
    from vaswani_mt.export.ctranslate2 import CTranslate2Model

    engine = CTranslate2Model(folders[1], intra_threads=1)
    engine.folder = folders[1]
    return engine


def _search(engine):
    from vaswani_mt.export.ctranslate2 import ctranslate2_search

    return ctranslate2_search(engine.folder)


def _sources(engine, sentences):
    return [engine.tokenizer.convert_ids_to_tokens(engine.tokenizer(s)["input_ids"]) for s in sentences]


def test_undone_scores_are_the_log_probs_score_batch_gives_and_the_best_is_the_best_gnmt_score(engine):
    from vaswani_mt.export.ctranslate2 import ctranslate2_nbest

    sources = _sources(engine, SOURCES)
    prefix = engine.tokenizer.convert_ids_to_tokens(engine.tokenizer(text_target="Das")["input_ids"])[:-1]
    prefixes = [prefix if i % 2 else [] for i in range(len(sources))]
    ranked = ctranslate2_nbest(engine.translator, sources, _search(engine), prefixes, length_penalty=ALPHA)
    reordered = 0
    for source, hypotheses, own_prefix in zip(sources, ranked, prefixes, strict=True):
        assert len(hypotheses) == _search(engine)["beam_size"]
        tokens = [h[0] for h in hypotheses]
        assert all(t[: len(own_prefix)] == own_prefix for t in tokens)
        # Computed independently: score_batch scores the whole target, prefix and </s> included
        scored = engine.translator.score_batch([source] * len(tokens), tokens)
        log_probs = [sum(result.log_probs) for result in scored]
        assert [h[1] for h in hypotheses] == pytest.approx(log_probs, abs=1e-4)
        gnmt = [log_prob / ((5 + len(t) + 1) / 6) ** ALPHA for t, log_prob in zip(tokens, log_probs, strict=True)]
        assert [h[2] for h in hypotheses] == pytest.approx(gnmt, abs=1e-4)
        assert gnmt[0] == pytest.approx(max(gnmt), abs=1e-6) and sorted(gnmt, reverse=True) == pytest.approx(gnmt)
        own = engine.translator.translate_batch([source], [own_prefix] if own_prefix else None, beam_size=4,
                                                length_penalty=ALPHA, max_decoding_length=len(source) + 49)  # fmt: skip
        reordered += own[0].hypotheses[0] != tokens[0]
    assert reordered > 0  # CTranslate2's own ranking (log P / |Y|^alpha) chose otherwise somewhere: not vacuous


def test_greedy_and_beam_translations_are_our_searchs(engine, folders):
    from vaswani_mt.inference.loading import load_for_inference
    from vaswani_mt.inference.translate import translate, translate_nbest

    model, tokenizer = load_for_inference(str(folders[0]), device="cpu")
    greedy = translate(model, tokenizer, SOURCES, num_beams=1)
    assert translate(engine, None, SOURCES, num_beams=1) == greedy and len(set(greedy)) >= 6  # varied: not vacuous
    ours = translate_nbest(model, tokenizer, SOURCES, 1, num_beams=1)
    theirs = translate_nbest(engine, None, SOURCES, 1, num_beams=1)
    assert [h[0].log_prob for h in theirs] == pytest.approx([h[0].log_prob for h in ours], abs=1e-4)
    for alpha in (0.6, ALPHA):  # the saved search's alpha, and the main job's
        assert translate(engine, None, SOURCES, length_penalty=alpha) == translate(model, tokenizer, SOURCES,
                                                                             length_penalty=alpha)  # fmt: skip
    prefixes = ["Das", "", "Die Straße", "", "Sie", "", "Das", "", "Die", ""]
    # ours with the exact bound (early_stopping="never"), which searches on past fairseq's rule (the default)
    ours = translate(model, tokenizer, SOURCES, target_prefixes=prefixes, length_penalty=ALPHA, early_stopping="never")
    theirs = translate(engine, None, SOURCES, target_prefixes=prefixes, length_penalty=ALPHA)
    assert all(text.startswith(prefix) for text, prefix in zip(theirs, prefixes, strict=True))
    # CTranslate2 stops once 4 hypotheses have ended, ours while one running could still win: here (patience 1)
    # "Das Mädchen hat einen Apfel gegessen." ends after 4 shorter ones; with patience 2 it is among the 8 kept.
    engine.patience = 2
    assert translate(engine, None, SOURCES, target_prefixes=prefixes, length_penalty=ALPHA) == ours


def test_an_nbest_list_keeps_k_entries_when_a_prefix_forces_beams(engine):
    """CTranslate2 scores the beams a target prefix forces beside the first -1e10: they are scored whole by
    score_batch rather than dropped, so that every line has its K entries (issue 61)."""
    from types import SimpleNamespace

    from vaswani_mt.export.ctranslate2 import ctranslate2_nbest

    class Forcing:  # the real translator, with every hypothesis but the first marked forced
        def translate_batch(self, *args, **kwargs):
            results = engine.translator.translate_batch(*args, **kwargs)
            return [SimpleNamespace(hypotheses=r.hypotheses, scores=[r.scores[0]] + [-1e10] * (len(r.scores) - 1))
                    for r in results]  # fmt: skip

        def score_batch(self, *args, **kwargs):
            return engine.translator.score_batch(*args, **kwargs)

    sources = _sources(engine, SOURCES[:3])
    ranked = ctranslate2_nbest(Forcing(), sources, _search(engine), length_penalty=ALPHA)
    assert [len(row) for row in ranked] == [_search(engine)["beam_size"]] * 3
    expected = ctranslate2_nbest(engine.translator, sources, _search(engine), length_penalty=ALPHA)
    assert [[h[0] for h in row] for row in ranked] == [[h[0] for h in row] for row in expected]
    assert [h[1] for row in ranked for h in row] == pytest.approx([h[1] for row in expected for h in row], abs=1e-4)


def test_ctranslate2s_own_ranking_refuses_nbest_lists_before_anything_is_read(folders):
    from vaswani_mt.export.ctranslate2 import CTranslate2Model
    from vaswani_mt.inference.translator import Translator

    own = CTranslate2Model(folders[1], ranking="ctranslate2", intra_threads=1)
    with pytest.raises(ValueError, match=r"^nbest=2: .+ gives one translation per line \(CTranslate2's own ranking\): "
                                         r"use ranking='paper', or nbest 1$"):  # fmt: skip
        Translator(own, nbest=2)
    assert len(Translator(own, nbest=1).translate(["The house is small."])[0]) == 1


def test_a_ctranslate2_folder_runs_as_saved_unless_told_in_its_compute_types_on_this_gpu(folders, monkeypatch):
    import argparse

    import ctranslate2
    import torch

    from vaswani_mt.cli import check_compute_type
    from vaswani_mt.inference import ctranslate2 as module
    from vaswani_mt.inference.translator import Translator

    seen = []

    class Seen(module.CTranslate2Model):  # records its options, and runs on the CPU whatever they say
        def __init__(self, folder, **options):
            seen.append(options)
            super().__init__(folder, **{k: v for k, v in options.items() if k not in ("device", "device_index")})

    monkeypatch.setattr(module, "CTranslate2Model", Seen)
    for given, passed in ((None, None), ("float32", "float32"), ("int8_float32", "int8_float32")):
        Translator(str(folders[1]), threads=1, compute_type=given)
        assert seen[-1].get("compute_type") == passed and "device" not in seen[-1]  # None: the type it was saved in
        if given is not None:
            check_compute_type(argparse.Namespace(compute_type=given, model=[str(folders[1])]))  # taken, no exit
    with pytest.raises(SystemExit, match="unknown compute type 'fp8' for a CTranslate2 folder: use default, auto, "):
        check_compute_type(argparse.Namespace(compute_type="fp8", model=[str(folders[1])]))
    with pytest.raises(ValueError, match=r"^compute type 'int8_float32' is CTranslate2's: vaswani_mt's own models "
                                         r"take float32, bfloat16, int8, auto$"):  # fmt: skip
        Translator(str(folders[0]), compute_type="int8_float32")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 1)
    Translator(str(folders[1]), threads=1)
    assert seen[-1]["device"] == "cuda" and seen[-1]["device_index"] == 0


def test_max_new_tokens_is_honoured_and_a_keyword_the_search_lacks_refused_before_any_input(folders, restore_threads):
    from vaswani_mt.inference.translator import Translator

    for tokens in (3, 7):  # greedy: the same translations as ours, cut at the same length
        short = {"num_beams": 1, "max_new_tokens": tokens}
        assert Translator(str(folders[1]), threads=1, **short).translate(SOURCES) == Translator(
            str(folders[0]), **short).translate(SOURCES), short  # fmt: skip
    beam = Translator(str(folders[1]), threads=1, num_beams=4, max_new_tokens=5)
    assert all(len(beam.tokenizer(text_target=text)["input_ids"]) <= 6 for text in beam.translate(SOURCES))  # + </s>
    with pytest.raises(ValueError, match=r"^do_sample: not an option of .+'s search, which takes .*beam_size, "):
        Translator(str(folders[1]), threads=1, generate_kwargs={"do_sample": True})
    assert Translator(str(folders[1]), threads=1, generate_kwargs={"repetition_penalty": 1.0}).translate(["Hi."])


LACKS = {
    "sampling": ({"sampling": True}, "sampling (--sampling) needs vaswani_mt's own search"),
    "early_stopping": ({"early_stopping": False}, "early_stopping=False (--early_stopping false) needs vaswani_mt's"),
    "alignments": ({"alignments": "hard"}, "alignments (--alignments) need vaswani_mt's own model"),
    "markup": ({"markup": "xml"}, "markup (--markup) needs vaswani_mt's own model (it aligns)"),
    "constraints": ({"constraints": "unordered"}, "constraints (--constraints) need vaswani_mt's own search"),
}


@pytest.mark.parametrize(("fields", "start"), LACKS.values(), ids=LACKS)
def test_what_a_ctranslate2_folder_lacks_is_refused_in_one_line_when_the_translator_is_made(folders, fields, start):
    from vaswani_mt.inference.translator import Translator

    with pytest.raises(ValueError) as error:
        Translator(str(folders[1]), threads=1, **fields)
    message = str(error.value)
    assert message.startswith(start) and f"the CTranslate2 folder {folders[1]}" in message and "\n" not in message
    assert message.endswith("; translate the vaswani_mt folder it came from")


class _Counting:
    """The engine's translator, with the sentences of each translate_batch call recorded."""

    def __init__(self, translator):
        self.translator, self.calls = translator, []

    def translate_batch(self, sources, *args, **kwargs):
        self.calls.append(len(sources))
        return self.translator.translate_batch(sources, *args, **kwargs)

    def score_batch(self, *args, **kwargs):
        return self.translator.score_batch(*args, **kwargs)


def test_one_call_at_the_longest_limit_finds_what_a_call_at_each_sentences_own_limit_finds(engine):
    """Issue 66: a batch is searched in one translate_batch call at its longest limit, then again at its own limit
    each sentence whose search reached its own last step; every sentence gets the hypotheses and scores of a call at
    its own limit (today's call per limit), here with limits that cut half of them (|X| + 1 tokens, the others
    |X| + 12), under the paper's ranking's options, CTranslate2's own, greedy search, prefixes and blocked phrases."""
    from vaswani_mt.inference.ctranslate2 import _translate

    sources = _sources(engine, SOURCES)
    limits = [len(source) + (1 if i % 2 else 12) for i, source in enumerate(sources)]
    prefix = engine.tokenizer.convert_ids_to_tokens(engine.tokenizer(text_target="Das")["input_ids"])[:-1]
    paper = {"beam_size": 4, "num_hypotheses": 4, "return_scores": True, "min_decoding_length": 0,
             "length_penalty": 0.8}  # fmt: skip
    cases = {"paper": (paper, None), "own": ({"beam_size": 4, "num_hypotheses": 4, "length_penalty": ALPHA}, None),
             "greedy": ({"beam_size": 1, "return_scores": True}, None),
             "prefixes": (paper, [prefix if i % 3 else [] for i in range(len(sources))]),
             "blocked": ({**paper, "suppress_sequences": [prefix]}, None)}  # fmt: skip
    kept = redone = 0
    for name, (options, prefixes) in cases.items():
        counting = _Counting(engine.translator)
        found = _translate(counting, sources, limits, dict(options), prefixes)
        alone = [engine.translator.translate_batch([source], None if prefixes is None else [prefixes[i]],
                                                   max_input_length=0, max_decoding_length=limits[i], **options)[0]
                 for i, source in enumerate(sources)]  # fmt: skip
        assert [r.hypotheses for r in found] == [r.hypotheses for r in alone], name
        assert [r.scores for r in found] == [pytest.approx(r.scores, abs=1e-4) for r in alone], name
        assert counting.calls[0] == len(sources), name  # the first call holds every sentence
        redone += sum(counting.calls[1:])
        kept += sum(limit < max(limits) for limit in limits) - sum(counting.calls[1:])
    assert redone > 0 and kept > 0  # some searches reached their own limit, others were taken from the one call


def test_the_translator_batches_a_ctranslate2_folder_as_ctranslate2_does_with_the_lines_of_a_call_per_limit(folders):
    """The Translator hands a CTranslate2 folder batches of 64 sentences sorted by source tokens (CTranslate2's own
    batching), one call each where the limits allow it; the lines and n-best lists are those of a batch per sentence
    (each searched at its own |X| + 50 tokens, as today's call per limit), with prefixes, blocked phrases and
    --max_tokens."""
    from vaswani_mt.export.ctranslate2 import CTranslate2Model
    from vaswani_mt.inference.translator import Translator

    lines = SOURCES * 3
    prefixes = ["Das" if i % 4 == 0 else "" for i in range(len(lines))]
    cases = {"plain": {}, "own ranking": {"ranking": "ctranslate2"}, "nbest": {"nbest": 3},
             "blocked": {"block": ("Das",), "nbest": 2}, "max_tokens": {"max_tokens": 40, "nbest": 2},
             "greedy": {"num_beams": 1}}  # fmt: skip
    for name, options in {**cases, "prefixes": {"nbest": 2}}.items():
        ranking = options.pop("ranking", "paper")
        translators = [Translator(CTranslate2Model(folders[1], ranking=ranking, intra_threads=1), **extra, **options)
                       for extra in ({}, {"batch_size": 1})]  # fmt: skip
        counting = translators[0].backend.translator = _Counting(translators[0].backend.translator)
        given = {"prefixes": prefixes} if name == "prefixes" else {}
        batched, alone = (translator.translate(lines, **given) for translator in translators)
        if "nbest" in options:  # log P undone from each call's lp: equal to float32 round-off
            assert [[h.text for h in row] for row in batched] == [[h.text for h in row] for row in alone], name
            numbers = [number for row in alone for h in row for number in (h.log_prob, h.score)]
            assert [number for row in batched for h in row for number in (h.log_prob, h.score)] == pytest.approx(
                numbers, abs=1e-4)  # fmt: skip
        else:
            assert batched == alone, name
        if "max_tokens" not in options:
            assert counting.calls[0] == len(lines), name  # 30 lines: one batch, one call (and a call per redo)
