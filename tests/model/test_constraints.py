"""Terminology constraints and forced target prefixes in the paper's beam search (constraints_vaswani.py)."""

import pytest
import torch
from conftest import fit_tiny_model, make_model, padded_batch
from test_generation import teacher_forced_log_prob
from transformers import GenerationConfig

from vaswani_mt import VaswaniForConditionalGeneration, gnmt_length_penalty
from vaswani_mt.model.beam_search_vaswani import settled
from vaswani_mt.model.constraints_vaswani import LexicalConstraints, allocate, phrase_forms

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]


def contains(sequence: list[int], phrase: list[int]) -> int:
    """The position after the first occurrence of `phrase` in `sequence`, 0 where it does not occur."""
    for start in range(len(sequence) - len(phrase) + 1):
        if sequence[start : start + len(phrase)] == phrase:
            return start + len(phrase)
    return 0


def generated(row: torch.Tensor) -> list[int]:
    tokens = row[1:].tolist()
    return tokens[: tokens.index(2) + 1] if 2 in tokens else tokens


def search(model, ids, mask, **kwargs):
    return model.generate(input_ids=ids, attention_mask=mask, output_scores=True, return_dict_in_generate=True,
                          **kwargs)  # fmt: skip


@pytest.fixture(scope="module")
def batch():
    return padded_batch(seed=3, lengths=(7, 4, 6, 5))


@pytest.fixture(scope="module")
def model():
    return make_model(seed=4)


# Row 0: one phrase; row 1: none; row 2: two constraints, one of them with two alternatives; row 3: none.
CONSTRAINTS = [[[17, 18]], [], [[[40], [41, 42]], [99, 98, 97]], []]


@pytest.mark.parametrize("beams", [4, 8])
def test_every_output_contains_its_constraints_and_other_sentences_are_untouched(model, batch, beams):
    ids, mask = batch
    plain = search(model, ids, mask, num_beams=beams, max_len_b=12)
    constrained = search(model, ids, mask, num_beams=beams, max_len_b=12, constraints=CONSTRAINTS)
    # Every constraint is met; a slot without one (row 0's second, rows 1 and 3) reads True: vacuously met.
    assert constrained.constraints_met.tolist() == [[True, True]] * 4
    out = [generated(row) for row in constrained.sequences]
    assert contains(out[0], [17, 18])
    assert contains(out[2], [40]) or contains(out[2], [41, 42])
    assert contains(out[2], [99, 98, 97])
    for row in (1, 3):  # no constraints: exactly what the search gives without the option
        assert out[row] == generated(plain.sequences[row])
        assert constrained.sequences_scores[row].item() == plain.sequences_scores[row].item()
    for row in (0, 2):  # the score is still log P(Y|X) over the GNMT penalty
        length = int(mask[row].sum())
        log_prob, size = teacher_forced_log_prob(model, ids[row : row + 1, :length], None, constrained.sequences[row])
        expected = log_prob / gnmt_length_penalty(size, 0.6)
        assert constrained.sequences_scores[row].item() == pytest.approx(expected, abs=1e-4)
        assert constrained.sequences_scores[row].item() < plain.sequences_scores[row].item()


def test_a_run_where_no_sentence_has_constraints_is_the_plain_search(model, batch):
    ids, mask = batch
    plain = search(model, ids, mask, max_len_b=9)
    empty = search(model, ids, mask, max_len_b=9, constraints=[[], [], [], []], constraint_order="ordered")
    assert torch.equal(plain.sequences, empty.sequences)
    assert torch.equal(plain.sequences_scores, empty.sequences_scores)


def test_ordered_constraints_appear_in_their_order(model, batch):
    ids, mask = batch
    phrases = [[[150, 151]], [[60], [150, 151]], [[7], [8]], [[9, 10]]]
    out = search(model, ids, mask, max_len_b=12, constraints=phrases, constraint_order="ordered")
    assert out.constraints_met.tolist() == [[True, True]] * 4  # rows 0 and 3's second slot: none, vacuously met
    for row, constraints in enumerate(phrases):
        ends = [contains(generated(out.sequences[row]), phrase) for phrase in constraints]
        assert all(ends)
        assert ends == sorted(ends)


