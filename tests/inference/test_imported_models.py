"""Every translate option on an imported OPUS-MT checkpoint (its MarianTokenizer, `</s>` 0, `<pad>` last and the
decoder's start), as on a trained model: n-best lists, alignments, markup, terms (target text through the target
SentencePiece model), prefixes, blocked phrases, compute types, a CTranslate2 export giving our lines, and a stopped
`--output` run resumed to the same bytes."""

from __future__ import annotations

import pytest
from conftest import stop_at_batch

from vaswani_mt.cli import translate as translate_cli
from vaswani_mt.hub.importing import import_model
from vaswani_mt.inference.backends import TorchBackend
from vaswani_mt.inference.controls import ControlReport
from vaswani_mt.inference.translator import Translator

pytestmark = pytest.mark.usefixtures("one_thread")

SOURCES = ["The house is small.", "I had no appreciation of the risks involved.", "How are you today?",
           "Better job prospects are a strong pull factor for moving to a new country."]  # fmt: skip
SHORT = {"max_new_tokens": 8}


@pytest.fixture(scope="module")
def imported(opus_mt, tmp_path_factory):
    """The tiny Marian folder imported, as `vaswani-mt-import` writes it."""
    return import_model(str(opus_mt.tiny), tmp_path_factory.mktemp("imported") / "tiny")


@pytest.fixture(scope="module")
def translator(imported):
    return Translator(str(imported), batch_size=2, generate_kwargs=SHORT)


def test_plain_translation_never_emits_the_decoder_start(translator, imported):
    lines = translator.translate(SOURCES)
    assert len(lines) == len(SOURCES) and all(isinstance(line, str) and "<pad>" not in line for line in lines)
    # The checkpoint's ban of `<pad>` holds beside a blocked phrase of the user's (which would otherwise replace it).
    blocked = Translator(str(imported), batch_size=2, generate_kwargs=SHORT, block=(lines[0].split()[0],))
    pad = blocked.backend.model.config.pad_token_id
    assert (pad,) in blocked._request.blocked and len(blocked._request.blocked) > 1
    assert all(lines[0].split()[0] not in line.split() for line in blocked.translate(SOURCES))


def test_nbest_lists_have_k_ranked_hypotheses(imported):
    lists = Translator(str(imported), batch_size=2, generate_kwargs=SHORT, nbest=3).translate(SOURCES)
    for hypotheses in lists:
        assert len(hypotheses) == 3
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True) and all(h.log_prob <= 0 for h in hypotheses)


def test_alignments_link_words_of_both_sides(imported):
    aligned = Translator(str(imported), batch_size=2, generate_kwargs=SHORT, alignments="hard").translate(SOURCES)
    for source, line in zip(SOURCES, aligned, strict=True):
        assert line.source_words == source.split() and line.target_words == line.split()
        assert all(0 <= s < len(line.source_words) and 0 <= t < len(line.target_words) for s, t in line.links)
        assert line.links or not line.target_words


def test_markup_comes_back_well_formed(imported):
    marked = ["The <b>house</b> is small.", "How are {0} <i>today</i>?"]
    lines = Translator(str(imported), batch_size=2, generate_kwargs=SHORT, markup="xml").translate(marked)
    assert lines[0].count("<b>") == lines[0].count("</b>") == 1 and lines[1].count("<i>") == 1
    assert lines[1].count("{0}") == 1


def test_terms_and_prefixes_are_target_text(imported):
    translator = Translator(
        str(imported), batch_size=2, generate_kwargs={"max_new_tokens": 12}, constraints="unordered"
    )
    report = ControlReport()
    terms = [["Haus"], [], ["Risiko"], []]
    lines = translator.translate(SOURCES, terms=terms, report=report)
    assert "Haus" in lines[0] and "Risiko" in lines[2] and not report.unmet
    tokenizer = translator.tokenizer
    # "Haus" as the target model splits it, not as the source (English) one does
    assert tokenizer(text_target="Haus", add_special_tokens=False)["input_ids"] != tokenizer("Haus")["input_ids"][:-1]
    prefixed = Translator(str(imported), batch_size=2, generate_kwargs=SHORT).translate(
        SOURCES, prefixes=["Das Haus", "", "Wie", ""]
    )
    assert prefixed[0].startswith("Das Haus") and prefixed[2].startswith("Wie")


