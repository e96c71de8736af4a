"""Format directives by their grammars (issue 67, item 1): every directive of a line comes out of `restore` exactly
once, written as in the source, whatever the translation and its alignment (hypothesis); those without a number keep
their source order; a `%` that starts no directive is text; what the model writes never reads as a directive."""

import dataclasses
from collections import Counter

import pytest
from conftest import ENGLISH
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vaswani_mt.inference.alignments import AlignedTranslation
from vaswani_mt.inference.directives import PLAIN, Formatted, directives, escape_word, formats_of, in_order
from vaswani_mt.inference.markup import UnplacedDirectives, parse_markup, restore
from vaswani_mt.inference.translate import translate

C_FORMAT = formats_of(["c-format"])
FOUND_IN_CATALOGS = ["%u", "%.250s", "%c", "%.*s", "%.255s", "%lu", "%*s", "%g", "%ld", "%04X", "%Zd", "%03d"]


def test_the_c_forms_of_real_catalogs_are_directives_and_a_lone_percent_is_text():
    line = " ".join(FOUND_IN_CATALOGS) + " %1$s %2$*3$.*4$lld %<PRIu64> %-10.3Lf %m %%"
    assert directives(line) == line.split()
    assert directives("50% done, 100% sure, 5 % more, 100%") == []  # no space flag in plain text
    assert directives("% d of % s", C_FORMAT) == ["% d", "% s"]  # a c-format entry: the space flag is C's
    assert directives("%(name)s {0} {name!r:>10} {} {user.name} {{x}}") == ["%(name)s", "{0}", "{name!r:>10}", "{}",
                                                                            "{user.name}", "{{x}}"]  # fmt: skip
    assert directives("%1 of %L2, $HOME", formats_of(["qt-format"])) == ["%1", "%L2"]
    assert directives("$HOME and ${USER}: %s", formats_of(["sh-format"])) == ["$HOME", "${USER}"]
    assert directives("%1 $HOME") == []  # Qt's and the shell's forms only where the entry's flag says so
    assert formats_of(["fuzzy", "no-c-format"]) == PLAIN - {"c"}


def test_which_directives_keep_their_order():
    assert [in_order(d) for d in ("%s", "%*d", "{}", "{:>3}", "%1$s", "%(n)s", "{0}", "{name}")] == [True] * 4 + [
        False
    ] * 4


def test_what_the_model_writes_never_reads_as_a_directive():
    assert escape_word("5%s") == "5%%s" and escape_word("50%") == "50%" and escape_word("{x}") == "{x}"
    assert escape_word("50%", C_FORMAT) == "50%%" and escape_word("{a", formats_of(["python-brace-format"])) == "{{a"


def diagonal(line: str, words: list[str], formats=PLAIN, links=None) -> str:
    plan = parse_markup(line, formats, xml=False)
    source = plan.text.split()
    if links is None:
        links = [(min(k, len(source) - 1), k) for k in range(len(words))] if source else []
    return restore(plan, AlignedTranslation(" ".join(words), source, words, links=links))


def test_unnumbered_directives_keep_their_source_order_when_the_alignment_swaps_them():
    line = "Copied %s files to %d folders"
    out = diagonal(line, "%d Ordner in %s Dateien kopiert".replace("%d ", "").replace("%s ", "").split(),
                   links=[(4, 0), (3, 1), (2, 2), (0, 3)])  # fmt: skip
    assert directives(out) == ["%s", "%d"]
    out = diagonal("Copied %1$s files to %2$d folders", ["Ordner", "in", "Dateien", "kopiert"],
                   C_FORMAT, links=[(3, 0), (2, 1), (1, 2), (0, 3)])  # fmt: skip
    assert Counter(directives(out)) == Counter(["%1$s", "%2$d"])  # numbered: they may move


@pytest.mark.parametrize(("first", "second", "flag"), [("%s", "%d", "c-format"), ("%-5s", "%*d", "c-format"),
                                                       ("%s", "%r", "python-format"),
                                                       ("{}", "{:>3}", "python-brace-format")])  # fmt: skip
def test_unnumbered_directives_inside_and_outside_one_tag_keep_their_source_order(first, second, flag):
    """`%s <b>%d files</b>`: the tag's content translated first puts the inner directive first; the argument order
    does not change, so the outer one is written first still (issue 67)."""
    formats = formats_of([flag])
    plan = parse_markup(f"Copy {first} to <b>{second} files</b> now", formats)
    target = ["Dateien", "nach", "jetzt", "kopieren"]  # <b>...Dateien</b> nach ... jetzt kopieren
    out = restore(plan, AlignedTranslation(" ".join(target), plan.text.split(), target,
                                           links=[(2, 0), (1, 1), (3, 2), (0, 3)]))  # fmt: skip
    assert [d for d in directives(out, formats, False)] == [first, second], out
    assert out.index("<b>") < out.index("Dateien") < out.index("</b>")  # the tag still holds its words


def test_a_line_whose_directives_cannot_be_placed_keeps_them_at_the_end():
    plan = parse_markup("Delete %s now", xml=False)
    plan.points[0] = dataclasses.replace(plan.points[0], text="%d")  # what the line has no more
    with pytest.raises(UnplacedDirectives) as raised:
        restore(plan, AlignedTranslation("Jetzt löschen", ["Delete", "now"], ["Jetzt", "löschen"], links=[(1, 0)]))
    assert raised.value.output == "Jetzt löschen %d"