def test_every_hypothesis_of_an_nbest_list_meets_the_constraints(model, batch):
    ids, mask = batch
    out = search(model, ids, mask, num_beams=4, num_return_sequences=4, max_len_b=12, constraints=CONSTRAINTS)
    sequences = out.sequences.view(4, 4, -1)
    for k in range(4):
        assert contains(generated(sequences[0, k]), [17, 18])
        assert contains(generated(sequences[2, k]), [99, 98, 97])
    assert len({tuple(generated(s)) for s in sequences[0]}) == 4  # four different hypotheses, not copies


def test_a_constraint_that_cannot_be_met_returns_the_best_hypothesis_marked_and_warns(model, batch, caplog):
    ids, mask = batch
    # Token 50 is suppressed: it can never appear, so row 0's constraint is never met; EOS comes at the limit.
    kwargs = dict(input_ids=ids, attention_mask=mask, max_len_b=6, suppress_tokens=[50])
    out = model.generate(**kwargs, constraints=[[[50]], [[20]], [], []], return_dict_in_generate=True)
    # Row 0's constraint reads False; row 1's is met; rows 2 and 3 have none, vacuously met.
    assert out.constraints_met.tolist() == [[False], [True], [True], [True]]
    assert generated(out.sequences[0])[-1] == 2 and len(generated(out.sequences[0])) == 7 + 6
    with caplog.at_level("WARNING"):
        model.generate(**kwargs, constraints=[[[50]], [[20]], [], []])
    assert "1 of 2 sentences could not meet their constraints" in caplog.text


def test_target_prefixes_of_different_lengths_share_a_batch(model, batch):
    ids, mask = batch
    prefixes = [[30, 31, 32], [], [33], []]
    plain = search(model, ids, mask, max_len_b=10)
    out = search(model, ids, mask, max_len_b=10, target_prefix=prefixes, num_return_sequences=4)
    sequences = out.sequences.view(4, 4, -1)
    for row, prefix in enumerate(prefixes):
        for k in range(4):
            assert generated(sequences[row, k])[: len(prefix)] == prefix
        if not prefix:  # an empty prefix: the unconstrained translation, score and all
            assert generated(sequences[row, 0]) == generated(plain.sequences[row])
            assert out.sequences_scores.view(4, 4)[row, 0].item() == plain.sequences_scores[row].item()
    # The beams go on from the prefix in different ways (fairseq #712: not four copies of one hypothesis).
    assert len({tuple(generated(s)) for s in sequences[0]}) == 4
    length = int(mask[0].sum())
    log_prob, size = teacher_forced_log_prob(model, ids[:1, :length], None, sequences[0, 0])
    assert out.sequences_scores[0].item() == pytest.approx(log_prob / gnmt_length_penalty(size, 0.6), abs=1e-4)


def test_prefix_and_constraints_together(model, batch):
    ids, mask = batch
    out = search(model, ids, mask, max_len_b=12, target_prefix=[[30], [31], [], []],
                 constraints=[[[17, 18]], [], [[60]], []])  # fmt: skip
    assert generated(out.sequences[0])[0] == 30 and contains(generated(out.sequences[0]), [17, 18])
    assert generated(out.sequences[1])[0] == 31
    assert contains(generated(out.sequences[2]), [60])
    assert out.constraints_met.tolist() == [[True], [True], [True], [True]]  # rows 1 and 3: none, vacuously met


def rows(out) -> list[tuple[list[int], float]]:
    """Each sentence's tokens (up to EOS) and score."""
    return [(generated(row), score) for row, score in zip(out.sequences, out.sequences_scores.tolist(), strict=True)]


