"""Markup carried through translation (`vaswani_mt.inference.markup`): tags put back around the target words aligned
to their content with their attributes, well-formed with the same tags; placeholders once each and never translated;
broken markup translated as plain text with a warning naming the line; lines without markup as without the option."""

import io
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import ENGLISH

from vaswani_mt.inference.alignments import AlignedTranslation
from vaswani_mt.inference.markup import (
    comments,
    parse_markup,
    placeholders,
    restore,
    tags,
    take_out_markup,
    well_formed,
)
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
    # one whose words an earlier sibling holds is not empty: it takes the nearest free word
    out = restore(plan, aligned("Z Y X A", plan.text, [(0, 0), (2, 1), (1, 2), (0, 3), (3, 2)]))
    assert out == "Z <b>Y X</b> <i>A</i>"


def test_content_aligned_to_nothing_goes_around_the_nearest_aligned_word():
    plan = parse_markup("the <b>very</b> old man")
    # "very" (source word 1) has no link: its nearest linked source words are 0 and 2, left first
    out = restore(plan, aligned("der alte Mann", plan.text, [(0, 0), (2, 1), (3, 2)]))
    assert out == "<b>der</b> alte Mann"


def test_self_closing_tags_follow_their_word_and_placeholders_come_out_once():
    plan = parse_markup("Delete {0} files?<br/> Now %s")
    assert plan.text == "Delete files? Now"
    out = restore(plan, aligned("Dateien löschen? Jetzt", plan.text, [(1, 0), (0, 1), (2, 2)]))
    # <br/> follows the "?" of "files?": it goes after the target word that ends in "?"; %s ends the line: it stays
    assert out == "{0} Dateien löschen?<br/> Jetzt %s"


def test_broken_markup_is_plain_text():
    assert parse_markup("<b>open").broken and parse_markup("x</i>").broken and parse_markup("<b>x</i>").broken
    assert not parse_markup("a > b &c").broken and not parse_markup("a < b").broken
    assert not parse_markup("a < b").marked  # a stray `<` alone is no markup: the line is translated as it is


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
    lines = [ENGLISH[0], "The <b>girl ate an apple.", ENGLISH[2], "How <b>are</b> you < now?"]
    with caplog.at_level("WARNING", logger="vaswani_mt.inference.markup"):
        outputs = translate(model, tokenizer, lines, markup="xml")
    assert "line 2: broken markup (<b> is not closed): translated as plain text" in caplog.text
    assert "line 4: a '<' that starts no tag at character 20: read as text, the markup kept" in caplog.text
    assert outputs[:3] == translate(model, tokenizer, lines[:3])  # no markup taken out: as without the option
    assert tags(outputs[3]) == ["<b>", "</b>"] and well_formed(outputs[3])  # the tags kept
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


HELDOUT = Path(__file__).resolve().parents[2] / "benchmarks" / "markup_heldout.jsonl"


def diagonal(plan, text: str) -> AlignedTranslation:
    """`text` as the translation of `plan.text`, word k linked to source word k (the last where it runs out)."""
    count = len(plan.text.split())
    return aligned(text, plan.text, [(min(k, count - 1), k) for k in range(len(text.split()))])


def test_a_void_tag_separates_words_and_at_the_line_edges_stays_there():
    plan = parse_markup("Click here<br/>to delete it.")
    assert plan.text == "Click here to delete it."  # not "hereto"
    plan = parse_markup("<br/>The book is on the table.<hr/>")
    # "table." is aligned to "liegt": by alignment alone the <hr/> would go inside the line
    out = restore(plan, aligned("Das Buch liegt auf dem Tisch.", plan.text, [(0, 0), (1, 1), (5, 2), (3, 3), (4, 4)]))
    assert out.startswith("<br/>") and out.endswith("Tisch.<hr/>")


def test_space_entities_are_spaces_to_the_model_and_come_back_as_written():
    plan = parse_markup("Tom&nbsp;and&#160;Anna are here.")
    assert plan.text == "Tom and Anna are here." and plan.html  # &nbsp; is HTML's, not XML's
    out = restore(plan, diagonal(plan, "Tom und Anna sind hier."))
    assert out == "Tom&nbsp;und&#160;Anna sind hier." and well_formed(out, html=True) and not well_formed(out)
    out = restore(parse_markup("Price:&nbsp;{0}"), aligned("Preis:", "Price:", [(0, 0)]))
    assert out == "Preis:&nbsp;{0}"  # at the line's edge the entity is a point, written as the source has it


def test_percent_percent_and_double_braces_are_literal_and_come_out_once():
    plan = parse_markup("Disk is 100%% full. Write {{ for a brace, {{name}} for a name.")
    assert "%" not in plan.text and "{" not in plan.text and "name" not in plan.text.split()
    out = restore(plan, diagonal(plan, "Platte ist 100 voll. Schreibe für eine Klammer, für einen Namen."))
    assert "100%% voll" in out and Counter(placeholders(out)) == Counter(["%%", "{{", "{{name}}"])


def test_comments_and_cdata_are_carried_through_as_points():
    line = "Save the file <!-- translators: keep short --> now <![CDATA[a < b]]>."
    plan = parse_markup(line)
    assert not plan.broken and plan.text == "Save the file now ."
    out = restore(plan, diagonal(plan, "Speichere die Datei jetzt ."))
    assert comments(out) == comments(line) == ["<!-- translators: keep short -->", "<![CDATA[a < b]]>"]
    assert well_formed(out)


