"""The paper's beam search (§6.1) from `generate()`: GNMT length penalty, per-sentence maximum length, caching."""

import itertools
import logging
import warnings
from contextlib import contextmanager

import pytest
import torch
from conftest import make_model, padded_batch, uneven_pairs
from transformers import (
    AutoModelForSeq2SeqLM,
    GenerationConfig,
    GenerationMixin,
    PreTrainedModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from vaswani_mt import gnmt_length_penalty
from vaswani_mt.model import beam_search_vaswani, generation_vaswani
from vaswani_mt.model.generation_vaswani import PerSentenceMaxLength
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]


def teacher_forced_log_prob(model, ids, mask, sequence, eos=2):
    """log P(Y|X) summed over the generated tokens up to and including the first EOS; returns (sum, |Y|)."""
    generated = sequence[1:].tolist()
    length = generated.index(eos) + 1 if eos in generated else len(generated)
    decoder_input = sequence[None, :length]
    target = sequence[1 : length + 1]
    log_probs = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_input).logits.log_softmax(-1)
    return log_probs[0, torch.arange(length), target].sum().item(), length


def test_generation_config_defaults_are_section_6_1(model):
    config = model.generation_config
    assert (config.num_beams, config.length_penalty, config.early_stopping) == (4, 0.6, True)  # fairseq's rule
    assert (config.max_len_a, config.max_len_b) == (1, 50)
    assert (config.decoder_start_token_id, config.eos_token_id, config.pad_token_id) == (0, 2, 1)


def test_paper_defaults_survive_save_and_load(model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).generation_config
    assert (loaded.num_beams, loaded.length_penalty, loaded.max_len_a, loaded.max_len_b) == (4, 0.6, 1, 50)


def test_a_folder_saved_with_the_exact_bound_keeps_it(tmp_path):
    """Folders saved before fairseq's rule became the default (early_stopping "never") search as they did."""
    model = make_model(seed=0)
    model.generation_config.early_stopping = "never"
    model.save_pretrained(tmp_path)
    assert type(model).from_pretrained(tmp_path).generation_config.early_stopping == "never"
    assert GenerationConfig.from_pretrained(tmp_path).early_stopping == "never"


def test_a_saved_folder_keeps_its_own_per_sentence_limit_and_search_however_it_is_loaded(tmp_path):
    """max_len_a/b are not GenerationConfig fields: transformers drops such keys when it loads a generation config
    saved as derived from the model config (the one a new model starts with), so the model's must be its own."""
    model = make_model(seed=0)  # random weights: EOS is improbable, so every hypothesis runs to its limit
    model.generation_config.max_len_b = 2
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path)
    for config in (GenerationConfig.from_pretrained(tmp_path), loaded.generation_config):
        search = (config.num_beams, config.length_penalty, config.early_stopping, config.max_len_a, config.max_len_b)
        assert search == (4, 0.6, True, 1, 2)
    ids, mask = padded_batch(seed=0, lengths=(7, 3))
    sequences = loaded.generate(input_ids=ids, attention_mask=mask)
    for row, source_length in enumerate((7, 3)):
        assert sequences[row, 1:].tolist().index(2) + 1 == source_length + 2
    assert torch.equal(sequences, model.generate(input_ids=ids, attention_mask=mask))


def test_gnmt_penalty_formula():
    assert gnmt_length_penalty(1, 0.6) == 1.0
    assert gnmt_length_penalty(7, 0.6) == pytest.approx((12 / 6) ** 0.6)
    assert gnmt_length_penalty(10, 0.0) == 1.0


def test_beam_scores_are_log_probability_over_gnmt_penalty():
    model = make_model(seed=3)
    ids, mask = padded_batch(seed=1, lengths=(6, 3, 5))
    out = model.generate(
        input_ids=ids, attention_mask=mask, output_scores=True, return_dict_in_generate=True, max_len_b=6
    )
    assert out.sequences_scores.shape == (3,)
    for row in range(3):
        length = int(mask[row].sum())
        log_prob, generated = teacher_forced_log_prob(model, ids[row : row + 1, :length], None, out.sequences[row])
        expected = log_prob / ((5 + generated) / 6) ** 0.6
        assert out.sequences_scores[row].item() == pytest.approx(expected, abs=1e-4)
        # transformers' own formula would give a different number: ours is not |Y|^alpha.
        assert abs(log_prob / generated**0.6 - expected) > 1e-3


