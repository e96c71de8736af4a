"""Importing OPUS-MT checkpoints (MarianMTModel folders made here with opus-mt-en-de's config, nonzero biases and a
logits bias): the same logits, greedy and beam tokens as transformers' `MarianMTModel` (their code, not ours) on the
built-in test split, an exact round trip, one-line refusals of what the paper's architecture cannot represent, and
the command's folder (card, tokenizer, search) taken by the commands as a trained one is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import OPUS_MT_TINY, ROOT, make_marian_folder
from transformers import MarianMTModel, MarianTokenizer

from vaswani_mt.export.marian import from_marian, to_marian
from vaswani_mt.hub.importing import ModelImportError, import_model
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.model.pipeline_vaswani import encode_source

pytestmark = pytest.mark.transformers_internals  # MarianMTModel and MarianTokenizer: their code, their versions

BATCH = 64


@pytest.fixture(scope="module")
def imported(opus_mt, tmp_path_factory):
    """Each Marian folder imported (`import_model`), loaded as the commands load it, beside MarianMTModel's own."""
    root = tmp_path_factory.mktemp("imported")
    loaded = {}
    for name in ("swish", "relu", "tiny"):
        import_model(str(getattr(opus_mt, name)), root / name)
        model, tokenizer = load_for_inference(str(root / name), device="cpu")
        marian = MarianMTModel.from_pretrained(getattr(opus_mt, name)).eval()
        loaded[name] = (model, tokenizer, marian, root / name)
    return loaded


@pytest.mark.parametrize(
    ("name", "stride"),
    [("swish", 8), ("relu", 8), pytest.param("swish", 1, marks=pytest.mark.slow),
     pytest.param("relu", 1, marks=pytest.mark.slow)],
)  # fmt: skip
def test_imported_model_gives_marians_logits_on_every_test_sentence(imported, opus_mt, name, stride):
    """Every test-split sentence under -m slow (stride 1); every 8th in CI."""
    model, tokenizer, marian, _ = imported[name]
    theirs = MarianTokenizer.from_pretrained(getattr(opus_mt, name))
    assert type(tokenizer).__name__ == "MarianTokenizer" and model.config.activation_function == name
    assert model.config.logits_bias and model.config.attention_bias and model.config.layer_norm_eps == 1e-5
    worst = 0.0
    sentences = opus_mt.test[::stride]
    for start in range(0, len(sentences), BATCH):
        pairs = sentences[start : start + BATCH]
        batch = theirs([en for en, _ in pairs], text_target=[de for _, de in pairs], padding=True, return_tensors="pt")
        # The commands' encoding of each source (offsets through the SentencePiece model) is the tokenizer's own.
        for (en, _), ids, mask in zip(pairs, batch["input_ids"], batch["attention_mask"], strict=True):
            assert encode_source(tokenizer, en, 512) == ids[mask.bool()].tolist()
        labels = batch["labels"]
        decoder_input_ids = marian.prepare_decoder_input_ids_from_labels(labels=labels)
        inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      decoder_input_ids=decoder_input_ids)  # fmt: skip
        with torch.no_grad():
            ours, reference = model(**inputs).logits, marian(**inputs).logits
        real = labels.ne(theirs.pad_token_id)
        worst = max(worst, (ours - reference).abs()[real].max().item())
    print(f"{name}, {len(sentences)} sentences: max |logits - MarianMTModel's| = {worst:.3g}")  # RESULTS.md, with -s
    assert worst <= 1e-4