def test_a_stray_lt_or_amp_is_text_with_a_warning_and_the_tags_are_kept(caplog):
    with caplog.at_level("WARNING", logger="vaswani_mt.inference.markup"):
        (plan,) = take_out_markup(["Click <b>OK</b> if a < b & c."], first_line=7)
    assert not plan.broken and plan.text == "Click OK if a < b & c."
    assert "line 7: a '<' that starts no tag at character 22: read as text" in caplog.text
    assert "line 7: a '&' that starts no entity at character 26" in caplog.text
    out = restore(plan, diagonal(plan, "Klicke OK wenn a < b & c."))
    assert out == "Klicke <b>OK</b> wenn a &lt; b &amp; c." and well_formed(out)


def test_html_void_tags_come_back_as_written_and_the_output_is_well_formed_html():
    plan = parse_markup('Line one<br>line two <img src="a.png">')
    assert plan.html and plan.text == "Line one line two"
    out = restore(plan, diagonal(plan, "Zeile eins Zeile zwei"))
    assert tags(out) == ["<br>", '<img src="a.png">']  # as the source wrote them
    assert well_formed(out, html=True) and not well_formed(out)  # HTML's promise, not XML's
    plan = parse_markup("Line one<br/>line two")  # written as XML: XML comes out
    assert not plan.html and well_formed(restore(plan, diagonal(plan, "Zeile eins Zeile zwei")))
    assert not well_formed("<b>x", html=True) and not well_formed("a & b", html=True)


def test_a_pair_with_content_is_never_empty():
    plan = parse_markup("I like <b>apples</b> and <i>pears</i>.")
    # "pears" aligns to nothing: <i> goes around the nearest aligned word, not around nothing
    out = restore(plan, aligned("Ich mag Äpfel und Birnen.", plan.text, [(0, 0), (1, 1), (2, 2), (3, 3), (2, 4)]))
    assert "<i></i>" not in out and out.count("<i>") == 1 and "<b>Äpfel</b>" in out


def test_a_span_is_the_longest_run_of_aligned_words_so_a_stray_link_cannot_stretch_it():
    plan = parse_markup('Press <span class="kbd">Enter</span> to continue now.')
    links = [(0, 0), (1, 1), (2, 2), (4, 3), (3, 4), (1, 5)]  # "Enter" also linked to the last word
    out = restore(plan, aligned("Drücke Enter um jetzt fortzufahren .", plan.text, links))
    assert out == 'Drücke <span class="kbd">Enter</span> um jetzt fortzufahren .'  # not Enter ... fortzufahren
    # a tie between runs of the same length goes to the one with more of the content's attention
    soft = torch.zeros(6, 5)
    soft[5, 1], soft[1, 1] = 0.6, 0.3
    text = "Drücke Enter um jetzt fortzufahren ."
    out = restore(plan, AlignedTranslation(text, plan.text.split(), text.split(), soft=soft, links=links))
    assert out.endswith('<span class="kbd">.</span>')


def test_the_heldout_set_covers_every_kind_with_150_hand_marked_span_pairs_split_into_dev_and_test():
    rows = [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines()]
    kinds = Counter(row["kind"] for row in rows)
    assert len(rows) >= 150 and set(kinds) >= {"span", "void", "entity", "literal", "placeholder", "comment", "stray",
                                               "pair", "broken", "plain"}  # fmt: skip
    marked = [row for row in rows if "reference" in row]
    pairs = Counter((row["split"], row["set"]) for row in marked for _ in parse_markup(row["source"]).pairs)
    assert sum(pairs.values()) >= 150 and pairs["dev", "ui"] + pairs["test", "ui"] >= sum(pairs.values()) / 2
    assert pairs["test", "ui"] + pairs["test", "sentence"] >= 2 * (pairs["dev", "ui"] + pairs["dev", "sentence"])
    ui = [row for row in marked if row["set"] == "ui"]  # real UI strings: attributes, nesting, two tags a line
    assert sum('="' in row["source"] for row in ui) >= 20 and sum(len(parse_markup(row["source"]).pairs) >= 2
                                                                  for row in ui) >= 30  # fmt: skip
    assert sum(any(p.parent is not None for p in parse_markup(row["source"]).pairs) for row in ui) >= 5
    for row in marked:  # the reference has the source's tags, and they nest
        assert Counter(tags(row["reference"])) == Counter(tags(row["source"])) and well_formed(row["reference"])


def test_heldout_lines_come_out_well_formed_with_their_markup_exactly_once(fitted):
    model, tokenizer = fitted
    rows = [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines()]
    rows = [row for row in rows if row["kind"] not in ("span", "broken")][::3]
    outputs = translate(model, tokenizer, [row["source"] for row in rows], markup="xml")
    for row, output in zip(rows, outputs, strict=True):
        source, plan = row["source"], parse_markup(row["source"])
        if not plan.marked:
            continue
        assert well_formed(output, html=plan.html), (source, output)
        for of in (tags, placeholders, comments):
            assert Counter(of(output)) == Counter(of(source)), (source, output)
        for item in plan.points:
            if item.edge == "end" and source.endswith(item.text):
                assert output.endswith(item.text), (source, output)
            if item.edge == "start" and source.startswith(item.text):
                assert output.startswith(item.text), (source, output)
