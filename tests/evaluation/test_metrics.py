"""Scores (`vaswani_mt.evaluation.metrics`): sacreBLEU with its signature, the paper's compound-split BLEU
(tensor2tensor's get_ende_bleu.sh and multi-bleu.perl), the loss per target token, and the translate and evaluate
commands."""

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import sacrebleu
from conftest import make_model, run_main

from vaswani_mt.cli import evaluate as evaluate_cli
from vaswani_mt.cli import translate as translate_cli
from vaswani_mt.evaluation.metrics import (
    COMPOUND_SPLIT_LABEL,
    bleu,
    compound_split,
    compound_split_bleu,
    score_translations,
    token_nll,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# The scripts run the tiny model: one thread is many times faster on a busy 2-core machine.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ROOT = Path(__file__).resolve().parents[2]


def test_bleu_equals_sacrebleu_and_carries_its_signature():
    hyps = ["Das Haus ist klein.", "Die Katze schläft gern.", "Ich trinke Kaffee."]
    refs = ["Das Haus ist klein.", "Die Katze schläft gerne.", "Ich trinke gern Tee."]
    result = bleu(hyps, refs)
    assert result["score"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert result["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert bleu(refs, refs)["score"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="2 translations but 3"):
        bleu(hyps[:2], refs)


# Hyphenated compounds, quotes, an ampersand and an apostrophe, with what tensor2tensor's get_ende_bleu.sh gives
# multi-bleu.perl for each line, written out by hand: tokenizer.perl -l de escapes & " ' as &amp; &quot; &apos; and
# splits the apostrophe off on both sides (not English); `s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g` splits each compound,
# left to right without overlap, so the one-letter middle of Vitamin-B-Komplex is taken by the first match.
HYPOTHESES = {
    'Er sagte "Hallo".': "Er sagte &quot; Hallo &quot; .",
    "Müller & Söhne liefern die neue Haus-Tür.": "Müller &amp; Söhne liefern die neue Haus ##AT##-##AT## Tür .",
    "Meine E-Mail-Adresse steht auf Seite 3-4.":
        "Meine E ##AT##-##AT## Mail ##AT##-##AT## Adresse steht auf Seite 3 ##AT##-##AT## 4 .",
    "Geht's dir gut?": "Geht &apos; s dir gut ?",
    "Die Rot-Grün-Koalition regiert.": "Die Rot ##AT##-##AT## Grün ##AT##-##AT## Koalition regiert .",
    "Sie nimmt Vitamin-B-Komplex.": "Sie nimmt Vitamin ##AT##-##AT## B-Komplex .",
}  # fmt: skip
REFERENCES = {
    'Er sagte: "Hallo".': "Er sagte : &quot; Hallo &quot; .",
    "Müller & Söhne liefern die Haus-Tür morgen.": "Müller &amp; Söhne liefern die Haus ##AT##-##AT## Tür morgen .",
    "Meine E-Mail-Adresse steht auf den Seiten 3-4.":
        "Meine E ##AT##-##AT## Mail ##AT##-##AT## Adresse steht auf den Seiten 3 ##AT##-##AT## 4 .",
    "Geht's dir gut?": "Geht &apos; s dir gut ?",
    "Die Rot-Grün-Koalition regiert weiter.": "Die Rot ##AT##-##AT## Grün ##AT##-##AT## Koalition regiert weiter .",
    "Sie nimmt täglich Vitamin-B-Komplex.": "Sie nimmt täglich Vitamin ##AT##-##AT## B-Komplex .",
}  # fmt: skip


def multi_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, int, int]:
    """multi-bleu.perl's formula, one reference: clipped n-gram precisions (n = 1-4) over whitespace tokens, their
    geometric mean, brevity penalty exp(1 - r/c) when c < r, times 100; BLEU, c and r."""
    correct, total, c, r = [0] * 4, [0] * 4, 0, 0
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        hyp, ref = hypothesis.split(), reference.split()
        c, r = c + len(hyp), r + len(ref)
        for n in range(1, 5):
            hyp_ngrams = Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
            ref_ngrams = Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
            correct[n - 1] += sum(min(count, ref_ngrams[gram]) for gram, count in hyp_ngrams.items())
            total[n - 1] += sum(hyp_ngrams.values())
    if not all(correct):
        return 0.0, c, r
    penalty = math.exp(1 - r / c) if c < r else 1.0
    return 100 * penalty * math.exp(sum(math.log(k / t) for k, t in zip(correct, total, strict=True)) / 4), c, r


def test_compound_split_lines_are_what_get_ende_bleu_gives_multi_bleu():
    for text, expected in {**HYPOTHESES, **REFERENCES}.items():
        assert compound_split(text) == expected
    assert compound_split("A-B-C a--b x - y") == "A ##AT##-##AT## B-C a ##AT##-##AT## -b x - y"
    assert compound_split("5 < 6 > 4 [x] a|b") == "5 &lt; 6 &gt; 4 &#91; x &#93; a &#124; b"  # the rest of escaping
    assert compound_split("Es ist Art. 5 vom 3. Mai.") == "Es ist Art. 5 vom 3. Mai ."


def test_compound_split_bleu_is_multi_bleu_on_those_lines():
    result = compound_split_bleu(list(HYPOTHESES), list(REFERENCES))
    assert result["hypotheses"] == list(HYPOTHESES.values()) and result["references"] == list(REFERENCES.values())
    expected, c, r = multi_bleu(list(HYPOTHESES.values()), list(REFERENCES.values()))
    assert (result["sys_len"], result["ref_len"]) == (c, r) == (49, 53)  # brevity penalty exp(1 - 53/49)
    assert result["score"] == pytest.approx(expected, abs=1e-9)
    # Moses' own scripts on these lines (tokenizer.perl of Dec 2016, the perl one-liner, multi-bleu.perl with
    # the score printed to 10 decimals) gave 67.5894805804.
    assert result["score"] == pytest.approx(67.5894805804, abs=1e-9)
    assert result["label"] == COMPOUND_SPLIT_LABEL
    assert result["signature"].startswith("moses:de|escape:yes|compound:##AT##|sacremoses:")
    sacrebleu_part = f"|nrefs:1|case:mixed|eff:no|tok:none|smooth:none|version:{sacrebleu.__version__}"
    assert result["signature"].endswith(sacrebleu_part)
    # No smoothing, as multi-bleu.perl: no 4-gram in common is a BLEU of 0 (sacreBLEU's default smoothing: 30.2).
    assert compound_split_bleu(["Die Tür ist offen."], ["Die Tür war offen."])["score"] == 0.0
    with pytest.raises(ValueError, match="1 translations but 2"):
        compound_split_bleu(["a"], ["a", "b"])


def test_score_translations_holds_both_bleus():
    hypotheses, references = list(HYPOTHESES), list(REFERENCES)
    scores = score_translations(hypotheses, references, target_lang="de")
    assert scores["score"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert scores["compound_split_bleu"] == pytest.approx(67.5894805804, abs=1e-9)
    assert scores["compound_split_signature"] == compound_split_bleu(hypotheses, references)["signature"]


def test_evaluate_script_scores_existing_output_without_a_model(tmp_path, monkeypatch):
    hypotheses, references = tmp_path / "hyp.de", tmp_path / "ref.de"
    hypotheses.write_text("\n".join(HYPOTHESES) + "\n", encoding="utf-8")
    references.write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    script = [sys.executable, str(ROOT / "scripts" / "evaluate_model.py")]
    result = subprocess.run([*script, "--hypotheses", str(hypotheses), "--references", str(references)],
                            capture_output=True, text=True, env=ENV)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    sacre = sacrebleu.corpus_bleu(list(HYPOTHESES), [list(REFERENCES)]).score
    assert lines[0] == f"sacreBLEU = {sacre:.2f}  chrF = {json.loads(lines[-1])['chrf']:.2f}  (6 sentences)"
    assert lines[1].startswith("signature: nrefs:1|case:mixed|eff:no|tok:13a")
    assert lines[2].startswith(f"{COMPOUND_SPLIT_LABEL} = 67.59 ")
    assert lines[3].startswith("signature: moses:de|escape:yes|compound:##AT##|")
    assert json.loads(lines[-1])["compound_split_bleu"] == pytest.approx(67.5894805804, abs=1e-9)

    references.write_text("\n".join(list(REFERENCES)[:4]) + "\n", encoding="utf-8")
    stdout, code = run_main(
        evaluate_cli, ["--hypotheses", str(hypotheses), "--references", str(references)], monkeypatch
    )
    assert stdout == "" and code == f"error: {hypotheses} has 6 lines but {references} has 4: the files are not aligned"


def test_token_nll_is_the_unsmoothed_loss_per_target_token(tokenizer):
    model = make_model(seed=3, label_smoothing=0.0).eval()
    sources, references = ["The girl ate an apple.", "How are you?"], ["Das Mädchen aß einen Apfel.", "Wie geht's?"]
    batch = tokenizer(sources, text_target=references, padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    expected = model(**batch).loss.item()  # mean over the real target tokens, </s> included
    assert token_nll(model, tokenizer, sources, references, batch_size=1) == pytest.approx(expected, rel=1e-5)
    assert token_nll(model, tokenizer, sources, references) == pytest.approx(expected, rel=1e-5)


def test_translate_script_reads_stdin_and_writes_a_line_per_line(tokenizer, tmp_path, monkeypatch, capsys):
    model = make_model(seed=2)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    argv = ["--model", str(tmp_path / "m"), "--num_beams", "1"]
    stdout, code = run_main(translate_cli, argv, monkeypatch, b"The girl ate an apple.\n\nHow are you?\n")
    assert code is None
    assert len(stdout.splitlines()) == 3 and stdout.splitlines()[1] == ""
    assert "translating" in capsys.readouterr().err  # the progress bar


def test_evaluate_script_prints_the_signature(tokenizer, tmp_path, monkeypatch):
    model = make_model(seed=2)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    (tmp_path / "src.en").write_text("The girl ate an apple.\nHow are you today?\n")
    (tmp_path / "ref.de").write_text("Das Mädchen hat einen Apfel gegessen.\nWie geht es Ihnen heute?\n")
    files = ["--source_file", str(tmp_path / "src.en"), "--reference_file", str(tmp_path / "ref.de")]
    stdout, code = run_main(evaluate_cli, ["--model", str(tmp_path / "m"), *files], monkeypatch)
    assert code is None
    assert "sacreBLEU = " in stdout and "signature: nrefs:1|case:mixed|eff:no|tok:13a" in stdout
    assert f"\n{COMPOUND_SPLIT_LABEL} = " in stdout and "signature: moses:de|escape:yes|" in stdout
    explicit, code = run_main(evaluate_cli, ["--model", str(tmp_path / "m"), "--length_penalty", "0.6", *files],
                          monkeypatch)  # fmt: skip
    assert code is None and explicit == stdout  # alpha 0.6 is the model's own (the paper's)