_FLAGS = st.sampled_from(["", "-", "0", "+", "#", "'", "-0"])
_WIDTH = st.sampled_from(["", "5", "10", "*"])
_PRECISION = st.sampled_from(["", ".2", ".250", ".*"])
_LENGTH = st.sampled_from(["", "h", "hh", "l", "ll", "L", "z", "Z", "j", "t", "q"])
_CONVERSION = st.sampled_from(list("diouxXeEfFgGaAcspn"))
C_DIRECTIVES = st.one_of(
    st.builds(lambda *parts: "%" + "".join(parts), _FLAGS, _WIDTH, _PRECISION, _LENGTH, _CONVERSION),
    st.sampled_from(["%<PRIu64>", "%<PRId32>", "%m", "%%", *FOUND_IN_CATALOGS]),
)
OTHER_DIRECTIVES = st.sampled_from(["%(name)s", "%(count)d", "{0}", "{1}", "{name}", "{name!r:>10}", "{}",
                                    "{:.2f}", "{{name}}", "%1$s", "%2$lu"])  # fmt: skip
WORDS = st.sampled_from(["file", "the", "Datei", "cannot", "open", "50%", "100%", "(x)", "a:", "table", "über"])
GLUE = st.sampled_from([" ", " ", " ", '"', ".", ":", "'", "(", ")", ", "])


@st.composite
def format_lines(draw, directive=C_DIRECTIVES):
    pieces = draw(st.lists(st.one_of(WORDS, directive, OTHER_DIRECTIVES), min_size=1, max_size=8))
    line = ""
    for piece in pieces:
        line += piece + draw(GLUE)
    return line.strip()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line=format_lines(), target=st.lists(WORDS | st.sampled_from(["%", "5%d", "% d", "%s"]), max_size=8),
       data=st.data())  # fmt: skip
def test_every_directive_comes_out_exactly_once_as_written(line, target, data):
    plan = parse_markup(line, xml=False)
    if not plan.marked:  # no directive: translated as without them
        return
    source = plan.text.split()
    links = data.draw(st.lists(st.tuples(st.integers(0, max(len(source) - 1, 0)), st.integers(0, 8)), max_size=10))
    links = [(s, t) for s, t in links if source and t < len(target)]
    try:
        out = restore(plan, AlignedTranslation(" ".join(target), source, target, links=links))
    except UnplacedDirectives as unplaced:  # then the output keeps them at the end
        out = unplaced.output
    assert Counter(directives(out, literals=False)) == Counter(directives(line, literals=False)), (line, out)
    ordered = [d for d in directives(line, literals=False) if in_order(d)]
    assert [d for d in directives(out, literals=False) if in_order(d)] == ordered, (line, out)


@settings(max_examples=200, deadline=None)
@given(line=format_lines(), target=st.lists(WORDS | st.sampled_from(["%", "% d", "{", "}"]), max_size=6))
@pytest.mark.parametrize("flag", ["c-format", "python-format", "python-brace-format"])
def test_a_flagged_entry_gets_no_directive_the_source_lacks(flag, line, target):
    formats = formats_of([flag])
    plan = parse_markup(line, formats, xml=False)
    source = plan.text.split()
    links = [(min(k, len(source) - 1), k) for k in range(len(target))] if source else []
    try:
        out = restore(plan, AlignedTranslation(" ".join(target), source, target, links=links))
    except UnplacedDirectives as unplaced:
        out = unplaced.output
    assert Counter(directives(out, formats, False)) == Counter(directives(line, formats, False)), (line, out)


@pytest.mark.usefixtures("one_thread")
def test_lines_without_directives_translate_as_before_and_with_them_keep_them(fitted):
    model, tokenizer = fitted
    lines = [ENGLISH[0], "unable to open output file '%.250s': %s", "%u of %lu files (%04X)", ENGLISH[1]]
    outputs = translate(model, tokenizer, lines, markup="directives")
    assert [outputs[0], outputs[3]] == translate(model, tokenizer, [ENGLISH[0], ENGLISH[1]])
    for line, output in zip(lines[1:3], outputs[1:3], strict=True):
        assert directives(output) == directives(line), (line, output)
    assert translate(model, tokenizer, ["a < b & c %s"], markup="directives")[0].count("&amp;") == 0  # no XML


@pytest.mark.usefixtures("one_thread")
def test_a_formatted_line_is_read_by_its_own_formats(fitted):
    model, tokenizer = fitted
    line = "% d of %1 files"  # a c-format entry: `% d` is C's space flag; `%1` is text (it is Qt's)
    (output,) = translate(model, tokenizer, [Formatted(line, C_FORMAT)], markup="directives")
    assert directives(output, C_FORMAT, False) == ["% d"]
    assert "%" not in output.replace("% d", "", 1).replace("%%", "")  # any other `%` the model wrote is doubled


def test_a_term_with_any_directive_is_no_typo(tokenizer):
    from vaswani_mt.model.pipeline_vaswani import unusual_pieces

    for directive in ("%.250s", "%(name)s", "%04X", "{name!r:>10}", "%<PRIu64>", "%lu"):
        assert unusual_pieces(tokenizer, directive) is None, directive


@pytest.mark.usefixtures("one_thread")
def test_a_catalog_line_is_xml_only_where_it_has_tags_comments_or_entities(fitted):
    from vaswani_mt.inference.markup import tags

    model, tokenizer = fitted
    lines = [Formatted("Tom & Jerry see %s", PLAIN), Formatted("Open <b>%s</b> now", C_FORMAT), "Tom & Jerry see %s"]
    plain, tagged, text = translate(model, tokenizer, lines, markup="xml")
    assert "&amp;" not in plain and directives(plain) == ["%s"]
    assert tags(tagged) == ["<b>", "</b>"] and directives(tagged, C_FORMAT) == ["%s"]
    assert "&amp;" in text or "&" not in text  # a text line with markup is XML, as before