@pytest.mark.parametrize("alpha", [0.0, 1.5])
def test_constrained_sentences_take_their_own_length_penalty_and_the_others_keep_theirs(model, batch, alpha):
    """`constrained_length_penalty=a2` with `length_penalty=a1`: a sentence without constraints gets exactly what it
    gets without the option (and without constraints), one with constraints what it gets with `length_penalty=a2`."""
    ids, mask = batch
    plain = rows(search(model, ids, mask, max_len_b=12, length_penalty=0.6))
    own = rows(search(model, ids, mask, max_len_b=12, length_penalty=0.6, constraints=CONSTRAINTS,
                      constrained_length_penalty=alpha))  # fmt: skip
    everyone = rows(search(model, ids, mask, max_len_b=12, length_penalty=alpha, constraints=CONSTRAINTS))
    same_alpha = rows(search(model, ids, mask, max_len_b=12, length_penalty=0.6, constraints=CONSTRAINTS))
    assert [own[1], own[3]] == [plain[1], plain[3]]  # without constraints: alpha 0.6, as if none were given
    assert [own[0], own[2]] == [everyone[0], everyone[2]]  # with constraints: alpha a2, as if every sentence had it
    # The option changes what it should: the constrained sentences' scores, not the others'.
    assert own[0][1] != same_alpha[0][1] and own[2][1] != same_alpha[2][1]
    assert everyone[1][1] != plain[1][1]


def test_the_constrained_length_penalty_is_saved_with_the_generation_config(batch, tmp_path):
    ids, mask = batch
    model = make_model(seed=4)
    model.generation_config.constrained_length_penalty = 1.5
    model.save_pretrained(tmp_path)
    assert GenerationConfig.from_pretrained(tmp_path).constrained_length_penalty == 1.5
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.generation_config.constrained_length_penalty == 1.5
    fresh = make_model(seed=4)  # the same weights, nothing saved: the alpha given in the call
    expected = rows(search(fresh, ids, mask, max_len_b=12, constraints=CONSTRAINTS, constrained_length_penalty=1.5))
    assert rows(search(loaded, ids, mask, max_len_b=12, constraints=CONSTRAINTS)) == expected
    assert rows(search(fresh, ids, mask, max_len_b=12, constraints=CONSTRAINTS)) != expected


def test_a_length_penalty_given_alone_is_every_sentences_over_the_saved_constrained_one(batch):
    """A call that sets `length_penalty` and not `constrained_length_penalty` scores every sentence with it: the
    constrained sentences' saved alpha is for the saved `length_penalty`, not for this one."""
    ids, mask = batch
    saved = make_model(seed=4)
    saved.generation_config.constrained_length_penalty = 1.5
    fresh = make_model(seed=4)
    out = rows(search(saved, ids, mask, max_len_b=12, constraints=CONSTRAINTS, length_penalty=1.0))
    assert out == rows(search(fresh, ids, mask, max_len_b=12, constraints=CONSTRAINTS, length_penalty=1.0))
    # Given with it in the call, the constrained alpha still counts.
    both = rows(search(saved, ids, mask, max_len_b=12, constraints=CONSTRAINTS, length_penalty=1.0,
                       constrained_length_penalty=1.5))  # fmt: skip
    assert both[0][1] != out[0][1] and both[1] == out[1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_beams=1, constraints=[[[5]]] * 4), "need beam search"),
        (dict(num_beams=1, target_prefix=[[5]] * 4), "need beam search"),
        (dict(do_sample=True, num_beams=1, constraints=[[[5]]] * 4), "need beam search"),
        (dict(constraints=[[[5]]] * 3), "3 entries for 4 sentences"),
        (dict(constraints=[[], [[]], [], []]), "sentence 1: constraint 1 is empty"),
        (dict(constraints=[[[5]]] * 4, constraint_order="sorted"), "constraint_order must be one of"),
        (dict(constraints=[[[5]]] * 4, constrained_stopping="first"), "constrained_stopping must be one of"),
        (
            dict(max_len_a=0, max_len_b=3, target_prefix=[[], [], [5, 6, 7], []]),
            "sentence 2: a target prefix of 3 tokens",
        ),
        (
            dict(max_len_a=0, max_len_b=3, constraints=[[[5, 6], [7, 8]], [], [], []]),
            "sentence 0: constraints of 4 tokens",
        ),
    ],
)
def test_bad_controls_are_refused_in_one_line(model, batch, kwargs, message):
    ids, mask = batch
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids=ids, attention_mask=mask, **kwargs)