def test_imported_model_searches_as_marian_does_with_the_same_ranking(imported, opus_mt):
    model, tokenizer, marian, _ = imported["swish"]
    sources = [en for en, _ in opus_mt.test[:16]]
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    same = dict(max_new_tokens=12, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        greedy = model.generate(**batch, num_beams=1, **same)
        reference = marian.generate(**batch, num_beams=1, forced_eos_token_id=None, **same)
    assert greedy.sequences.tolist() == reference.sequences.tolist()
    for ours, theirs in zip(greedy.scores, reference.scores, strict=True):
        assert torch.allclose(ours, theirs, atol=1e-4)
    # Beam search ranked by log P alone (length penalty 0 in both), stopping as fairseq does (early_stopping=True).
    with torch.no_grad():
        beam = model.generate(**batch, num_beams=4, length_penalty=0.0, early_stopping=True, **same)
        reference = marian.generate(**batch, num_beams=4, length_penalty=0.0, early_stopping=True,
                                    forced_eos_token_id=None, **same)  # fmt: skip
    assert beam.sequences.tolist() == reference.sequences.tolist()
    assert torch.allclose(beam.sequences_scores, reference.sequences_scores, atol=1e-4)


def test_paper_search_on_imported_model_gives_its_own_valid_output(imported, opus_mt):
    model, tokenizer, _, folder = imported["swish"]
    saved = json.loads((folder / "generation_config.json").read_text())
    assert (saved["num_beams"], saved["length_penalty"], saved["max_len_a"], saved["max_len_b"]) == (4, 0.6, 1, 50)
    pad = model.config.pad_token_id
    assert saved["bad_words_ids"] == [[pad]] and saved["decoder_start_token_id"] == pad
    batch = tokenizer([en for en, _ in opus_mt.test[:8]], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch)  # the paper's: beam 4, GNMT 0.6, |X| + 50
    eos = model.config.eos_token_id
    for row, length in zip(out.tolist(), batch["attention_mask"].sum(-1).tolist(), strict=True):
        tokens = row[1 : row.index(eos) + 1] if eos in row else row[1:]  # then padding
        assert row[0] == pad and pad not in tokens and len(tokens) <= length + 50


def test_round_trip_gives_marians_weights_bit_for_bit(imported):
    _, _, marian, _ = imported["swish"]
    back = to_marian(from_marian(marian)).state_dict()
    original = marian.state_dict()
    assert set(back) == set(original)
    for key, tensor in original.items():
        assert torch.equal(back[key], tensor), key
    assert marian.final_logits_bias.abs().min() > 0 and torch.equal(back["final_logits_bias"], marian.final_logits_bias)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (dict(share_encoder_decoder_embeddings=False), "share_encoder_decoder_embeddings"),
        (dict(normalize_before=True), "normalize_before"),
        (dict(normalize_embedding=True), "normalize_embedding"),
        (dict(static_position_embeddings=False), "static_position_embeddings"),
        (dict(scale_embedding=False), "scale_embedding"),
        (dict(activation_function="tanh"), "activation_function"),
        (dict(decoder_ffn_dim=128), "encoder_ffn_dim"),
    ],
)
def test_what_the_paper_cannot_represent_is_refused_naming_the_field(opus_mt, tmp_path, change, field):
    source = make_marian_folder(tmp_path / "source", opus_mt.tokenizer, **{**OPUS_MT_TINY, **change})
    with pytest.raises(ModelImportError, match=f"cannot import this Marian model exactly: {field}"):
        import_model(str(source), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_learned_positions_are_refused(opus_mt, tmp_path):
    source = make_marian_folder(tmp_path / "source", opus_mt.tokenizer, **OPUS_MT_TINY)
    marian = MarianMTModel.from_pretrained(source)
    with torch.no_grad():
        marian.model.decoder.embed_positions.weight.add_(0.01)
    with pytest.raises(ValueError, match=r"model.decoder.embed_positions.weight is not the sinusoidal encoding"):
        from_marian(marian)


def test_paper_model_comes_back_with_the_papers_config(tokenizer):
    from conftest import make_model

    model = make_model()
    back = from_marian(to_marian(model))
    assert not back.config.logits_bias and not back.config.attention_bias
    assert back.config.activation_function == "relu" and back.config.layer_norm_eps == model.config.layer_norm_eps
    ours = model.state_dict()
    assert all(torch.equal(back.state_dict()[key], tensor) for key, tensor in ours.items())


def _run(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", **env})  # fmt: skip


def test_import_command_writes_a_folder_the_commands_take(opus_mt, tmp_path):
    output = tmp_path / "imported"
    result = _run("scripts/import_model.py", "--model", str(opus_mt.tiny), "--output", str(output))
    assert result.returncode == 0, result.stderr[-2000:]
    files = {path.name for path in output.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "source.spm", "target.spm", "vocab.json",
            "modeling_vaswani.py", "README.md"} <= files  # fmt: skip
    card = (output / "README.md").read_text()
    assert str(opus_mt.tiny) in card and "license" in card
    # A Marian folder given to translate.py is answered in one line that names the import.
    source = tmp_path / "source.en"
    source.write_text("The house is small.\nI had no appreciation of the risks involved.\n")
    refused = _run("scripts/translate.py", "--model", str(opus_mt.tiny), "--input", str(source))
    assert refused.returncode != 0 and "vaswani-mt-import" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    translated = _run("scripts/translate.py", "--model", str(output), "--input", str(source))
    assert translated.returncode == 0, translated.stderr[-2000:]
    assert len(translated.stdout.splitlines()) == 2


def test_imported_folder_loads_in_a_fresh_process_as_remote_code(imported):
    *_, folder = imported["tiny"]
    code = (
        "import sys, torch; from transformers import AutoModelForSeq2SeqLM, AutoTokenizer\n"
        "m = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
        "print(type(m).__module__.startswith('transformers_modules'), type(t).__name__,"
        " m.generate(**t(['The house is small.'], return_tensors='pt'), num_beams=1, max_new_tokens=5).tolist())"
    )
    env = {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "1", "HOME": str(folder.parent)}  # no vaswani_mt on the path
    result = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True,
                            cwd=folder.parent, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    model, tokenizer, *_ = imported["tiny"]
    with torch.no_grad():
        expected = model.generate(**tokenizer(["The house is small."], return_tensors="pt"), num_beams=1,
                                  max_new_tokens=5).tolist()  # fmt: skip
    assert result.stdout.splitlines()[-1].split(maxsplit=2) == ["True", "MarianTokenizer", str(expected)]


def test_hub_id_is_downloaded_then_imported(opus_mt, tmp_path, monkeypatch):
    import huggingface_hub

    asked = []

    def snapshot_download(repo_id, allow_patterns=None, **kwargs):
        asked.append((repo_id, allow_patterns))
        return str(opus_mt.tiny)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    import_model("Helsinki-NLP/opus-mt-en-de", tmp_path / "out")
    assert asked == [("Helsinki-NLP/opus-mt-en-de", ["*.json", "*.spm", "*.safetensors", "README.md"])]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "base_model: Helsinki-NLP/opus-mt-en-de" in card and "license: cc-by-4.0" in card
    assert "TiedemannThottingal" in card  # OPUS-MT's citation


def test_unreachable_hub_id_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelImportError, match="downloading it from the Hub failed") as refused:
        import_model("Helsinki-NLP/opus-mt-xx-yy", tmp_path / "out")
    assert "\n" not in str(refused.value) and not (tmp_path / "out").exists()


def test_not_a_marian_folder_is_refused(fitted_folder, tmp_path):
    with pytest.raises(ModelImportError, match="holds a 'vaswani_mt' model; the import takes MarianMTModel"):
        import_model(str(fitted_folder), tmp_path / "out")


def test_import_of_opus_mt_en_de_shape_takes_under_30_seconds(opus_mt, tmp_path):
    import time

    start = time.perf_counter()
    import_model(str(opus_mt.swish), tmp_path / "out")
    assert time.perf_counter() - start < 30
    assert Path(tmp_path / "out" / "model.safetensors").stat().st_size > 150e6
