"""Markup carried through translation (`vaswani_mt.inference.markup`): tags put back around the target words aligned
to their content with their attributes, well-formed with the same tags; placeholders once each and never translated;
broken markup translated as plain text with a warning naming the line; lines without markup as without the option."""

import io

import pytest
from conftest import ENGLISH

from vaswani_mt.inference.alignments import AlignedTranslation
from vaswani_mt.inference.markup import parse_markup, restore, tags, well_formed
from vaswani_mt.inference.streams import translate_stream
from vaswani_mt.inference.translate import translate
from vaswani_mt.inference.translator import Translator

pytestmark = pytest.mark.usefixtures("one_thread")

MARKED = [
    'The <b>girl</b> ate an <a href="apple.html?a=1&amp;b=2">apple</a>.',
    "How are <i>you</i> today?<br/>",
    'The street is <span class="x"><b>closed</b> because</span> of the snow.',
    "I would like a coffee, please! {0} %s",
    "She reads a <b>book</b> in the café &amp; more.",
]


def aligned(text: str, source: str, links) -> AlignedTranslation:
    return AlignedTranslation(text, source.split(), text.split(), links=links)


def test_tags_go_around_the_aligned_target_words_with_their_attributes():
    plan = parse_markup('Click <a href="x?a=1&amp;b=2">here</a> now')
    assert plan.text == "Click here now"
    out = restore(plan, aligned("Klicken Sie jetzt hier", plan.text, [(0, 0), (0, 1), (2, 2), (1, 3)]))
    assert out == 'Klicken Sie jetzt <a href="x?a=1&amp;b=2">hier</a>'
    # a pair spans from its first to its last aligned word; nested pairs stay nested; entities come back escaped
    plan = parse_markup("<i>big <b>red</b> house</i> &amp; tree")
    assert plan.text == "big red house & tree"
    links = [(2, 0), (0, 1), (1, 2), (3, 3), (4, 4)]
    out = restore(plan, aligned("Haus großes rotes & Baum", plan.text, links))
    assert out == "<i>Haus großes <b>rotes</b></i> &amp; Baum" and well_formed(out)
    # siblings follow the translation's word order; one whose words an earlier sibling holds comes out empty
    plan = parse_markup("A <b>x y</b> <i>z</i>")
    assert restore(plan, aligned("Z Y X A", plan.text, [(3, 0), (2, 1), (1, 2), (0, 3)])) == "<i>Z</i> <b>Y X</b> A"
    out = restore(plan, aligned("Z Y X A", plan.text, [(0, 0), (2, 1), (1, 2), (0, 3), (3, 2)]))
    assert out == "Z <b>Y X</b> <i></i> A"


def test_content_aligned_to_nothing_goes_around_the_nearest_aligned_word():
    plan = parse_markup("the <b>very</b> old man")
    # "very" (source word 1) has no link: its nearest linked source words are 0 and 2, left first
    out = restore(plan, aligned("der alte Mann", plan.text, [(0, 0), (2, 1), (3, 2)]))
    assert out == "<b>der</b> alte Mann"


def test_self_closing_tags_follow_their_word_and_placeholders_come_out_once():
    plan = parse_markup("Delete {0} files?<br/> Now %s")
    assert plan.text == "Delete files? Now"
    out = restore(plan, aligned("Dateien löschen? Jetzt", plan.text, [(1, 0), (0, 1), (2, 2)]))
    # <br/> follows "files?" in the source: it goes after "Dateien", the word aligned to it
    assert out == "{0} Dateien<br/> löschen? Jetzt %s"


def test_broken_markup_is_plain_text():
    assert parse_markup("a < b").broken and parse_markup("<b>open").broken and parse_markup("x</i>").broken
    assert parse_markup("<b>x</i>").broken and not parse_markup("a > b &c").broken


def test_translated_markup_is_well_formed_with_the_same_tags(fitted):
    model, tokenizer = fitted
    outputs = translate(model, tokenizer, MARKED, markup="xml")
    for source, output in zip(MARKED, outputs, strict=True):
        assert well_formed(output), output
        assert sorted(tags(output)) == sorted(tags(source))
    assert outputs[3].count("{0}") == 1 and outputs[3].count("%s") == 1
    # the text between the tags is the translation of the line without them
    plain = translate(model, tokenizer, [parse_markup(line).text for line in MARKED])
    for output, text in zip(outputs, plain, strict=True):
        words = parse_markup(output).text.split()
        assert [w for w in words if w not in ("{0}", "%s")] == text.split()


def test_broken_lines_warn_by_number_and_the_rest_translate_as_usual(fitted, caplog):
    model, tokenizer = fitted
    lines = [ENGLISH[0], "The <b>girl ate an apple.", ENGLISH[2], "How < are you?"]
    with caplog.at_level("WARNING", logger="vaswani_mt.inference.markup"):
        outputs = translate(model, tokenizer, lines, markup="xml")
    assert "line 2: broken markup (<b> is not closed): translated as plain text" in caplog.text
    assert "line 4: broken markup (a '<' that starts no tag at character 5)" in caplog.text
    assert outputs == translate(model, tokenizer, lines)  # no markup taken out: each line as without the option
    sink = io.BytesIO()
    translate_stream(Translator(model, tokenizer, markup="xml"), io.BytesIO("\n".join(MARKED + lines).encode()), sink)
    assert sink.getvalue().decode().splitlines() == translate(model, tokenizer, MARKED + lines, markup="xml")


def test_markup_refuses_alignments_and_unknown_formats(fitted):
    model, tokenizer = fitted
    with pytest.raises(ValueError, match="markup must be one of xml"):
        translate(model, tokenizer, ENGLISH[:1], markup="html")
    with pytest.raises(ValueError, match="do not go together"):
        translate(model, tokenizer, ENGLISH[:1], markup="xml", alignments="hard")


def test_placeholders_are_no_words_to_warn_about(tokenizer):
    from vaswani_mt.model.pipeline_vaswani import unusual_pieces

    assert unusual_pieces(tokenizer, "{0}") is None and unusual_pieces(tokenizer, "%1$s") is None  # not typos
    assert "splits into" in unusual_pieces(tokenizer, "gegesen")  # a typo of "gegessen"
