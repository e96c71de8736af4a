"""Ensembles (`vaswani_mt.inference.ensemble`): at each step the mean of the members' probabilities, searched with the
single model's beam search (§6.1: GNMT penalty, |X| + 50, the early-termination bound), checked against the members
computed by hand and against an exhaustive search; models of different vocabularies are refused."""

import copy
import itertools
import math

import pytest
import torch
from conftest import SENTENCES, make_model, padded_batch

from vaswani_mt import gnmt_length_penalty
from vaswani_mt.data.tokenization import train_tokenizer
from vaswani_mt.inference.ensemble import EnsembleCache, VaswaniEnsemble, ensemble, load_ensemble
from vaswani_mt.inference.loading import ModelFolderError
from vaswani_mt.inference.translate import translate, translate_nbest
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration

# one_thread: tiny matrices, for which one thread is many times faster
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]


def mean_of_probabilities(models, ids, mask, decoder_input) -> torch.Tensor:
    """log (1/M) sum_m softmax(logits_m), by hand from each model's own teacher-forced forward pass, in float64."""
    with torch.no_grad():
        probs = [
            m(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_input).logits.double().softmax(-1)
            for m in models
        ]
    return torch.stack(probs).mean(0).log()


@pytest.mark.parametrize("num_beams", [1, 4])
def test_an_ensemble_of_one_model_gives_its_tokens_and_scores(num_beams):
    model = make_model(seed=3)
    ids, mask = padded_batch(seed=1, lengths=(6, 3, 5))
    kwargs = dict(input_ids=ids, attention_mask=mask, num_beams=num_beams, max_len_b=6, output_scores=True,
                  output_logits=True, return_dict_in_generate=True)  # fmt: skip
    single, alone = model.generate(**kwargs), ensemble([model]).generate(**kwargs)
    assert torch.equal(alone.sequences, single.sequences)
    if num_beams > 1:
        torch.testing.assert_close(alone.sequences_scores, single.sequences_scores, atol=1e-5, rtol=0)
    else:  # greedy search returns the raw logits: the ensemble's are the model's log-softmax
        for ours, theirs in zip(alone.logits, single.logits, strict=True):
            torch.testing.assert_close(ours, theirs.log_softmax(-1), atol=1e-5, rtol=0)


def test_two_copies_of_one_model_search_as_that_model():
    model = make_model(seed=5)
    ids, mask = padded_batch(seed=2, lengths=(6, 4, 5))
    kwargs = dict(input_ids=ids, attention_mask=mask, max_len_b=8, output_scores=True, return_dict_in_generate=True)
    single = model.generate(**kwargs)
    twice = ensemble([model, copy.deepcopy(model)]).generate(**kwargs)
    assert torch.equal(twice.sequences, single.sequences)
    torch.testing.assert_close(twice.sequences_scores, single.sequences_scores, atol=1e-5, rtol=0)


def test_an_ensemble_of_one_folder_twice_translates_as_the_folder(fitted, fitted_folder):
    model, tokenizer = fitted
    pair, same_tokenizer = load_ensemble([str(fitted_folder)] * 2, device="cpu")
    assert isinstance(pair, VaswaniEnsemble) and len(pair.members) == 2
    assert same_tokenizer.get_vocab() == tokenizer.get_vocab()
    sources = [en for en, _ in SENTENCES]
    assert translate(pair, tokenizer, sources) == translate(model, tokenizer, sources)
    assert [h.text for h, *_ in translate_nbest(pair, tokenizer, sources, 2)] == translate(model, tokenizer, sources)
    one, _ = load_ensemble([str(fitted_folder)], device="cpu")
    assert isinstance(one, VaswaniForConditionalGeneration)  # one folder: the model itself, no wrapper