def test_each_sentence_stops_at_its_own_input_length_plus_50():
    model = make_model(seed=0)  # random weights: EOS is improbable, so every hypothesis runs to its limit
    ids, mask = padded_batch(seed=0, lengths=(7, 3))
    for num_beams in (1, 4):
        sequences = model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams)
        for row, source_length in enumerate((7, 3)):
            generated = sequences[row, 1:].tolist()
            assert 2 in generated
            assert generated.index(2) + 1 == source_length + 50


def test_explicit_lengths_override_the_per_sentence_rule(model):
    ids, mask = padded_batch(lengths=(7, 3))
    sequences = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, num_beams=1)
    assert sequences.shape == (2, 6)
    sequences = model.generate(input_ids=ids, attention_mask=mask, max_length=4, num_beams=1)
    assert sequences.shape == (2, 4)
    sequences = model.generate(input_ids=ids, attention_mask=mask, min_new_tokens=9, max_new_tokens=9, num_beams=2)
    assert sequences.shape == (2, 10)


@contextmanager
def _length_warnings():
    """The messages about `max_length` / `max_new_tokens` that transformers logs (its loggers do not propagate to the
    root logger, so a handler goes on its own) or warns while the block runs."""
    found = []

    class Recorder(logging.Handler):
        def emit(self, record):
            found.append(record.getMessage())

    handler, library = Recorder(), logging.getLogger("transformers")
    library.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        library.removeHandler(handler)
    found += [str(warning.message) for warning in caught]
    found[:] = [message for message in found if "max_length" in message or "max_new_tokens" in message]


def test_a_max_length_in_the_generation_config_yields_to_the_per_sentence_limit_without_a_warning(model):
    """A `max_length` that the model's generation config holds (Seq2SeqTrainer writes transformers' default there)
    neither cuts the paper's limit nor makes transformers warn that it and `max_new_tokens` are both set."""
    model.generation_config.max_length = 20
    ids, mask = padded_batch(lengths=(7, 3))  # with this model, EOS comes only at each sentence's limit
    with _length_warnings() as found:
        sequences = model.generate(input_ids=ids, attention_mask=mask, num_beams=1)
    assert found == []
    assert sequences.shape == (2, 1 + 7 + 50)
    assert [row.tolist().index(2) for row in sequences] == [7 + 50, 3 + 50]


def _collate(rows: list[dict]) -> dict:
    """Right-padded sources (pad id 1) with their mask, and labels padded with -100."""
    width, target_width = (max(len(row[key]) for row in rows) for key in ("input_ids", "labels"))
    lengths = torch.tensor([len(row["input_ids"]) for row in rows])
    return {
        "input_ids": torch.tensor([row["input_ids"] + [1] * (width - len(row["input_ids"])) for row in rows]),
        "attention_mask": (torch.arange(width) < lengths[:, None]).long(),
        "labels": torch.tensor([row["labels"] + [-100] * (target_width - len(row["labels"])) for row in rows]),
    }