def test_banks_are_taken_round_robin_highest_first():
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]])
    banks = torch.tensor([[0, 0, 0, 2, 1, 2]])
    usable = torch.tensor([[True, True, True, True, True, False]])
    # bank 2's best (3), bank 1's best (4), bank 0's best (0), then bank 0's second (1): bank 2 has no second usable
    assert allocate(scores, banks, usable, 4).tolist() == [[3, 4, 0, 1]]


def test_the_state_follows_phrases_wherever_they_end():
    lexical = LexicalConstraints([[[[5, 5, 6]], [[7]]]], "unordered")
    met, _ = lexical.initial_state(1)
    window = torch.tensor([[[5, 5, 5, 6]]])[:, :, -lexical.L :]  # "5 5 5 6": the phrase overlaps its own start
    met, partial, bank, satisfied = lexical.advance(window, met[:, :1])
    assert met.tolist() == [[[True, False]]] and bank.tolist() == [[3]] and not satisfied.item()
    assert partial.tolist() == [[[0, 0]]]
    _, partial, bank, _ = lexical.advance(torch.tensor([[[6, 5, 5]]]), met[:, :1] & False)
    assert partial.tolist() == [[[2, 0]]] and bank.tolist() == [[2]]  # "5 5" begun: two of its three tokens
    ordered = LexicalConstraints([[[[7]], [[5, 5, 6]]]], "ordered")
    start, _ = ordered.initial_state(1)
    met, *_ = ordered.advance(torch.tensor([[[-2, 5, 5, 6]]])[:, :, -ordered.L :], start)
    assert met.tolist() == [[[False, False]]]  # the second constraint does not count before the first


def test_a_phrase_is_tokenized_as_inside_a_sentence(tokenizer):
    forms = phrase_forms(tokenizer, "Haus")
    inside = tokenizer("das Haus", add_special_tokens=False)["input_ids"]
    assert any(contains(inside, form) for form in forms)
    assert phrase_forms(tokenizer, "  Haus ") == forms  # spaces around it do not count
    with pytest.raises(ValueError, match="empty"):
        phrase_forms(tokenizer, " \t")
    with pytest.raises(ValueError, match="outside the vocabulary: '€'"):
        phrase_forms(tokenizer, "Haus€")


def test_a_fitted_model_translates_with_a_term_it_would_not_choose(tokenizer):
    model = fit_tiny_model(tokenizer)
    ids = tokenizer(["the house is small"], return_tensors="pt")
    plain = tokenizer.decode(model.generate(**ids)[0], skip_special_tokens=True)
    term = next(word for word in ("Hund", "Katze", "Buch") if word not in plain)
    out = model.generate(**ids, constraints=[[phrase_forms(tokenizer, term)]], return_dict_in_generate=True)
    assert term in tokenizer.decode(out.sequences[0], skip_special_tokens=True)
    assert out.constraints_met.all()


def decoded_rows(model, ids, mask, **kwargs) -> tuple[list, int]:
    """Each sentence's tokens and score (None without `output_scores`), and the rows the decoder decoded
    (hypotheses x steps; without per-step outputs, sentences leave the batch)."""
    counted = []
    hook = model.get_decoder().register_forward_pre_hook(lambda _, args, kw: counted.append(len(args[0])),
                                                         with_kwargs=True)  # fmt: skip
    try:
        out = model.generate(input_ids=ids, attention_mask=mask, return_dict_in_generate=True, **kwargs)
    finally:
        hook.remove()
    scores = out.sequences_scores.tolist() if out.sequences_scores is not None else [None] * len(out.sequences)
    return [(generated(row), score) for row, score in zip(out.sequences, scores, strict=True)], sum(counted)


# alpha, early_stopping, num_return_sequences, per-step scores, whether "best" decodes fewer rows.
STOPPING_CASES = [(0.0, True, 1, False, True), (0.0, True, 1, True, True), (0.6, True, 1, False, True),
                  (0.0, "never", 1, True, True), (0.0, True, 2, False, True),
                  (1.5, "never", 1, True, True)]  # fmt: skip


