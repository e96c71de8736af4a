"""Compute types at load time (`vaswani_mt.inference.compute_types`, `load_for_inference(folder, compute_type=...)`):
float32 is the saved model bit for bit; bfloat16 and int8 give logits close to float32's and a search that still scores
in float32; int8 quantizes every linear layer, the tied pre-softmax projection included, and leaves the shared
embedding the float matrix it was; a compute type converts a copy and patches no instance; a type the machine cannot run
well is refused in one line, by the library and by the commands, before a model loads."""

import pytest
import torch
from conftest import SENTENCES, make_model
from torch import nn

from vaswani_mt.cli import evaluate, translate
from vaswani_mt.inference import compute_types
from vaswani_mt.inference.compute_types import AUTO_COMPUTE_TYPES, Int8Linear, apply_compute_type, compute_type_of
from vaswani_mt.inference.ensemble import load_ensemble
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.pipeline import translation_pipeline
from vaswani_mt.inference.translate import translate as translate_lines
from vaswani_mt.inference.translator import Translator

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]

NOT_NATIVE = "bfloat16 is not native on this CPU (no AVX512-BF16/AMX): it would be about 2x slower than float32; use "


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer):
    """A tiny random model, saved with its tokenizer."""
    path = tmp_path_factory.mktemp("compute-types")
    make_model().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def bf16_native(monkeypatch):
    """bf16 counted as native here, so its numbers are checked on any CPU (emulated bf16 is slow, not wrong)."""
    monkeypatch.setattr(compute_types, "native_bf16", lambda: True)


def _batch(tokenizer):
    source = tokenizer([en for en, _ in SENTENCES], padding=True, return_tensors="pt")
    target = tokenizer(text_target=[de for _, de in SENTENCES], padding=True, return_tensors="pt")["input_ids"]
    return {**source, "decoder_input_ids": target[:, :-1]}


def _logits(model, tokenizer) -> torch.Tensor:
    with torch.no_grad():
        return model(**_batch(tokenizer)).logits


def test_float32_is_the_model_as_saved_bit_for_bit(folder, tokenizer):
    today, _ = load_for_inference(str(folder), device="cpu")
    explicit, _ = load_for_inference(str(folder), device="cpu", compute_type="float32")
    assert torch.equal(_logits(today, tokenizer), _logits(explicit, tokenizer))
    assert all(type(m) is not Int8Linear for m in explicit.modules()) and explicit.dtype == torch.float32
    assert "save_pretrained" not in vars(explicit) and compute_type_of(explicit) == "float32"


@pytest.mark.usefixtures("bf16_native")
def test_bfloat16_logits_are_close_to_float32_and_the_search_scores_in_float32(folder, tokenizer):
    reference, _ = load_for_inference(str(folder), device="cpu")
    model, _ = load_for_inference(str(folder), device="cpu", compute_type="bfloat16")
    assert model.lm_head.weight.dtype == torch.bfloat16
    logits, expected = _logits(model, tokenizer).float(), _logits(reference, tokenizer)
    assert (logits - expected).abs().max() < 0.05 * expected.abs().max()
    inputs = tokenizer([SENTENCES[0][0]], return_tensors="pt")
    for beams in (4, 1):  # our beam search, transformers' greedy search
        out = model.generate(**inputs, num_beams=beams, max_new_tokens=4, output_scores=True,
                             return_dict_in_generate=True)  # fmt: skip
        assert all(scores.dtype == torch.float32 for scores in out.scores)