@pytest.mark.parametrize("compute_type", ["int8", "bfloat16"])
def test_compute_types_translate_an_imported_model(imported, compute_type):
    try:
        translator = Translator(str(imported), batch_size=2, generate_kwargs=SHORT, compute_type=compute_type)
    except ValueError as refused:  # bfloat16 where the CPU has no native bf16
        pytest.skip(str(refused))
    lines = translator.translate(SOURCES)
    assert len(lines) == len(SOURCES) and all(isinstance(line, str) for line in lines)


def test_ctranslate2_export_gives_our_lines(imported, tmp_path, restore_threads):
    pytest.importorskip("ctranslate2")
    from vaswani_mt.export.marian import export_model

    ct2 = export_model(imported, "ctranslate2", tmp_path / "ct2")
    assert {"source.spm", "target.spm", "vocab.json", "model.bin"} <= {p.name for p in ct2.iterdir()}
    for options in ({"num_beams": 1}, {}):  # greedy, and the paper's beam 4 with GNMT 0.6, to |X| + 50 tokens
        ours = Translator(str(imported), batch_size=2, **options).translate(SOURCES)
        theirs = Translator(str(ct2), batch_size=2, threads=1, **options).translate(SOURCES)
        assert theirs == ours


def test_a_stopped_run_resumes_to_the_same_bytes(imported, tmp_path, monkeypatch):
    source = tmp_path / "in.en"
    source.write_text("".join(f"{line}\n" for line in SOURCES * 3))
    options = ["--model", str(imported), "--input", str(source), "--batch_size", "2", "--chunk_size", "4",
               "--num_beams", "2", "--threads", "1"]  # fmt: skip
    whole = tmp_path / "whole.de"
    translate_cli.main([*options, "--output", str(whole)])
    stopped = tmp_path / "stopped.de"
    with monkeypatch.context() as patch:
        stop_at_batch(patch, TorchBackend, batch=3)
        with pytest.raises(SystemExit):
            translate_cli.main([*options, "--output", str(stopped)])
    assert stopped.with_name("stopped.de.partial").exists()
    translate_cli.main([*options, "--output", str(stopped)])
    assert stopped.read_bytes() == whole.read_bytes() and len(whole.read_text().splitlines()) == 12


def test_the_pipeline_of_an_imported_folder_translates(imported):
    from vaswani_mt.inference.pipeline import translation_pipeline

    pipe = translation_pipeline(str(imported), device="cpu", max_new_tokens=6)
    out = pipe(["The house is small.", ""])
    assert [list(row) for row in out] == [["translation_text"], ["translation_text"]] and out[1][
        "translation_text"
    ] == ""


def test_an_imported_folder_publishes_and_serves_the_demo(imported, tmp_path):
    from vaswani_mt.app.demo import translate_for_demo
    from vaswani_mt.hub.publish import publish
    from vaswani_mt.inference.loading import load_for_inference

    # The Hub's folder is built and loads in a fresh process without vaswani_mt, with the same greedy tokens; the
    # card is the import's (source, license, citation), with no results of its own to require.
    result = publish(imported, "USER/opus-mt-tiny", output=tmp_path / "hub", dry_run=True, log=lambda *_: None)
    assert result["report"]["class"] == "VaswaniForConditionalGeneration" and result["url"] is None
    assert {"source.spm", "target.spm", "vocab.json"} <= set(result["report"]["files"])
    model, tokenizer = load_for_inference(str(imported), device="cpu", attn_implementation="eager")
    text, _, notes = translate_for_demo(model, tokenizer, "The <b>house</b> is small.", terms="Haus", markup=True,
                                        max_len_b=10)  # fmt: skip
    assert "Haus" in text and text.count("<b>") == text.count("</b>") == 1 and "Haus ✓ met" in notes