def test_each_step_is_the_mean_of_the_members_probabilities():
    first, second = make_model(seed=1), make_model(seed=2)
    ids, mask = padded_batch(seed=3, lengths=(5, 7))
    prefix = torch.tensor([[0, 17, 42, 99], [0, 150, 3, 8]])
    with torch.no_grad():
        logits = ensemble([first, second])(input_ids=ids, attention_mask=mask, decoder_input_ids=prefix).logits
    expected = mean_of_probabilities([first, second], ids, mask, prefix)
    torch.testing.assert_close(logits.double(), expected, atol=1e-5, rtol=0)
    assert torch.allclose(logits.exp().sum(-1), torch.ones(2, 4))  # a distribution: log_softmax leaves it as it is
    # Not either member's distribution, nor the mean of their log-probabilities (a product of experts):
    with torch.no_grad():
        own = [m(input_ids=ids, attention_mask=mask, decoder_input_ids=prefix).logits.log_softmax(-1)
               for m in (first, second)]  # fmt: skip
    assert all((logits - log_probs).abs().max() > 0.01 for log_probs in own)
    assert (logits - (own[0] + own[1]) / 2).abs().max() > 0.01


def test_every_cached_decoding_step_is_the_mean_of_the_members_probabilities():
    """Greedy search with each member's KV cache: every step's distribution is the one computed by hand from the
    members without a cache, on the prefix decoded so far."""
    models = [make_model(seed=1), make_model(seed=2), make_model(seed=7)]
    ids, mask = padded_batch(seed=4, lengths=(6, 4))
    out = ensemble(models).generate(input_ids=ids, attention_mask=mask, num_beams=1, max_new_tokens=6,
                                    output_logits=True, return_dict_in_generate=True)  # fmt: skip
    expected = mean_of_probabilities(models, ids, mask, out.sequences[:, :-1])
    for step, logits in enumerate(out.logits):
        torch.testing.assert_close(logits.double(), expected[:, step], atol=1e-5, rtol=0)


def returned_cache(output):
    """The KV cache of a generate() output: `cache` from transformers 5.24, `past_key_values` before."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_ensemble_searches_the_same_with_and_without_the_cache(num_beams):
    """The members' caches follow the beams (reordered after every step): decoding with them gives what decoding
    each step from scratch gives."""
    pair = ensemble([make_model(seed=5), make_model(seed=6)])
    ids, mask = padded_batch(seed=2, lengths=(6, 4, 5))
    kwargs = dict(input_ids=ids, attention_mask=mask, num_beams=num_beams, max_len_b=8, output_scores=True,
                  return_dict_in_generate=True)  # fmt: skip
    cached, uncached = pair.generate(**kwargs, use_cache=True), pair.generate(**kwargs, use_cache=False)
    cache = returned_cache(cached)
    assert isinstance(cache, EnsembleCache) and len(cache.caches) == 2
    assert torch.equal(cached.sequences, uncached.sequences)
    if num_beams > 1:
        torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, atol=1e-5, rtol=0)


def test_each_sentence_stops_at_its_own_input_length_plus_50():
    pair = ensemble([make_model(seed=0), make_model(seed=1)])  # random weights: EOS only where the limit forces it
    ids, mask = padded_batch(seed=0, lengths=(7, 3))
    sequences = pair.generate(input_ids=ids, attention_mask=mask)
    assert [row[1:].tolist().index(2) + 1 for row in sequences] == [7 + 50, 3 + 50]


def test_the_search_hooks_are_the_single_models():
    """The GNMT penalty, the early-termination bound and the per-sentence limit are the single model's code."""
    assert VaswaniEnsemble.generate is VaswaniForConditionalGeneration.generate  # which runs `beam_search`
    model = make_model()
    model.generation_config.length_penalty = 1.3
    assert ensemble([model, make_model(seed=1)]).generation_config.to_dict() == model.generation_config.to_dict()


# ---------------------------------------------------------------------------------------------------------------
# Against an exhaustive search (as tests/model/test_generation.py checks one model): two models fitted on a
# 10-token vocabulary to different distributions over translations of TOY_SOURCE; every hypothesis of at most
# TOY_MAX tokens is scored with the ensemble's distribution, computed by hand from the members.

TOY_VOCAB, TOY_MAX = 10, 5  # <s>=0 <pad>=1 </s>=2 <unk>=3, regular tokens 4..9; at most 5 tokens, EOS included
TOY_SOURCE = torch.tensor([[4, 5, 7, 2]])
TOY_TARGETS = (
    {(4, 2): 8, (5, 2): 7, (7, 2): 6, (9, 2): 5, (4, 6, 8, 2): 4},
    {(5, 2): 8, (4, 6, 8, 2): 7, (4, 2): 6, (7, 2): 5, (9, 2): 4},
)
ALPHAS = (0.0, 0.6, 1.0, 2.5, 5.0)
EXHAUSTIVE_BEAMS = TOY_VOCAB * (TOY_VOCAB - 1) ** (TOY_MAX - 2)  # nothing is ever pruned (test_generation.py)


