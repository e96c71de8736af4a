"""Finished sentences leave the beam search's batch (beam_search_vaswani.py, as fairseq's `SequenceGenerator`): a
sentence that can no longer improve drops its rows of the running beams, the encoder states, the KV cache and its
controls, and every sentence still gets what it gets alone; where every row must stay (per-step outputs, stopping
criteria, a processor with state per row), the search keeps them all."""

from types import SimpleNamespace

import pytest
import torch
from conftest import make_model, padded_batch
from test_constraints import contains, generated
from transformers import LogitsProcessor, LogitsProcessorList, MaxLengthCriteria, StoppingCriteriaList

from vaswani_mt.model import beam_search_vaswani

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]

LENGTHS = (9, 4, 6, 2)  # with a random model EOS comes only at a sentence's limit, |X| + max_len_b: at 4 times


class Recorded:
    """One search's record: the rows each decoder step was given, and the GNMT score of each sentence's best
    finished hypothesis (what `sequences_scores` holds, recorded because that needs `output_scores`, which keeps
    every row)."""

    def __init__(self):
        self.rows, self.scores = [], None


@pytest.fixture
def record(monkeypatch):
    """Runs `model.generate(**kwargs)` and returns (its output, a `Recorded`); `leave=False`: with every sentence kept
    to the end, the search as it was before sentences could leave."""
    output = beam_search_vaswani._output

    def run(model, leave: bool = True, **kwargs):
        recorded = Recorded()

        def recording_output(finished, *args):
            recorded.scores = finished.scores[:, 0].clone()
            return output(finished, *args)

        forward = model.forward

        def counting_forward(*args, **forward_kwargs):
            recorded.rows.append(forward_kwargs["decoder_input_ids"].shape[0])
            return forward(*args, **forward_kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(beam_search_vaswani, "_output", recording_output)
            patch.setattr(model, "forward", counting_forward)
            if not leave:
                patch.setattr(beam_search_vaswani, "_sentences_can_leave", lambda *args: False)
            return model.generate(**kwargs), recorded

    return run


def searched(rows: list[int], lengths=LENGTHS, max_len_b: int = 5, beams: int = 4) -> bool:
    """Whether the decoder's rows at each step were exactly the beams of the sentences not yet at their limit (at the
    first step, where every beam is the decoder start, one row a sentence)."""
    return rows == [(1 if step == 0 else beams) * sum(step < length + max_len_b for length in lengths)
                    for step in range(len(rows))]  # fmt: skip


def every_row(rows: list[int], first: int = 4) -> bool:
    """Whether the decoder had every sentence's beams (16 rows) at every step after the first (`first` rows)."""
    return rows == [first] + [16] * (len(rows) - 1)


@pytest.mark.parametrize(
    "options",
    [{}, {"early_stopping": "never"}, {"early_stopping": False}, {"num_return_sequences": 2},
     {"no_repeat_ngram_size": 2, "min_length": 4}],
)  # fmt: skip
def test_a_sentence_that_cannot_improve_leaves_the_batch_and_the_others_get_the_same(record, options):
    """Tokens, beam indices (in the whole batch's numbering) and scores as with every sentence kept to the end; the
    decoder's batch shrinks as each sentence reaches its limit."""
    for seed in range(2):
        model = make_model(seed=seed, vocab_size=60)
        ids, mask = padded_batch(seed=seed, lengths=LENGTHS, vocab=60)
        kwargs = dict(input_ids=ids, attention_mask=mask, max_len_b=5, return_dict_in_generate=True, **options)
        leaving, left = record(model, **kwargs)
        kept, all_kept = record(model, leave=False, **kwargs)
        assert searched(left.rows) and every_row(all_kept.rows)
        assert torch.equal(leaving.sequences, kept.sequences)
        assert torch.equal(leaving.beam_indices, kept.beam_indices)
        torch.testing.assert_close(left.scores, all_kept.scores, atol=1e-4, rtol=0)


def test_each_sentence_gets_what_it_gets_translated_alone(record):
    model = make_model(seed=7)
    ids, mask = padded_batch(seed=4, lengths=LENGTHS)
    batch, recorded = record(model, input_ids=ids, attention_mask=mask, max_len_b=5)
    assert searched(recorded.rows)
    for row, length in enumerate(LENGTHS):
        alone, alone_recorded = record(model, input_ids=ids[row : row + 1, :length], max_len_b=5)
        assert generated(batch[row]) == generated(alone[0])
        assert recorded.scores[row].item() == pytest.approx(alone_recorded.scores[0].item(), abs=1e-4)


def test_constraints_and_target_prefixes_are_still_met_as_sentences_leave(record):
    """Constrained sentences, sentences with a target prefix and plain ones in one batch: each output has its
    phrases and prefix, `constraints_met` says so in batch order, and all is as with every sentence kept."""
    model = make_model(seed=4)
    ids, mask = padded_batch(seed=3, lengths=LENGTHS)
    constraints = [[[17, 18]], [], [[60], [61, 62]], []]
    prefixes = [[], [30, 31], [40], []]
    kwargs = dict(input_ids=ids, attention_mask=mask, max_len_b=6, constraints=constraints, target_prefix=prefixes,
                  return_dict_in_generate=True)  # fmt: skip
    leaving, left = record(model, **kwargs)
    kept, _ = record(model, leave=False, **kwargs)
    assert searched(left.rows, max_len_b=6)
    assert torch.equal(leaving.sequences, kept.sequences)
    assert torch.equal(leaving.constraints_met, kept.constraints_met) and leaving.constraints_met.all()
    for row, (phrases, prefix) in enumerate(zip(constraints, prefixes, strict=True)):
        tokens = generated(leaving.sequences[row])
        assert tokens[: len(prefix)] == prefix
        assert all(contains(tokens, phrase) for phrase in phrases)


class _RowCounter(LogitsProcessor):
    """A caller's processor that keeps a count per row: it needs every row at every step."""

    def __init__(self):
        self.calls = None

    def __call__(self, input_ids, scores):
        self.calls = torch.zeros(input_ids.shape[0]) if self.calls is None else self.calls
        self.calls += 1  # fails if the rows change
        return scores


@pytest.mark.parametrize(
    "options",
    [{"output_logits": True}, {"output_attentions": True},
     {"output_hidden_states": True}, {"stopping_criteria": StoppingCriteriaList([MaxLengthCriteria(40)])},
     {"logits_processor": LogitsProcessorList([_RowCounter()])}],
)  # fmt: skip
def test_where_every_row_is_needed_the_search_keeps_them_all(record, options):
    """Per-step outputs keep their shape (batch * num_beams, ...) at every step; a stopping criterion or a processor
    with state per row sees every row."""
    model = make_model(seed=0, vocab_size=60)
    if options.get("output_attentions"):
        model.set_attn_implementation("eager")  # the attention weights are the eager implementation's
    ids, mask = padded_batch(seed=0, lengths=LENGTHS, vocab=60)
    out, recorded = record(model, input_ids=ids, attention_mask=mask, max_len_b=5, return_dict_in_generate=True,
                           **options)  # fmt: skip
    first = 16 if options.get("output_attentions") or options.get("output_hidden_states") else 4  # per-step outputs
    assert every_row(recorded.rows, first) and len(recorded.rows) == max(LENGTHS) + 5
    plain, _ = record(model, leave=False, input_ids=ids, attention_mask=mask, max_len_b=5, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain.sequences)
    steps = out.scores or out.logits or out.decoder_attentions or out.decoder_hidden_states or []
    for step in steps:
        first = step if torch.is_tensor(step) else step[0]
        assert first.shape[0] == 16


def test_the_first_step_decodes_one_row_a_sentence_and_its_beams_get_what_every_row_gave(record, monkeypatch):
    """Every beam starts as the decoder start: the first step runs once a sentence, its cache then copied to each
    beam (as CTranslate2); tokens and n-best scores are those of the first step over every beam."""
    model = make_model(seed=2, vocab_size=60)
    ids, mask = padded_batch(seed=2, lengths=LENGTHS, vocab=60)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_len_b=5, return_dict_in_generate=True, output_scores=True,
                  num_return_sequences=2)  # fmt: skip
    alone, recorded = record(model, **kwargs)
    decoder = beam_search_vaswani._Decoder

    class EveryRow(decoder):
        def __init__(self, *args):
            super().__init__(*args)
            self.first_alone = False

    monkeypatch.setattr(beam_search_vaswani, "_Decoder", EveryRow)
    every, full = record(model, **kwargs)
    assert recorded.rows[0] == len(LENGTHS) and full.rows[0] == 4 * len(LENGTHS) and recorded.rows[1:] == full.rows[1:]
    assert torch.equal(alone.sequences, every.sequences)
    torch.testing.assert_close(alone.sequences_scores, every.sequences_scores, atol=1e-5, rtol=0)