def test_int8_quantizes_every_linear_layer_and_keeps_the_embedding_float(tokenizer):
    model = make_model()
    linears = {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared  # tied (§3.4)
    expected = _logits(model, tokenizer)
    apply_compute_type(model, "int8")
    assert {name for name, module in model.named_modules() if type(module) is Int8Linear} == linears
    assert "lm_head" in linears and not any(isinstance(module, nn.Linear) for module in model.modules())
    # The embeddings read the same float matrix as before; lm_head multiplies with its own int8 copy.
    assert model.model.shared.weight is shared and shared.dtype == torch.float32
    assert model.model.encoder.embed_tokens.weight is shared and model.model.decoder.embed_tokens.weight is shared
    assert model.lm_head.weight().dtype == torch.qint8 and "weight" not in vars(model.lm_head)  # torch's own method
    logits = _logits(model, tokenizer)
    assert (logits - expected).abs().max() < 0.1 * expected.abs().max()


@pytest.mark.usefixtures("bf16_native")
@pytest.mark.parametrize("compute_type", ["bfloat16", "int8"])
def test_a_compute_type_converts_a_copy_and_patches_no_instance(folder, tokenizer, compute_type):
    model, _ = load_for_inference(str(folder), device="cpu")
    before = _logits(model, tokenizer)
    translator = Translator(model, tokenizer, compute_type=compute_type, num_beams=1, max_new_tokens=5)
    converted = translator.backend.model
    assert converted is not model and compute_type_of(converted) == compute_type
    assert compute_type_of(model) == "float32" and torch.equal(_logits(model, tokenizer), before)  # untouched
    loaded, _ = load_for_inference(str(folder), device="cpu", compute_type=compute_type)
    for instance in (converted, loaded):  # nothing of the instance replaced: no save_pretrained, no attribute
        assert not {"save_pretrained", "compute_type"} & set(vars(instance))
    assert Translator(loaded, tokenizer, num_beams=1, max_new_tokens=5).backend.model is loaded  # already converted
    sources = [en for en, _ in SENTENCES[:3]]
    assert translator.translate(sources) == Translator(loaded, tokenizer, num_beams=1, max_new_tokens=5).translate(
        sources
    )


def test_bfloat16_is_refused_in_one_line_where_it_is_not_native(folder, monkeypatch):
    monkeypatch.setattr(compute_types, "native_bf16", lambda: False)
    monkeypatch.setattr(compute_types.torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as error:
        load_for_inference(str(folder), device="cpu", compute_type="bfloat16")
    assert str(error.value) == NOT_NATIVE + "float32 or int8"
    model, _ = load_for_inference(str(folder), device="cpu", compute_type="auto")
    assert AUTO_COMPUTE_TYPES["AVX2 CPU"] == "float32" and compute_type_of(model) == "float32"


def test_unknown_types_and_int8_off_the_cpu_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^unknown compute type 'int4': use float32, bfloat16, int8, auto$"):
        compute_types.resolve_compute_type("int4", "cpu")
    with pytest.raises(ValueError, match=r"^int8 runs on the CPU only .*, not cuda: use float32 or bfloat16"):
        compute_types.resolve_compute_type("int8", "cuda")


def test_ensembles_and_the_pipeline_take_the_compute_type(folder, tokenizer):
    ensemble, _ = load_ensemble([str(folder), str(folder)], device="cpu", compute_type="int8")
    assert all(type(member.lm_head) is Int8Linear for member in ensemble.members)
    single, _ = load_for_inference(str(folder), device="cpu", compute_type="int8")
    inputs = tokenizer([SENTENCES[1][0]], return_tensors="pt")
    assert torch.equal(ensemble.generate(**inputs, max_new_tokens=5), single.generate(**inputs, max_new_tokens=5))
    translator = translation_pipeline(str(folder), compute_type="int8", device="cpu")
    assert type(translator.model.lm_head) is Int8Linear
    assert isinstance(translator(SENTENCES[1][0], max_new_tokens=5)[0]["translation_text"], str)


def _exit_message(main, argv):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code


@pytest.mark.parametrize("command", [translate, evaluate])
def test_the_commands_refuse_a_bad_compute_type_in_one_line_before_loading(command, folder, monkeypatch, tmp_path):
    monkeypatch.setattr("vaswani_mt.inference.ensemble.load_ensemble", lambda *_, **__: pytest.fail("it loaded"))
    (tmp_path / "a.en").write_text("Hello.\n")
    files = ["--input", str(tmp_path / "a.en")] + (["--reference_file", str(tmp_path / "a.en")] * (command is evaluate))
    message = _exit_message(command.main, ["--model", str(folder), *files, "--compute_type", "fp8"])
    assert message == "error: --compute_type: unknown compute type 'fp8': use float32, bfloat16, int8, auto"
    monkeypatch.setattr(compute_types, "native_bf16", lambda: False)
    monkeypatch.setattr(compute_types.torch.cuda, "is_available", lambda: False)
    message = _exit_message(command.main, ["--model", str(folder), *files, "--compute_type", "bfloat16"])
    assert message == f"error: --compute_type: {NOT_NATIVE}float32 or int8"


def test_translate_runs_with_the_compute_type_it_is_given(folder, tmp_path, capsysbinary, monkeypatch):
    monkeypatch.setattr(compute_types.torch.cuda, "is_available", lambda: False)
    (tmp_path / "a.en").write_text("".join(f"{en}\n" for en, _ in SENTENCES[:2]))
    translate.main(["--model", str(folder), "--input", str(tmp_path / "a.en"), "--compute_type", "int8",
                    "--num_beams", "1"])  # fmt: skip
    lines = capsysbinary.readouterr().out.decode().splitlines()
    model, tokenizer = load_for_inference(str(folder), device="cpu", compute_type="int8")
    assert lines == translate_lines(model, tokenizer, [en for en, _ in SENTENCES[:2]], num_beams=1)
