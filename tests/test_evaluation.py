import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
from conftest import make_model

from vaswani_mt.evaluation import bleu, load_for_inference, token_nll, translate

ROOT = Path(__file__).resolve().parent.parent


def test_bleu_equals_sacrebleu_and_carries_its_signature():
    hyps = ["Das Haus ist klein.", "Die Katze schläft gern.", "Ich trinke Kaffee."]
    refs = ["Das Haus ist klein.", "Die Katze schläft gerne.", "Ich trinke gern Tee."]
    result = bleu(hyps, refs)
    assert result["score"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert result["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert bleu(refs, refs)["score"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="2 translations but 3"):
        bleu(hyps[:2], refs)


def test_token_nll_is_the_unsmoothed_loss_per_target_token(tokenizer):
    model = make_model(seed=3, label_smoothing=0.0).eval()
    sources, references = ["The girl ate an apple.", "How are you?"], ["Das Mädchen aß einen Apfel.", "Wie geht's?"]
    batch = tokenizer(sources, text_target=references, padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    expected = model(**batch).loss.item()  # mean over the real target tokens, </s> included
    assert token_nll(model, tokenizer, sources, references, batch_size=1) == pytest.approx(expected, rel=1e-5)
    assert token_nll(model, tokenizer, sources, references) == pytest.approx(expected, rel=1e-5)


def test_translate_keeps_order_and_matches_one_by_one(tokenizer):
    model = make_model(seed=2)
    sentences = ["The girl ate an apple.", "How are you?", "", "She reads a book in the café.", "   "]
    batched = translate(model, tokenizer, sentences, batch_size=2, max_new_tokens=6, num_beams=2)
    assert batched[2] == "" and batched[4] == ""
    for sentence, out in zip(sentences, batched, strict=True):
        if sentence.strip():
            assert translate(model, tokenizer, [sentence], max_new_tokens=6, num_beams=2) == [out]


def test_translate_script_reads_stdin_and_writes_a_line_per_line(tokenizer, tmp_path):
    model = make_model(seed=2)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "translate.py"), "--model", str(tmp_path / "m"), "--num_beams", "1"],
        input="The girl ate an apple.\n\nHow are you?\n",
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.splitlines()) == 3 and result.stdout.splitlines()[1] == ""
    assert "translating" in result.stderr  # the progress bar


def test_evaluate_script_prints_the_signature(tokenizer, tmp_path):
    model = make_model(seed=2)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    (tmp_path / "src.en").write_text("The girl ate an apple.\nHow are you today?\n")
    (tmp_path / "ref.de").write_text("Das Mädchen hat einen Apfel gegessen.\nWie geht es Ihnen heute?\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "evaluate_model.py"), "--model", str(tmp_path / "m"),
         "--source_file", str(tmp_path / "src.en"), "--reference_file", str(tmp_path / "ref.de")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "sacreBLEU = " in result.stdout and "signature: nrefs:1|case:mixed|eff:no|tok:13a" in result.stdout
    explicit = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "evaluate_model.py"), "--model", str(tmp_path / "m"),
         "--length_penalty", "0.6", "--source_file", str(tmp_path / "src.en"),
         "--reference_file", str(tmp_path / "ref.de")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert explicit.stdout == result.stdout  # alpha 0.6 is the model's own (the paper's)


def test_loading_something_else_says_what_it_is(tmp_path):
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_for_inference(str(tmp_path))
    from transformers import MarianConfig

    MarianConfig().save_pretrained(tmp_path / "marian")
    with pytest.raises(ValueError, match="'marian' model, not a vaswani_mt"):
        load_for_inference(str(tmp_path / "marian"))
