"""The paper's beam search (§6.1) from `generate()`: GNMT length penalty, per-sentence maximum length, caching."""

import pytest
import torch
from conftest import make_model, padded_batch

from vaswani_mt import gnmt_length_penalty
from vaswani_mt.modeling_vaswani import PerSentenceMaxLength


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
    assert (config.num_beams, config.length_penalty, config.early_stopping) == (4, 0.6, "never")
    assert (config.max_len_a, config.max_len_b) == (1, 50)
    assert (config.decoder_start_token_id, config.eos_token_id, config.pad_token_id) == (0, 2, 1)


def test_paper_defaults_survive_save_and_load(model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).generation_config
    assert (loaded.num_beams, loaded.length_penalty, loaded.max_len_a, loaded.max_len_b) == (4, 0.6, 1, 50)


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
    sequences = model.generate(input_ids=ids, attention_mask=mask, min_new_tokens=9, max_new_tokens=9, num_beams=2)
    assert sequences.shape == (2, 10)


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
