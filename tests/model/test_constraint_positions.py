"""Where the search placed each constraint's tokens (issue 63, item 1): `constraints_placed` on generate()'s output,
per returned hypothesis, read by the alignment stage as target words (`AlignedTranslation.placed`); nothing computed
when no terms are given."""

import pytest
import test_constraints
import torch
from test_constraints import CONSTRAINTS, generated

from vaswani_mt.model.constraints_vaswani import DynamicBeamAllocation, LexicalConstraints

batch, model = test_constraints.batch, test_constraints.model  # the same batch and model fixtures

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]


def first_end(tokens: list[int], phrases: list[list[int]], after: int = -1) -> int:
    """The position of the last token of the first occurrence (ending past `after`) of any of `phrases`."""
    ends = [k + len(p) - 1 for p in phrases for k in range(len(tokens) - len(p) + 1)
            if tokens[k : k + len(p)] == p and k + len(p) - 1 > after]  # fmt: skip
    return min(ends)


def phrases_of(constraint) -> list[list[int]]:
    return [constraint] if all(isinstance(t, int) for t in constraint) else constraint


@pytest.mark.parametrize("returned", [1, 3])
def test_each_hypothesis_reports_the_tokens_it_placed_for_each_constraint(model, batch, returned):
    ids, mask = batch
    out = model.generate(input_ids=ids, attention_mask=mask, max_len_b=12, constraints=CONSTRAINTS,
                         num_return_sequences=returned, return_dict_in_generate=True)  # fmt: skip
    assert len(out.constraints_placed) == 4 * returned
    for row, placed in enumerate(out.constraints_placed):
        constraints, tokens = CONSTRAINTS[row // returned], generated(out.sequences[row])
        assert len(placed) == len(constraints)  # one entry per constraint the sentence has, none for the others
        for (first, last), constraint in zip(placed, constraints, strict=True):
            assert tokens[first : last + 1] in phrases_of(constraint)  # the constraint's own tokens
            assert last == first_end(tokens, phrases_of(constraint))  # where the search met it: the first end


def test_ordered_constraints_are_placed_in_their_order(model, batch):
    ids, mask = batch
    phrases = [[[150, 151]], [[60], [150, 151]], [[7], [8]], [[9, 10]]]
    out = model.generate(input_ids=ids, attention_mask=mask, max_len_b=12, constraints=phrases,
                         constraint_order="ordered", return_dict_in_generate=True)  # fmt: skip
    first, second = out.constraints_placed[1]
    tokens = generated(out.sequences[1])
    assert tokens[first[0] : first[1] + 1] == [60] and tokens[second[0] : second[1] + 1] == [150, 151]
    assert first[1] < second[0]  # the second is met after the first, even where [150, 151] came earlier
    assert second[1] == first_end(tokens, [[150, 151]], after=first[1])


def test_an_unmet_constraint_is_placed_nowhere(model, batch):
    ids, mask = batch
    out = model.generate(input_ids=ids, attention_mask=mask, max_len_b=6, suppress_tokens=[50],
                         constraints=[[[50]], [[20]], [], []], return_dict_in_generate=True)  # fmt: skip
    assert out.constraints_placed[0] == [None]
    first, last = out.constraints_placed[1][0]
    assert generated(out.sequences[1])[first : last + 1] == [20]
    assert out.constraints_placed[2:] == [[], []]


def test_without_terms_the_search_places_nothing_and_computes_nothing(model, batch, monkeypatch):
    ids, mask = batch
    before = model.generate(input_ids=ids, attention_mask=mask, max_len_b=9, return_dict_in_generate=True,
                            output_scores=True)  # fmt: skip
    empty = model.generate(input_ids=ids, attention_mask=mask, max_len_b=9, return_dict_in_generate=True,
                           output_scores=True, constraints=[[], [], [], []])  # fmt: skip
    assert torch.equal(before.sequences, empty.sequences) and empty.constraints_placed == [[], [], [], []]

    def refused(*args, **kwargs):
        raise AssertionError("constraint work in a search without terms")

    for owner, name in ((DynamicBeamAllocation, "constraints_placed"), (LexicalConstraints, "advance"),
                        (LexicalConstraints, "__init__")):  # fmt: skip
        monkeypatch.setattr(owner, name, refused)
    after = model.generate(input_ids=ids, attention_mask=mask, max_len_b=9, return_dict_in_generate=True,
                           output_scores=True)  # fmt: skip
    assert not hasattr(after, "constraints_placed")
    assert torch.equal(before.sequences, after.sequences)
    assert torch.equal(before.sequences_scores, after.sequences_scores)
