import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SENTENCES, make_model, padded_batch
from transformers import MarianMTModel

from vaswani_mt.export.marian import hidden_permutation, to_marian

pytestmark = pytest.mark.transformers_internals

ROOT = Path(__file__).resolve().parents[2]


def test_permutation_puts_sines_first():
    assert hidden_permutation(6).tolist() == [0, 2, 4, 1, 3, 5]


def test_marian_conversion_gives_the_same_logits_to_float64_round_off():
    model = make_model(seed=2).double()
    marian = to_marian(model)
    assert isinstance(marian, MarianMTModel) and marian.dtype == torch.float64
    ids, mask = padded_batch(seed=5, lengths=(9, 4, 6))
    target = torch.tensor([[0, 11, 12, 13, 2], [0, 21, 2, 1, 1], [0, 5, 6, 7, 1]])
    target_mask = target.ne(1).long()
    ours = model(
        input_ids=ids, attention_mask=mask, decoder_input_ids=target, decoder_attention_mask=target_mask
    ).logits
    theirs = marian(
        input_ids=ids, attention_mask=mask, decoder_input_ids=target, decoder_attention_mask=target_mask
    ).logits
    real = target_mask.bool()
    assert (ours[real] - theirs[real]).abs().max().item() < 1e-12


def test_base_shape_converts_with_the_anchor_parameter_count():
    model = make_model(
        vocab_size=37000, d_model=512, d_ff=2048, num_heads=8, num_encoder_layers=6, num_decoder_layers=6
    )
    marian = to_marian(model)
    trainable = sum(p.numel() for p in marian.parameters() if p.requires_grad)
    assert trainable == 63_082_496  # ANCHORS.md: transformer-base as Marian


def test_marian_greedy_and_beam_tokens_equal_ours():
    model = make_model(seed=4)
    marian = to_marian(model)
    ids, mask = padded_batch(seed=6, lengths=(8, 5))
    for num_beams in (1, 4):
        kwargs = dict(input_ids=ids, attention_mask=mask, num_beams=num_beams, min_new_tokens=12, max_new_tokens=12)
        ours = model.generate(**kwargs, length_penalty=0.0)
        theirs = marian.generate(**kwargs, length_penalty=0.0)
        assert torch.equal(ours, theirs)


def test_saved_marian_folder_reloads_with_the_same_greedy_tokens(tmp_path):
    model = make_model(seed=4)
    to_marian(model).save_pretrained(tmp_path)
    reloaded = MarianMTModel.from_pretrained(tmp_path).eval()
    ids, mask = padded_batch(seed=6, lengths=(8, 5))
    kwargs = dict(input_ids=ids, attention_mask=mask, num_beams=1, max_new_tokens=10)
    assert torch.equal(model.generate(**kwargs), reloaded.generate(**kwargs))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"position_encoding": "learned"}, "sinusoidal"), ({"d_k": 4}, "d_k"), ({"d_v": 16}, "d_v")],
)
def test_unconvertible_shapes_are_refused_with_a_reason(overrides, message):
    with pytest.raises(ValueError, match=message):
        to_marian(make_model(**overrides))


def _expected_greedy(model, tokenizer, sentences, steps=16):
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        ours = model.generate(**batch, num_beams=1, max_new_tokens=steps)
    # CTranslate2 returns the target without the start token and without </s>
    trimmed = [[t for t in row[1:] if t != tokenizer.pad_token_id] for row in ours.tolist()]
    return batch, ours, [row[:-1] if row and row[-1] == tokenizer.eos_token_id else row for row in trimmed]


def test_marian_export_loads_with_the_auto_classes_and_gives_our_greedy_tokens(fitted_folder, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from vaswani_mt.export.marian import export_model
    from vaswani_mt.inference.loading import load_for_inference

    export_model(fitted_folder, "marian", tmp_path / "marian")
    marian = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "marian").eval()
    marian_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "marian")
    assert isinstance(marian, MarianMTModel)
    model, tokenizer = load_for_inference(str(fitted_folder), device="cpu")
    sentences = [english for english, _ in SENTENCES]
    assert marian_tokenizer(sentences)["input_ids"] == tokenizer(sentences)["input_ids"]
    batch, ours, _ = _expected_greedy(model, tokenizer, sentences)
    assert len(set(map(tuple, ours.tolist()))) == len(sentences)  # varied output: not a vacuous comparison
    with torch.no_grad():
        assert torch.equal(marian.generate(**batch, num_beams=1, max_new_tokens=16), ours)


