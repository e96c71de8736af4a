"""The dev terms that choose the constrained search's alpha (evaluation/terminology.py)."""

from vaswani_mt.evaluation.terminology import reference_terms


def test_a_dev_term_is_the_references_longest_word_that_the_source_lacks():
    sources = ["The Computer is new.", "I see it.", "Hello 12345."]
    references = ["Der Computer ist nagelneu und schnell.", "Ich sehe es.", "Hallo 1234567."]
    # "Computer" is in the source (copying it meets nothing); words under 5 letters and numbers are no terms.
    assert reference_terms(sources, references) == [["nagelneu"], [], ["Hallo"]]