def test_with_early_stopping_a_sentence_leaves_once_it_has_num_beams_finished(record, monkeypatch):
    """fairseq's rule (early_stopping=True): a sentence whose `num_beams` finished hypotheses are all taken can no
    longer change, so it leaves at once, with what it has. (The heuristic of `can_improve` is turned off here, so that
    only this rule and the length limit make a sentence leave; EOS is made likely by suppressing most tokens.)"""
    monkeypatch.setattr(beam_search_vaswani, "can_improve", lambda *, improvable, **_: improvable)
    model = make_model(seed=1, vocab_size=60)
    ids, mask = padded_batch(seed=2, lengths=LENGTHS, vocab=60)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_len_b=5, return_dict_in_generate=True, output_scores=True,
                  suppress_tokens=[t for t in range(60) if t not in (2, 4, 5)], early_stopping=True)  # fmt: skip
    leaving, left = record(model, **kwargs)
    kept, all_kept = record(model, leave=False, **kwargs)
    assert torch.equal(leaving.sequences, kept.sequences)
    torch.testing.assert_close(leaving.sequences_scores, kept.sequences_scores, atol=1e-5, rtol=0)
    # Sentences left before any reached its length limit (max(LENGTHS) + 5 steps with every row, as before).
    limit = min(LENGTHS) + 5
    assert left.rows[:limit] != all_kept.rows[:limit] and sum(left.rows) < sum(all_kept.rows)
    assert len(left.rows) <= len(all_kept.rows)