def test_seq2seq_trainer_predicts_with_the_per_sentence_limit_and_no_length_warning(tmp_path):
    """`Seq2SeqTrainer.predict` / `evaluate` with `predict_with_generate`: after its first batch the trainer writes
    `max_length=20` into the model's generation config, and every later batch warned "Both `max_new_tokens` (=...)
    and `max_length`(=20) seem to have been set"; the limit stays |X| + 50 (§6.1), quietly."""
    make_model(seed=0).save_pretrained(tmp_path / "model")
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model")
    rows = uneven_pairs()  # sources of 7, 4, 6 and 5 tokens, EOS included
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_eval_batch_size=2, predict_with_generate=True, report_to=[],
        use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = Seq2SeqTrainer(model=model, args=args, data_collator=_collate)
    with _length_warnings() as found:
        predictions = trainer.predict(rows).predictions
        trainer.evaluate(rows)
    assert model.generation_config.max_length == 20  # what the trainer wrote: the check is not vacuous
    assert found == []
    # Random weights: EOS comes only where the per-sentence limit forces it, after |X| + 50 tokens.
    eos = [row.tolist().index(2) for row in predictions]
    assert eos == [len(row["input_ids"]) + 50 for row in rows]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_cache_on_off_and_static_give_identical_outputs(num_beams):
    model = make_model(seed=5)
    ids, mask = padded_batch(seed=2, lengths=(6, 4, 5))
    kwargs = dict(input_ids=ids, attention_mask=mask, num_beams=num_beams, max_len_b=8)
    with_cache = model.generate(**kwargs, use_cache=True, output_scores=True, return_dict_in_generate=True)
    without = model.generate(**kwargs, use_cache=False, output_scores=True, return_dict_in_generate=True)
    # transformers' preallocated cache (`cache_implementation="static"`, what torch.compile'd decoding uses)
    static = model.generate(**kwargs, cache_implementation="static", output_scores=True, return_dict_in_generate=True)
    assert torch.equal(with_cache.sequences, without.sequences)
    assert torch.equal(static.sequences, without.sequences)
    if num_beams > 1:
        torch.testing.assert_close(with_cache.sequences_scores, without.sequences_scores, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(static.sequences_scores, without.sequences_scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_sentence_alone_or_in_padded_batch_gives_same_translation(num_beams):
    model = make_model(seed=7)
    lengths = (8, 3, 5)
    ids, mask = padded_batch(seed=4, lengths=lengths)
    batch = model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, max_len_b=10)
    for row, length in enumerate(lengths):
        alone = model.generate(input_ids=ids[row : row + 1, :length], num_beams=num_beams, max_len_b=10)
        generated = alone[0, 1:].tolist()
        n = generated.index(2) + 1 if 2 in generated else len(generated)
        assert batch[row, 1 : n + 1].tolist() == generated[:n]


def test_beam_search_finds_a_better_hypothesis_than_greedy_when_it_exists():
    model = make_model(seed=11)
    ids, mask = padded_batch(seed=3, lengths=(6, 5, 4, 7))
    beam = model.generate(
        input_ids=ids, attention_mask=mask, max_len_b=5, output_scores=True, return_dict_in_generate=True
    )
    greedy = model.generate(input_ids=ids, attention_mask=mask, max_len_b=5, num_beams=1)
    for row in range(4):
        length = int(mask[row].sum())
        source = ids[row : row + 1, :length]
        greedy_lp, greedy_len = teacher_forced_log_prob(model, source, None, greedy[row])
        greedy_score = greedy_lp / gnmt_length_penalty(greedy_len, 0.6)
        assert beam.sequences_scores[row].item() >= greedy_score - 1e-4


def test_per_sentence_limit_keeps_the_models_eos_score():
    processor = PerSentenceMaxLength(torch.tensor([2, 5]), eos_token_id=2)
    scores = torch.log_softmax(torch.randn(4, 10), -1)  # 2 sentences x 2 beams
    prompt = torch.zeros(4, 1, dtype=torch.long)
    assert torch.equal(processor(prompt, scores.clone()), scores)  # first token: nobody at the limit
    out = processor(torch.zeros(4, 2, dtype=torch.long), scores.clone())  # second token: sentence 0 must end
    assert torch.all(out[:2, [0, 1, 3, 4, 5, 6, 7, 8, 9]] == -float("inf"))
    assert torch.equal(out[:2, 2], scores[:2, 2])
    assert torch.equal(out[2:], scores[2:])


# ---------------------------------------------------------------------------------------------------------------
# The beam search against an exhaustive search: a model fitted on a 10-token vocabulary, whose hypotheses of at most
# TOY_MAX tokens (EOS included) can all be scored.

TOY_VOCAB = 10  # <s>=0 <pad>=1 </s>=2 <unk>=3 and the regular tokens 4..9
TOY_MAX = 5  # max_len_a=0, max_len_b=5: at most 5 generated tokens, EOS included
TOY_SOURCE = torch.tensor([[4, 5, 7, 2]])
# The translations of TOY_SOURCE the model is fitted to, with their counts: four short ones and a long one that
# starts like the most frequent short one. log P: "4 </s>" -1.32, "5" -1.46, "7" -1.61, "9" -1.79, "4 6 8 </s>" -2.01,
# so the long one wins under the GNMT score only for a large alpha (above about 1.7), and after the second token the
# four short ones are finished while the long one is still running.
TOY_TARGETS = {(4, 2): 8, (5, 2): 7, (7, 2): 6, (9, 2): 5, (4, 6, 8, 2): 4}
SHORT, LONG = (4, 2), (4, 6, 8, 2)
# num_beams at which nothing is ever pruned: at step 4, 9^3 running prefixes x 10 tokens are all in the top num_beams
# (the step-5 candidates are the 9^4 EOS endings, fewer), so every hypothesis is scored and kept if it is best.
EXHAUSTIVE_BEAMS = TOY_VOCAB * (TOY_VOCAB - 1) ** (TOY_MAX - 2)


@pytest.fixture(scope="module")
def toy_model():
    return fit_toy_model()


def fit_toy_model():
    """The tiny shape on the toy vocabulary, fitted (no dropout, no label smoothing) until its distribution over
    translations of TOY_SOURCE is about TOY_TARGETS' frequencies; every other token gets well under 1e-3."""
    model = make_model(seed=0, vocab_size=TOY_VOCAB, dropout=0.0, label_smoothing=0.0).train()
    targets = [list(target) for target, count in TOY_TARGETS.items() for _ in range(count)]
    width = max(map(len, targets))
    labels = torch.tensor([target + [-100] * (width - len(target)) for target in targets])
    source = TOY_SOURCE.expand(len(targets), -1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic and fast for tiny matrices
    try:
        for _ in range(100):
            model(input_ids=source, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


@pytest.fixture(scope="module")
def every_hypothesis(toy_model):
    """Every complete hypothesis Y (at most TOY_MAX tokens, ending in its only EOS) with log P(Y|X) from one batch of
    teacher-forced forward passes, summed in float64: (token tuples, log-probabilities, |Y| = generated tokens with
    the EOS, without the start token, as `_update_finished_beams` counts)."""
    others = [t for t in range(TOY_VOCAB) if t != 2]  # any token but EOS, the specials included: generate allows them
    prefixes = torch.tensor(list(itertools.product(others, repeat=TOY_MAX - 1)))  # 9^4 rows cover every prefix
    decoder_input = torch.cat([torch.zeros(len(prefixes), 1, dtype=torch.long), prefixes], dim=1)
    with torch.no_grad():
        logits = toy_model(input_ids=TOY_SOURCE.expand(len(prefixes), -1), decoder_input_ids=decoder_input).logits
    log_probs = logits.double().log_softmax(-1)  # [row, position, token]: position i predicts generated token i+1
    step = log_probs[:, :-1].gather(-1, prefixes[..., None])[..., 0]  # log P of each prefix token
    hypotheses, scores, lengths = [], [], []
    for length in range(1, TOY_MAX + 1):
        # one row per prefix of length - 1: the rows whose later tokens are all the first of `others`
        rows = (prefixes[:, length - 1 :] == others[0]).all(-1).nonzero()[:, 0]
        for row in rows.tolist():
            prefix = tuple(prefixes[row, : length - 1].tolist())
            hypotheses.append((*prefix, 2))
            scores.append(step[row, : length - 1].sum() + log_probs[row, length - 1, 2])
            lengths.append(length)
    assert len(hypotheses) == sum((TOY_VOCAB - 1) ** k for k in range(TOY_MAX))
    return hypotheses, torch.stack(scores), torch.tensor(lengths, dtype=torch.float64)


def exhaustive_best(every_hypothesis, alpha):
    """The exhaustive search: the hypothesis with the highest GNMT score log P(Y|X) / ((5 + |Y|) / 6)^alpha, its
    score, and the runner-up's score."""
    hypotheses, log_probs, lengths = every_hypothesis
    scores = log_probs / gnmt_length_penalty(lengths, alpha)
    top = scores.topk(2)
    return hypotheses[int(top.indices[0])], float(top.values[0]), float(top.values[1])


def toy_generate(model, **kwargs):
    """The toy model's search of TOY_SOURCE; the exact bound (early_stopping="never") unless `kwargs` say otherwise:
    only it is certain to find the exhaustive optimum."""
    kwargs.setdefault("early_stopping", "never")
    out = model.generate(
        input_ids=TOY_SOURCE, max_len_a=0, max_len_b=TOY_MAX, output_scores=True, return_dict_in_generate=True, **kwargs
    )
    generated = out.sequences[0, 1:].tolist()
    return tuple(generated[: generated.index(2) + 1]), float(out.sequences_scores[0]), len(out.scores)


def test_the_fitted_toy_model_puts_its_mass_on_the_five_translations(every_hypothesis):
    hypotheses, log_probs, _ = every_hypothesis
    total = sum(TOY_TARGETS.values())
    for target, count in TOY_TARGETS.items():
        assert log_probs[hypotheses.index(target)].exp().item() == pytest.approx(count / total, abs=0.01)
    assert log_probs.exp().sum().item() > 0.99  # nearly all the mass: the other hypotheses are negligible


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.5, 5.0])
def test_a_large_enough_beam_returns_the_exhaustive_gnmt_optimum(toy_model, every_hypothesis, alpha):
    best, best_score, runner_up = exhaustive_best(every_hypothesis, alpha)
    assert best_score - runner_up > 1e-3  # a clear optimum, not a float tie
    found, score, _ = toy_generate(toy_model, num_beams=EXHAUSTIVE_BEAMS, length_penalty=alpha)
    assert found == best
    assert score == pytest.approx(best_score, abs=1e-5)


def test_alpha_decides_between_hypotheses_of_different_lengths_as_the_exhaustive_search_does(
    toy_model, every_hypothesis
):
    """The paper's beam of 4: alpha 0, 0.6 and 1 keep the more probable short translation, a large alpha the long one
    (the exhaustive search's choice in each case), and each returned score is its hypothesis's own GNMT score."""
    chosen = {}
    for alpha in (0.0, 0.6, 1.0, 2.5, 5.0):
        best, best_score, _ = exhaustive_best(every_hypothesis, alpha)
        found, score, _ = toy_generate(toy_model, length_penalty=alpha)  # num_beams 4: the model's default
        assert found == best
        log_prob, length = teacher_forced_log_prob(toy_model, TOY_SOURCE, None, torch.tensor([0, *found]))
        assert length == len(found)
        assert score == pytest.approx(log_prob / gnmt_length_penalty(length, alpha), abs=1e-5)
        assert score == pytest.approx(best_score, abs=1e-5)
        chosen[alpha] = found
    assert chosen == {0.0: SHORT, 0.6: SHORT, 1.0: SHORT, 2.5: LONG, 5.0: LONG}


def test_the_default_rule_stops_once_four_have_finished_where_the_bound_searches_on(toy_model, every_hypothesis):
    """fairseq's rule (the default, early_stopping=True) ends the search when the beam's four hypotheses have
    finished: at alpha 2.5 that is before the long translation, the exhaustive optimum the exact bound finds, is."""
    assert toy_model.generation_config.early_stopping is True
    found, _, steps = toy_generate(toy_model, length_penalty=2.5, early_stopping=True)
    exact, _, exact_steps = toy_generate(toy_model, length_penalty=2.5)
    assert exact == LONG == exhaustive_best(every_hypothesis, 2.5)[0] and found != LONG and steps < exact_steps


def _record_early_stop_checks(monkeypatch):
    """Every call of the search's early-termination bound (`can_improve`, once per decoding step), with its result."""
    calls = []
    check = beam_search_vaswani.can_improve

    def recording(**kwargs):
        result = check(**kwargs)
        calls.append({**{k: v.clone() if torch.is_tensor(v) else v for k, v in kwargs.items()}, "result": result})
        return result

    monkeypatch.setattr(beam_search_vaswani, "can_improve", recording)
    return calls


def _bound_says_go_on(call, alpha, never: bool) -> bool:
    """The early-termination rule, recomputed: go on while the best running hypothesis (log P < 0 only falls as it
    grows), divided by the largest GNMT penalty it could still reach (at TOY_MAX tokens; with alpha 0 or
    early_stopping=False: at its current length), beats the worst of the num_beams finished ones."""
    best_running = call["running_scores"][0, 0].item()
    reach = TOY_MAX if never and alpha > 0 else call["generated"]
    if not call["is_finished"].all():
        return True  # a free place among the finished: anything may still enter
    return best_running / gnmt_length_penalty(reach, alpha) > call["finished_scores"].min().item()


@pytest.mark.parametrize(
    ("alpha", "early_stopping", "steps", "returned"),
    [
        # The paper's bound (early_stopping="never" with alpha > 0). After step 2 the four short translations are
        # finished and "4 6" runs on: at TOY_MAX tokens its score could still beat them, so the search goes on and
        # finds the long translation, the exhaustive optimum; after step 4 nothing running can win any more (the
        # best running log P, about -9, over the penalty of 5 tokens is below the worst finished): it stops.
        (2.5, "never", 4, LONG),
        # transformers' early_stopping=False bounds with the current length instead: after step 2, "4 6" divided by
        # the penalty of 2 tokens is below the worst finished, so it stops there and returns a worse translation.
        (2.5, False, 2, SHORT),
        # A large alpha loosens the bound: after step 4 a running hypothesis of log P about -9 could still beat the
        # worst finished at 5 tokens, so the search runs to TOY_MAX (and still returns the optimum).
        (8.0, "never", TOY_MAX, LONG),
        # The paper's alpha: the bound keeps the search going until step 4; the short translation stays the best.
        (0.6, "never", 4, SHORT),
        # alpha 0: the penalty is 1 and log P only falls, so stopping as soon as the finished are full is exact.
        (0.0, "never", 2, SHORT),
    ],
)
def test_early_termination_follows_the_bound_and_loses_no_better_hypothesis(
    monkeypatch, toy_model, every_hypothesis, alpha, early_stopping, steps, returned
):
    calls = _record_early_stop_checks(monkeypatch)
    found, score, decoded = toy_generate(toy_model, length_penalty=alpha, early_stopping=early_stopping)
    assert (found, decoded, len(calls)) == (returned, steps, steps)
    go_on = [bool(call["result"].item()) for call in calls]
    assert go_on == [_bound_says_go_on(call, alpha, early_stopping == "never") for call in calls]
    assert go_on == [True] * (steps - 1) + [False]  # it decoded exactly until the bound said stop
    # What it returns is the best finished hypothesis, and, where it stopped, nothing still running could have done
    # better: the best running log P over the penalty of TOY_MAX tokens is below the returned score.
    last = calls[-1]
    best_running = last["running_scores"][0, 0].item()
    assert score == pytest.approx(last["finished_scores"].max().item(), abs=1e-6)
    best, best_score, _ = exhaustive_best(every_hypothesis, alpha)
    if early_stopping == "never":
        assert best_running / gnmt_length_penalty(TOY_MAX, alpha) < score
        assert (found, score) == (best, pytest.approx(best_score, abs=1e-5))
    else:  # transformers' heuristic stopped although the long translation running on could still beat it
        assert best_running / gnmt_length_penalty(TOY_MAX, alpha) > score
        assert best == LONG and best_score > score + 0.1


# ---------------------------------------------------------------------------------------------------------------
# The search is ours (beam_search_vaswani.beam_search), on public API only. The oracle: transformers' own beam search
# with the paper's rules hooked into its private methods, as the payload did before (commit 56db6a8); test code only.


class HookedTransformersSearch(VaswaniForConditionalGeneration):
    """transformers' `_beam_search` with the GNMT penalty for finished hypotheses, the bound with it, the
    per-sentence limit and self-attention-only reordering hooked in."""

    def generate(self, input_ids, attention_mask, **kwargs):
        lengths = attention_mask.sum(-1)
        limits = (lengths * kwargs.pop("max_len_a", 1) + kwargs.pop("max_len_b", 50)).long().clamp(min=1)
        if "max_new_tokens" not in kwargs and "max_length" not in kwargs:
            kwargs.update(max_new_tokens=int(limits.max()), max_length=None)
            kwargs["logits_processor"] = [PerSentenceMaxLength(limits, self.config.eos_token_id)]
        return GenerationMixin.generate(self, input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def _reorder_cache(self, cache, beam_idx):
        cache.self_attention_cache.reorder_cache(beam_idx)
        return cache

    def _update_finished_beams(self, **kwargs):
        length = kwargs["cur_len"] + 1 - kwargs["decoder_prompt_len"]
        kwargs["topk_log_probs"] = kwargs["topk_log_probs"] / gnmt_length_penalty(length, kwargs["length_penalty"])
        kwargs["length_penalty"] = 0.0
        return GenerationMixin._update_finished_beams(self, **kwargs)

    @staticmethod
    def _check_early_stop_heuristic(is_early_stop_heuristic_unsatisfied, running_beam_scores, beam_scores,
                                    is_sent_finished, cur_len, max_length, decoder_prompt_len, early_stopping,
                                    length_penalty):  # fmt: skip
        return beam_search_vaswani.can_improve(
            improvable=is_early_stop_heuristic_unsatisfied, running_scores=running_beam_scores,
            finished_scores=beam_scores, is_finished=is_sent_finished, generated=cur_len - decoder_prompt_len,
            longest=max_length - decoder_prompt_len, early_stopping=early_stopping, alpha=length_penalty,
        )  # fmt: skip


_HOOKS = ("_beam_search", "_update_finished_beams", "_check_early_stop_heuristic", "_reorder_cache")


@pytest.mark.skipif(not all(hasattr(GenerationMixin, hook) for hook in _HOOKS[:3]),
                    reason="this transformers has no private beam-search methods of these names to hook")  # fmt: skip
@pytest.mark.parametrize(
    "options",
    [{"num_beams": 4, "length_penalty": 0.6}, {"num_beams": 4, "length_penalty": 1.2},
     {"num_beams": 8, "length_penalty": 1.2}, {"num_beams": 2, "length_penalty": 0.0},
     {"num_beams": 4, "num_return_sequences": 3}, {"num_beams": 4, "early_stopping": False},
     {"num_beams": 4, "early_stopping": True}, {"num_beams": 4, "max_new_tokens": 5},
     {"num_beams": 4, "no_repeat_ngram_size": 2, "bad_words_ids": [[5], [6, 7]], "min_length": 6},
     {"num_beams": 4, "output_logits": True, "max_len_b": 3}],
)  # fmt: skip
def test_our_beam_search_returns_what_transformers_search_with_the_papers_rules_returns(options, monkeypatch):
    """Tokens, `sequences_scores`, `beam_indices`, every step's `scores` and `logits`: equal, bit for bit, on random
    tiny models and padded batches, with every row kept as transformers keeps them (finished sentences leaving the
    batch change the shapes, and the left rows' scores: tests/model/test_sentences_leave_the_batch.py)."""
    monkeypatch.setattr(beam_search_vaswani, "_sentences_can_leave", lambda *args: False)
    for seed in range(3):
        ours = make_model(seed=seed, vocab_size=60)
        oracle = HookedTransformersSearch(ours.config).eval()
        oracle.load_state_dict(ours.state_dict())
        oracle.generation_config = ours.generation_config
        ids, mask = padded_batch(seed=seed, lengths=(9, 4, 6, 2), vocab=60)
        kwargs = dict(input_ids=ids, attention_mask=mask, output_scores=True, return_dict_in_generate=True, **options)
        a, b = ours.generate(**kwargs), oracle.generate(**kwargs)
        assert type(a) is type(b)
        for field in ("sequences", "sequences_scores", "beam_indices"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (seed, field)
        for field in ("scores", "logits"):
            ours_steps, theirs = getattr(a, field), getattr(b, field)
            assert (ours_steps is None) == (theirs is None), field
            assert ours_steps is None or all(torch.equal(x, y) for x, y in zip(ours_steps, theirs, strict=True))


def test_the_payload_overrides_no_private_method_of_transformers():
    """A private method of `GenerationMixin` or `PreTrainedModel` that a later transformers renames would no longer
    be called, in silence: the payload's classes define none of them."""
    from vaswani_mt.model import modeling_vaswani

    theirs = {name for base in (GenerationMixin, PreTrainedModel) for klass in base.__mro__ for name in vars(klass)}
    private = {name for name in theirs if name.startswith("_") and not name.startswith("__")}
    modules = (modeling_vaswani, generation_vaswani, beam_search_vaswani)
    classes = [value for module in modules for value in vars(module).values()
               if isinstance(value, type) and value.__module__ == module.__name__]  # fmt: skip
    overridden = sorted(
        f"{klass.__name__}.{name}"
        for klass in classes
        for name, value in vars(klass).items()
        if name in private and (isinstance(value, (staticmethod, classmethod)) or callable(value))
    )
    # `_init_weights` is the hook transformers documents for a model's own initialisation (its models all define it)
    assert overridden == ["VaswaniPreTrainedModel._init_weights"], overridden