def _fit(targets: dict, seed: int) -> VaswaniForConditionalGeneration:
    model = make_model(seed=seed, vocab_size=TOY_VOCAB, dropout=0.0, label_smoothing=0.0).train()
    rows = [list(target) for target, count in targets.items() for _ in range(count)]
    labels = torch.tensor([row + [-100] * (TOY_MAX - len(row)) for row in rows])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):
        model(input_ids=TOY_SOURCE.expand(len(rows), -1), labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


@pytest.fixture(scope="module")
def toy_models():
    return [_fit(targets, seed) for seed, targets in enumerate(TOY_TARGETS)]


def _every_hypothesis(log_probs: torch.Tensor, prefixes: torch.Tensor) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Every hypothesis (ending in its only EOS) with its log P(Y|X) and |Y|, from per-step log-probabilities over
    every prefix (`log_probs[row, position, token]`)."""
    others = [t for t in range(TOY_VOCAB) if t != 2]
    step = log_probs[:, :-1].gather(-1, prefixes[..., None])[..., 0]
    hypotheses, scores, lengths = [], [], []
    for length in range(1, TOY_MAX + 1):
        for row in (prefixes[:, length - 1 :] == others[0]).all(-1).nonzero()[:, 0].tolist():
            hypotheses.append((*prefixes[row, : length - 1].tolist(), 2))
            scores.append(step[row, : length - 1].sum() + log_probs[row, length - 1, 2])
            lengths.append(length)
    return hypotheses, torch.stack(scores), torch.tensor(lengths, dtype=torch.float64)


@pytest.fixture(scope="module")
def exhaustive(toy_models):
    """alpha -> the GNMT optimum (hypothesis, score, margin over the runner-up) for the ensemble and each member."""
    others = [t for t in range(TOY_VOCAB) if t != 2]
    prefixes = torch.tensor(list(itertools.product(others, repeat=TOY_MAX - 1)))  # 9^4 rows cover every prefix
    decoder_input = torch.cat([torch.zeros(len(prefixes), 1, dtype=torch.long), prefixes], dim=1)
    source = TOY_SOURCE.expand(len(prefixes), -1)
    with torch.no_grad():
        members = [m(input_ids=source, decoder_input_ids=decoder_input).logits.double().log_softmax(-1)
                   for m in toy_models]  # fmt: skip
    mean = torch.logsumexp(torch.stack(members), dim=0) - math.log(len(members))
    best = {}
    for name, log_probs in [("ensemble", mean), *((f"member {i}", lp) for i, lp in enumerate(members))]:
        hypotheses, scores, lengths = _every_hypothesis(log_probs, prefixes)
        assert scores.exp().sum() > 0.99  # nearly all the mass: nothing left out
        for alpha in ALPHAS:
            top = (scores / gnmt_length_penalty(lengths, alpha)).topk(2)
            margin = float(top.values[0] - top.values[1])
            best[name, alpha] = hypotheses[int(top.indices[0])], float(top.values[0]), margin
    return best


def _toy_search(model, **kwargs):
    out = model.generate(input_ids=TOY_SOURCE, max_len_a=0, max_len_b=TOY_MAX, output_scores=True,
                         return_dict_in_generate=True, **kwargs)  # fmt: skip
    generated = out.sequences[0, 1:].tolist()
    return tuple(generated[: generated.index(2) + 1]), float(out.sequences_scores[0])


@pytest.mark.parametrize("alpha", ALPHAS)
def test_the_papers_beam_returns_the_exhaustive_gnmt_optimum_of_the_ensemble(toy_models, exhaustive, alpha):
    best, best_score, margin = exhaustive["ensemble", alpha]
    assert margin > 1e-2  # a clear optimum, not a float tie
    # The exact bound (early_stopping="never"): fairseq's rule, the default, may stop before a long optimum.
    found = _toy_search(ensemble(toy_models), length_penalty=alpha, early_stopping="never")
    assert found == (best, pytest.approx(best_score, abs=1e-5))


def test_a_beam_that_prunes_nothing_returns_the_exhaustive_optimum_too(toy_models, exhaustive):
    best, best_score, _ = exhaustive["ensemble", 0.6]
    found = _toy_search(ensemble(toy_models), num_beams=EXHAUSTIVE_BEAMS, length_penalty=0.6)
    assert found == (best, pytest.approx(best_score, abs=1e-5))


def test_the_ensembles_choice_is_neither_members(exhaustive):
    """At the paper's alpha the members prefer "4 </s>" and "4 6 8 </s>"; the mean of their distributions prefers
    "5 </s>": the tests above would fail for a search that followed one member."""
    chosen = {name: exhaustive[name, 0.6][0] for name in ("ensemble", "member 0", "member 1")}
    assert chosen == {"ensemble": (5, 2), "member 0": (4, 2), "member 1": (4, 6, 8, 2)}


# ---------------------------------------------------------------------------------------------------------------
# One vocabulary


def _save(folder, model, tokenizer) -> str:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_models_of_different_tokenizers_are_refused_in_one_line_naming_both_folders(tokenizer, tmp_path):
    other = train_tokenizer([de for _, de in SENTENCES] * 4, vocab_size=120, min_frequency=1)
    first = _save(tmp_path / "first", make_model(), tokenizer)
    second = _save(tmp_path / "second", make_model(seed=1), other)
    with pytest.raises(ModelFolderError) as error:
        load_ensemble([first, second], device="cpu")
    message = str(error.value)
    assert "\n" not in message and first in message and second in message, message
    assert "not the same vocabulary" in message and "tokenizers" in message, message


def test_models_of_different_vocabulary_sizes_are_refused_naming_both(tokenizer, tmp_path):
    first = _save(tmp_path / "first", make_model(), tokenizer)
    second = _save(tmp_path / "second", make_model(vocab_size=256), tokenizer)  # the same tokenizer fits both
    with pytest.raises(ModelFolderError) as error:
        load_ensemble([first, second], device="cpu")
    assert str(error.value) == (
        f"{first} and {second} cannot be ensembled: not the same vocabulary (vocab_size is 200 and 256)"
    )
    with pytest.raises(ValueError) as error:
        ensemble([make_model(), make_model(vocab_size=10)])
    assert str(error.value) == (
        "model 1 and model 2 cannot be ensembled: not the same vocabulary (vocab_size is 200 and 10)"
    )


def test_an_ensemble_is_not_saved_as_one_model(tmp_path):
    with pytest.raises(NotImplementedError, match="save its members, or average them"):
        ensemble([make_model(), make_model(seed=1)]).save_pretrained(tmp_path)
    assert not any(tmp_path.iterdir())


def test_the_translate_command_takes_several_models_and_refuses_two_vocabularies(fitted_folder, tmp_path, capfdbinary):
    """`translate.py --model A --model A` gives A's translations; a second vocabulary ends in one line."""
    from vaswani_mt.cli.translate import main

    source = tmp_path / "in.en"
    source.write_text("\n".join(en for en, _ in SENTENCES[:3]) + "\n", encoding="utf-8")
    outputs = []
    for models in ([fitted_folder], [fitted_folder, fitted_folder]):
        main(
            [arg for folder in models for arg in ("--model", str(folder))]
            + ["--input", str(source), "--num_beams", "2"]
        )
        outputs.append(capfdbinary.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].count(b"\n") == 3
    other = tmp_path / "other"
    tokenizer = train_tokenizer(["Ein ganz anderer Satz.", "A quite different sentence."] * 5, vocab_size=80,
                                min_frequency=1)  # fmt: skip
    make_model(vocab_size=len(tokenizer)).save_pretrained(other)
    tokenizer.save_pretrained(other)
    with pytest.raises(SystemExit) as exit_:
        main(["--model", str(fitted_folder), "--model", str(other), "--input", str(source)])
    assert str(exit_.value.code).startswith("error: ") and str(other) in str(exit_.value.code)
    assert "\n" not in str(exit_.value.code)