def test_ctranslate2_export_searches_as_the_model_and_docs_example_gives_our_greedy_tokens(fitted_folder, tmp_path,
                                                                                          restore_threads):  # fmt: skip
    # restore_threads: a CTranslate2 translator sets the OpenMP thread count, which is torch's too
    ctranslate2 = pytest.importorskip("ctranslate2")
    from vaswani_mt.export.ctranslate2 import ctranslate2_generate, ctranslate2_search
    from vaswani_mt.export.marian import export_model
    from vaswani_mt.inference.loading import load_for_inference
    from vaswani_mt.inference.translate import translate

    output = export_model(fitted_folder, "ctranslate2", tmp_path / "ct2")
    assert {"model.bin", "config.json", "shared_vocabulary.json", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in output.iterdir()
    }
    model, tokenizer = load_for_inference(str(fitted_folder), device="cpu")
    search = ctranslate2_search(output)  # the model's own search, read from the exported folder
    saved = model.generation_config
    assert search == {"beam_size": saved.num_beams, "length_penalty": saved.length_penalty, "max_len_a": 1,
                      "max_len_b": 50}  # fmt: skip
    sentences = [english for english, _ in SENTENCES] + ["The girl reads a book in the café."]
    batch, _, expected = _expected_greedy(model, tokenizer, sentences)
    translator = ctranslate2.Translator(str(output), device="cpu", compute_type="float32", intra_threads=1)
    options = dict(beam_size=1, max_decoding_length=16)
    assert (
        ctranslate2_generate(translator, batch["input_ids"], batch["attention_mask"], tokenizer, **options) == expected
    )
    assert tokenizer.decode(expected[0]) == "Das Mädchen hat einen Apfel gegessen."
    # The per-sentence limit a·|X| + b as generate() applies it: with b = 4 every translation is cut, to 3 tokens.
    with torch.no_grad():
        cut = model.generate(**batch, num_beams=1, max_len_a=0, max_len_b=4)
    cut = [[t for t in row[1:] if t != tokenizer.pad_token_id][:-1] for row in cut.tolist()]
    limited = {**search, "max_len_a": 0, "max_len_b": 4}
    assert ctranslate2_generate(translator, batch["input_ids"], batch["attention_mask"], tokenizer, limited,
                                beam_size=1) == cut and {len(row) for row in cut} == {3}  # fmt: skip
    # docs/export.md's example, as written, on this folder: its greedy translations are ours (|X| + 50 each)
    example = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "export.md").read_text(), re.S).group(1)
    namespace: dict = {}
    exec(example.replace("outputs/ding-cpu-ct2", str(output)), namespace)
    assert namespace["greedy"] == translate(model, tokenizer, namespace["sentences"], num_beams=1)
    assert all(namespace["greedy"])

    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "export.py"), "--model", str(fitted_folder), "--format",
         "ctranslate2", "--quantization", "int8", "--output", str(tmp_path / "int8")],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    int8 = ctranslate2.Translator(str(tmp_path / "int8"), device="cpu", compute_type="int8", intra_threads=1)
    tokens = ctranslate2_generate(int8, batch["input_ids"], batch["attention_mask"], tokenizer, **options)
    assert len(tokens) == len(sentences) and all(tokens)


def test_export_refuses_other_models_and_formats(tmp_path):
    from transformers import MarianConfig

    from vaswani_mt.export.marian import export_model

    MarianConfig().save_pretrained(tmp_path / "marian")
    with pytest.raises(ValueError, match="'marian' model, not a vaswani_mt"):
        export_model(tmp_path / "marian", "marian", tmp_path / "out")
    with pytest.raises(ValueError, match="unknown export format"):
        export_model(tmp_path / "marian", "onnx", tmp_path / "out")