@pytest.mark.parametrize(("alpha", "early_stopping", "returned", "output_scores", "fewer"), STOPPING_CASES)
def test_a_constrained_sentence_stops_once_what_it_returns_is_settled(tokenizer, alpha, early_stopping, returned,
                                                                      output_scores, fewer):  # fmt: skip
    """`constrained_stopping="best"` (the default) returns what "beam" (done once `num_beams` hypotheses that meet
    the terms have finished) returns, tokens and scores, and decodes fewer rows: a constrained sentence is done once
    no running hypothesis can beat, at any length it may reach, the `num_return_sequences`-th it has finished (with
    `early_stopping="never"` at alpha > 0, the bound at the longest length; on these cases the current one's too)."""
    model = fit_tiny_model(tokenizer)
    ids = tokenizer(["the house is small", "the dog is big", "the cat sleeps", "a small book"], return_tensors="pt",
                    padding=True)  # fmt: skip
    terms = [[phrase_forms(tokenizer, word)] if word else [] for word in ("Hund", None, "Buch", "Haus")]
    kwargs = dict(constraints=terms, constrained_length_penalty=alpha, early_stopping=early_stopping,
                  num_return_sequences=returned, output_scores=output_scores)  # fmt: skip
    best, best_rows = decoded_rows(model, ids["input_ids"], ids["attention_mask"], **kwargs)
    beam, beam_rows = decoded_rows(model, ids["input_ids"], ids["attention_mask"], constrained_stopping="beam",
                                   **kwargs)  # fmt: skip
    assert best == beam
    assert best_rows < beam_rows if fewer else best_rows == beam_rows


def test_the_settled_bound_is_at_the_longest_length_only_under_early_stopping_never(tokenizer, monkeypatch):
    """As `can_improve` reads `early_stopping`: "never" bounds a running hypothesis at the longest length (exact), any
    other value at its current one (transformers' heuristic), which settles a sentence sooner."""
    from vaswani_mt.model import beam_search_vaswani

    model = fit_tiny_model(tokenizer)
    ids = tokenizer(["the house is small", "the dog is big"], return_tensors="pt", padding=True)
    terms = [[phrase_forms(tokenizer, "Hund")], []]
    bounds = []

    def recorded(settle, running, finished, done, generated, longest):
        bounds.append((generated, longest))
        return settled(settle, running, finished, done, generated, longest)

    monkeypatch.setattr(beam_search_vaswani, "settled", recorded)
    for early_stopping in ("never", True, False):
        bounds.clear()
        out = model.generate(**ids, constraints=terms, constrained_length_penalty=1.5, early_stopping=early_stopping,
                             max_new_tokens=12, return_dict_in_generate=True)  # fmt: skip
        assert bounds and bool(out.constraints_met[0].all())
        if early_stopping == "never":
            assert {longest for _, longest in bounds} == {12}  # max_length - 1: the decoder start and 12 new tokens
        else:
            assert all(longest == generated for generated, longest in bounds)


def test_the_settled_rule_reads_the_returned_hypothesis_and_the_bound_at_the_longest_length():
    finished = torch.tensor([[-1.0, -2.0], [-1.0, -2.0], [-1.0, -2.0]])
    done = torch.tensor([[True, True], [True, True], [True, False]])
    running = torch.tensor([[-1.5], [-0.5], [-1.5]])
    rows = torch.tensor([[True], [True], [True]])
    # alpha 0: log P only falls. Row 0: its best finished beats every running one; row 1: not; row 2 as row 0.
    assert settled((rows, 0.0, 1), running, finished, done, 3, 10)[:, 0].tolist() == [True, False, True]
    # Its second: row 0's -2.0 is beaten by -1.5; row 2 has no second finished.
    assert settled((rows, 0.0, 2), running, finished, done, 3, 10)[:, 0].tolist() == [False, False, False]
    # alpha 1: -1.5 may still reach -1.5 / ((5 + 10) / 6) = -0.6 at the longest length, which beats -1.0.
    assert not settled((rows, 1.0, 1), running, finished, done, 3, 10).any()
    assert not settled((~rows, 0.0, 1), running, finished, done, 3, 10).any()  # sentences without terms: never