def test_n_best_scores_leave_the_batch_too(record):
    """`output_scores` (what n-best lists ask) no longer keeps every row: the steps' scores come back in the whole
    batch's rows, and each hypothesis' log P (`sequences_log_probs`, kept by the search), its GNMT score and the sum
    of its steps' scores (`compute_transition_scores`) are those of the search that keeps every row, within 1e-5."""
    model = make_model(seed=1, vocab_size=60)
    ids, mask = padded_batch(seed=1, lengths=LENGTHS, vocab=60)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_len_b=5, return_dict_in_generate=True, output_scores=True,
                  num_return_sequences=3)  # fmt: skip
    leaving, left = record(model, **kwargs)
    kept, all_kept = record(model, leave=False, **kwargs)
    assert searched(left.rows) and every_row(all_kept.rows)
    assert torch.equal(leaving.sequences, kept.sequences) and torch.equal(leaving.beam_indices, kept.beam_indices)
    assert all(step.shape == (16, 60) for step in leaving.scores) and len(leaving.scores) == len(kept.scores)
    steps = model.compute_transition_scores(leaving.sequences, leaving.scores, leaving.beam_indices).sum(-1)
    kept_steps = model.compute_transition_scores(kept.sequences, kept.scores, kept.beam_indices).sum(-1)
    for found in (steps, leaving.sequences_log_probs, kept.sequences_log_probs):
        torch.testing.assert_close(found, kept_steps, atol=1e-5, rtol=0)
    torch.testing.assert_close(leaving.sequences_scores, kept.sequences_scores, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("dynamic", "cache", "leave"),
    [(True, None, True), (False, None, False), (None, None, False), (True, "static", False)],
)
def test_only_a_decoder_compiled_with_dynamic_shapes_lets_sentences_leave(dynamic, cache, leave):
    """A `CompileConfig(dynamic=True)` on the dynamic cache lets sentences leave; a compile of fixed shapes (or of
    transformers' default, `dynamic=None`) or a static cache keeps every row."""
    from transformers import CompileConfig, GenerationConfig

    config = GenerationConfig(compile_config=CompileConfig(dynamic=dynamic), cache_implementation=cache)
    decoder = SimpleNamespace(want={}, processors=[])
    assert beam_search_vaswani._sentences_can_leave(config, decoder, None) is leave


@pytest.mark.slow  # ~40 s: inductor compiles 1 graph; CI runs the test of the rule above
def test_a_decoder_compiled_with_dynamic_shapes_takes_the_shrinking_batch(record, monkeypatch):
    """`compile_config=CompileConfig(dynamic=True)`: the compiled decoder step takes the shrinking batch, with the
    eager search's tokens and scores."""
    from transformers import CompileConfig

    model = make_model(seed=2)
    ids, mask = padded_batch(seed=5, lengths=LENGTHS)
    eager, eager_recorded = record(model, input_ids=ids, attention_mask=mask, max_len_b=5)
    rows, scores, step, output = [], [], beam_search_vaswani._Decoder.next_log_probs, beam_search_vaswani._output

    def counted_step(decoder, sequences, generated, *args):  # the rows decoded: one a sentence at the first step
        rows.append(sequences.shape[0] * (1 if generated == 1 and decoder.first_alone else sequences.shape[1]))
        return step(decoder, sequences, generated, *args)

    def recorded_output(finished, *args):
        scores.append(finished.scores[:, 0])
        return output(finished, *args)

    monkeypatch.setattr(beam_search_vaswani._Decoder, "next_log_probs", counted_step)
    monkeypatch.setattr(beam_search_vaswani, "_output", recorded_output)
    torch._dynamo.reset()
    try:
        compiled = model.generate(input_ids=ids, attention_mask=mask, max_len_b=5,
                                  compile_config=CompileConfig(dynamic=True, mode="default"))  # fmt: skip
    finally:
        torch._dynamo.reset()
    assert searched(rows) and rows == eager_recorded.rows
    assert torch.equal(compiled, eager)
    torch.testing.assert_close(scores[0], eager_recorded.scores, atol=1e-4, rtol=0)
