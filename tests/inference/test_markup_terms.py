"""Tags around forced terms (issue 63): every search that takes terms tells the alignment stage which words it placed
for each term; a tag whose content holds a term wraps those words (and the aligned words next to them), an unmet
term leaves the tag to the span rule; the demo's markup is the translator's stage. A term given with its source
phrase goes to the tag around that phrase, found by string; without one, or where the line lacks it, the alignment
decides."""

import pytest
import torch
from conftest import ENGLISH

from vaswani_mt.inference.alignments import AlignedTranslation
from vaswani_mt.inference.markup import parse_markup, restore, well_formed
from vaswani_mt.inference.translator import Translator

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("how", ["plain", "nbest", "ensemble", "bfloat16", "int8"])
def test_every_search_that_takes_terms_reports_the_words_it_placed(fitted_folder, how):
    options = {"num_beams": 4, "max_len_b": 20, "alignments": "hard", "constraints": "unordered"}
    options |= {"nbest": {"nbest": 2}, "bfloat16": {"compute_type": "bfloat16"},
                "int8": {"compute_type": "int8"}}.get(how, {})  # fmt: skip
    model = [str(fitted_folder)] * 2 if how == "ensemble" else str(fitted_folder)
    terms = ["Kaffee", "Buch"]  # words of other sentences: forced, not chosen
    out = Translator(model, **options).translate([ENGLISH[0]], terms=[terms])[0]
    for aligned in [h.text for h in out] if how == "nbest" else [out]:
        assert len(aligned.placed) == 2
        for term, words in zip(terms, aligned.placed, strict=True):
            assert words == sorted(words) and words == list(range(words[0], words[-1] + 1))
            assert term in "".join(aligned.target_words[k] for k in words)


def aligned(target: str, source: str, rows: list[list[float]], placed=()) -> AlignedTranslation:
    """A translation of `source` with the soft alignment `rows` (a row per target word), hard links by row argmax,
    and the words the search `placed` for each term."""
    words, soft = target.split(), torch.tensor(rows)
    links = [(int(s), t) for t, s in enumerate(soft.argmax(1).tolist())]
    result = AlignedTranslation(target, source.split(), words, soft=soft, links=links)
    result.placed = list(placed)
    return result


# "Click the <b>button</b> now." -> "Klicken Sie jetzt auf die Schaltfläche.", "Schaltfläche" forced: the term's row
# links back to "button", but the word that attends most to "button" is "jetzt".
BUTTON = [[0.7, 0.1, 0.1, 0.1], [0.6, 0.2, 0.1, 0.1], [0.05, 0.05, 0.6, 0.3], [0.2, 0.6, 0.1, 0.1],
          [0.1, 0.7, 0.1, 0.1], [0.1, 0.1, 0.45, 0.35]]  # fmt: skip


def test_a_tag_whose_content_holds_a_placed_term_wraps_the_term():
    plan = parse_markup("Click the <b>button</b> now.")
    target = "Klicken Sie jetzt auf die Schaltfläche."
    assert restore(plan, aligned(target, plan.text, BUTTON)) == "Klicken Sie <b>jetzt</b> auf die Schaltfläche."
    placed = aligned(target, plan.text, BUTTON, placed=[[5]])
    assert restore(plan, placed) == "Klicken Sie jetzt auf die <b>Schaltfläche.</b>"
    unmet = aligned(target, plan.text, BUTTON, placed=[None])  # the search could not place it: the span rule
    assert restore(plan, unmet) == "Klicken Sie <b>jetzt</b> auf die Schaltfläche."


def test_the_tag_covers_the_term_and_the_aligned_words_next_to_it():
    # "Open the <b>red folder</b> now." -> "Öffne jetzt den roten Ordner.", "Ordner" forced: "red" -> "roten" is
    # aligned next to the term, "folder" attends most to "jetzt".
    plan = parse_markup("Open the <b>red folder</b> now.")
    rows = [[0.8, 0.1, 0.05, 0.03, 0.02], [0.05, 0.05, 0.1, 0.45, 0.35], [0.1, 0.6, 0.1, 0.1, 0.1],
            [0.05, 0.05, 0.8, 0.05, 0.05], [0.1, 0.1, 0.2, 0.35, 0.25]]  # fmt: skip
    target = "Öffne jetzt den roten Ordner."
    out = restore(plan, aligned(target, plan.text, rows, placed=[[4]]))
    assert out == "Öffne jetzt den <b>roten Ordner.</b>"


def test_each_of_two_tags_wraps_its_own_term_and_a_nested_tag_stays_inside():
    plan = parse_markup('<a href="#">Click the <b>button</b></a> now.')
    target = "Klicken Sie jetzt auf die Schaltfläche."
    out = restore(plan, aligned(target, plan.text, BUTTON, placed=[[5]]))
    assert "<b>Schaltfläche.</b>" in out and well_formed(out)
    assert out.index('<a href="#">') < out.index("<b>") and out.index("</b>") < out.index("</a>")
    plan = parse_markup("Click the <b>button</b> <i>now</i>.")
    rows = [row[:] for row in BUTTON]
    rows[2], rows[5] = [0.05, 0.05, 0.3, 0.6], [0.1, 0.1, 0.5, 0.3]  # "jetzt" links to "now", the term to "button"
    out = restore(plan, aligned(target, plan.text, rows, placed=[[5], [2]]))
    assert "<b>Schaltfläche.</b>" in out and "<i>jetzt</i>" in out


