"""The library's translation pipeline (`translation_pipeline`): without alignments or markup the payload's pipeline
unchanged; with them, per call or from the construction, the texts, links and tags of `translate()`."""

import pytest
from conftest import ENGLISH

from vaswani_mt.inference.alignments import AlignedTranslation, format_alignment
from vaswani_mt.inference.markup import tags, well_formed
from vaswani_mt.inference.pipeline import translation_pipeline
from vaswani_mt.inference.translate import translate, translate_nbest
from vaswani_mt.model.pipeline_vaswani import TranslationPipeline

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def translator(fitted_folder):
    return translation_pipeline(str(fitted_folder), device="cpu")


def test_without_alignments_or_markup_it_is_the_payloads_pipeline(translator, fitted_folder, fitted):
    model, tokenizer = fitted
    plain = TranslationPipeline(model=model, tokenizer=tokenizer)
    assert translator(ENGLISH[:3]) == plain(ENGLISH[:3])
    assert translator(ENGLISH[0]) == plain(ENGLISH[0])


def test_alignments_per_call_give_translates_texts_and_marian_fields(translator, fitted):
    model, tokenizer = fitted
    expected = translate(model, tokenizer, ENGLISH[:3], alignments="hard")
    results = translator(ENGLISH[:3], alignments="hard")
    assert [r["translation_text"] for r in results] == expected
    assert [r["alignment"] for r in results] == [format_alignment(t) for t in expected]
    assert all(isinstance(r["translation_text"], AlignedTranslation) for r in results)
    one = translator(ENGLISH[0], alignments="soft")
    assert len(one) == 1 and one[0]["translation_text"].soft.shape[1] == len(ENGLISH[0].split())
    assert translator(ENGLISH[:3]) == [{"translation_text": str(t)} for t in expected]  # the next call: none


def test_nbest_constraints_and_generate_keywords_go_through(translator, fitted):
    model, tokenizer = fitted
    lists = translator(ENGLISH[:2], alignments="hard", num_return_sequences=2, num_beams=3)
    expected = translate_nbest(model, tokenizer, ENGLISH[:2], 2, alignments="hard", num_beams=3)
    assert [[r["translation_text"] for r in rows] for rows in lists] == [[h.text for h in hs] for hs in expected]
    forced = translator(ENGLISH[:2], alignments="hard", constraints=["Apfel"])
    assert all("Apfel" in r["translation_text"] for r in forced)
    with pytest.raises(ValueError, match="markup and n-best lists do not go together"):
        translator(ENGLISH[:2], markup="xml", num_return_sequences=2, num_beams=3)


def test_markup_from_the_construction_puts_the_tags_back(fitted_folder, fitted):
    model, tokenizer = fitted
    marked = translation_pipeline(str(fitted_folder), device="cpu", markup="xml")
    lines = ["The <b>girl</b> ate an apple.", 'Click <a href="x.html">here</a> {0}.<br/>']
    results = marked(lines)
    assert [r["translation_text"] for r in results] == translate(model, tokenizer, lines, markup="xml")
    for line, result in zip(lines, results, strict=True):
        assert well_formed(result["translation_text"]) and sorted(tags(result["translation_text"])) == sorted(
            tags(line)
        )
    assert result["translation_text"].count("{0}") == 1


def test_the_constructions_search_terms_and_batch_size_apply_to_aligned_calls(fitted_folder, fitted):
    model, tokenizer = fitted
    built = translation_pipeline(str(fitted_folder), device="cpu", num_beams=2, constraints=["Apfel"], batch_size=2)
    expected = translate(model, tokenizer, ENGLISH[:3], num_beams=2, constraints=[["Apfel"]] * 3, alignments="hard")
    assert [r["translation_text"] for r in built(ENGLISH[:3], alignments="hard")] == expected