def test_the_demo_puts_markup_back_through_the_translators_stage(demo_model, monkeypatch):
    import vaswani_mt.inference.markup as markup
    from vaswani_mt.app.demo import translate_for_demo

    model, tokenizer = demo_model
    seen, put_back = [], markup.put_back
    monkeypatch.setattr(markup, "put_back", lambda plan, *rest: seen.append(plan.line) or put_back(plan, *rest))
    line = "The <b>girl</b> ate an <i>apple</i>."
    shown, _, _ = translate_for_demo(model, tokenizer, line, num_beams=4, max_len_b=10, terms="Apfel", markup=True)
    translator = Translator(model, tokenizer, num_beams=4, length_penalty=0.6, max_len_a=1, max_len_b=10,
                            markup="xml", constraints="unordered")  # fmt: skip
    assert seen == [line]
    assert shown == translator.translate([line], terms=[["Apfel"]])[0]


def test_a_pair_around_every_word_of_the_line_goes_around_every_word_of_the_translation():
    # "Use a <b>strong</b> password.": "Passwort." attends most to "strong" and "a", "Verwenden" to "Use": the
    # longest run of most-attending words would leave "Sie ein" out of the <p>
    plan = parse_markup('<p class="hint">Use a <b>strong</b> password.</p>')
    rows = [[0.7, 0.1, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1], [0.1, 0.3, 0.3, 0.3], [0.1, 0.1, 0.6, 0.2],
            [0.1, 0.5, 0.35, 0.05]]  # fmt: skip
    out = restore(plan, aligned("Verwenden Sie ein starkes Passwort.", plan.text, rows))
    assert out == '<p class="hint">Verwenden Sie ein <b>starkes</b> Passwort.</p>'


# "Open the <b>file</b> in the <i>folder</i>." -> "Öffne die Datei im Ordner.", "Datei" forced: its row attends most to
# "folder", so the alignment gives the term to <i>; "Ordner." attends most to "folder" too.
FILE = [[0.7, 0.1, 0.05, 0.05, 0.05, 0.05], [0.1, 0.6, 0.1, 0.1, 0.05, 0.05], [0.05, 0.05, 0.2, 0.05, 0.05, 0.6],
        [0.05, 0.05, 0.05, 0.7, 0.1, 0.05], [0.05, 0.05, 0.3, 0.05, 0.05, 0.7]]  # fmt: skip


def test_a_term_with_its_source_side_goes_into_the_tag_around_that_source_phrase():
    plan = parse_markup("Open the <b>file</b> in the <i>folder</i>.")
    translation = aligned("Öffne die Datei im Ordner.", plan.text, FILE, placed=[[2]])
    assert restore(plan, translation) == "Öffne die <i>Datei</i> im <b>Ordner.</b>"  # the alignment's pick: wrong
    for source in ("file", "FILE"):  # a whole word, any case
        plan.sources = [source]
        assert restore(plan, translation) == "Öffne die <b>Datei</b> im <i>Ordner.</i>"


def test_a_source_side_not_in_the_line_leaves_the_holder_to_the_alignment():
    plan = parse_markup("Open the <b>file</b> in the <i>folder</i>.")
    translation = aligned("Öffne die Datei im Ordner.", plan.text, FILE, placed=[[2]])
    before = restore(plan, translation)
    for source in ("document", "fil", "files"):  # not a whole word of the line: read from the alignment
        plan.sources = [source]
        assert restore(plan, translation) == before == "Öffne die <i>Datei</i> im <b>Ordner.</b>"


def test_a_term_with_its_source_side_is_searched_as_the_term_alone(fitted_folder):
    options = {"num_beams": 4, "max_len_b": 20, "alignments": "hard", "constraints": "unordered"}
    line = ENGLISH[3]  # "I would like a coffee, please!"
    alone, *given = [Translator(str(fitted_folder), **options).translate([line], terms=[[term]])[0]
                     for term in ("Buch", "coffee ||| Buch", ("coffee", "Buch"), (None, "Buch"))]  # fmt: skip
    tabbed = Translator(str(fitted_folder), **options).translate([f"{line}\tcoffee ||| Buch"])[0]
    for other in [*given, tabbed]:
        assert (str(other), other.links, other.placed) == (str(alone), alone.links, alone.placed)
    marked = Translator(str(fitted_folder), **options | {"markup": "xml", "alignments": None})
    lines = ["I would like a <b>coffee</b>, please!"]  # the tiny model's alignment puts "Buch" outside the <b>
    assert marked.translate(lines, terms=[["Buch"]])[0].count("<b>Buch") == 0
    assert "<b>Buch</b>" in marked.translate(lines, terms=[[("coffee", "Buch")]])[0]


def test_an_empty_source_side_fails_its_line_alone(fitted_folder):
    from vaswani_mt.inference.controls import ControlReport

    report = ControlReport()
    translator = Translator(str(fitted_folder), num_beams=4, max_len_b=20, constraints="unordered")
    out = translator.translate(ENGLISH[:2], terms=[["||| Buch"], ["Buch"]], report=report)
    assert out[0] == "" and out[1]
    assert report.failed == {1: "constraint 1: an empty source side before '|||' (of 'Buch')"}
