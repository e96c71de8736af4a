"""One translator (issue 50): every option on one path, and the seams between options. An interrupted run leaves
every finished line in its final format (markup put back, alignments, n-best, constraints, CTranslate2), `--output`
continues where it stopped, an alignment method a model cannot give is refused in one line, an aligned translation
keeps only its own attention and pickles whole, and the options that do not go together are refused in one line."""

import ast
import io
import pickle
import signal
from pathlib import Path

import pytest
from conftest import ENGLISH, make_model, stop_at_batch

from vaswani_mt.cli import evaluate as evaluate_cli
from vaswani_mt.cli import translate as translate_cli
from vaswani_mt.inference.alignments import realign
from vaswani_mt.inference.backends import TorchBackend
from vaswani_mt.inference.ensemble import ensemble
from vaswani_mt.inference.options import TranslationOptions
from vaswani_mt.inference.streams import translate_stream
from vaswani_mt.inference.translate import format_output
from vaswani_mt.inference.translator import Translator
from vaswani_mt.system.signals import TranslationInterrupted

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
SHORT = {"max_new_tokens": 10}
MARKED = ["The <b>girl</b> ate an apple.", "How are {0} today?", "The street is <i>closed</i> because of the snow.",
          "I would like a coffee, please!", "She reads a <b>book</b> in the café.", "We are annoyed."]  # fmt: skip
TERMS = "\n".join(f"{en}\t{term}" if term else en for en, term in zip(ENGLISH, ["Apfel", "", "Schnee", "Kaffee", "Buch",
                                                                                    ""], strict=True))  # fmt: skip


CASES = {
    "markup": ({"markup": "xml"}, MARKED),
    "alignments": ({"alignments": "soft", "alignment_method": "layer1"}, ENGLISH),
    "nbest": ({"nbest": 2}, ENGLISH),
    "constraints": ({"constraints": "unordered"}, TERMS.split("\n")),
}


@pytest.mark.parametrize(("options", "lines"), CASES.values(), ids=CASES)
def test_an_interrupted_stream_writes_each_finished_line_as_the_whole_run_writes_it(fitted, monkeypatch, options,
                                                                                    lines):  # fmt: skip
    model, tokenizer = fitted
    translator = Translator(model, tokenizer, batch_size=2, generate_kwargs=SHORT, **options)
    whole = io.BytesIO()
    translate_stream(translator, io.BytesIO("\n".join(lines).encode()), whole)
    expected = [format_output(output, i) for i, output in enumerate(translator.translate_iterable(lines))]
    assert whole.getvalue().decode() == "".join(expected)
    stop_at_batch(monkeypatch, TorchBackend, batch=3)  # 2 of the 3 batches done: the longest 4 lines
    sink = io.BytesIO()
    with pytest.raises(TranslationInterrupted) as stop:
        translate_stream(translator, io.BytesIO("\n".join(lines).encode()), sink)
    written = stop.value.written
    assert sink.getvalue().decode() == "".join(expected[:written])  # the final format, markup put back
    assert stop.value.later and all(format_output(output, line - 1) == expected[line - 1]
                                    for line, output in stop.value.later.items())  # fmt: skip
    assert written + len(stop.value.later) == 4  # every finished line is kept: written, or kept for later


def test_an_interrupted_ctranslate2_stream_keeps_its_finished_lines(fitted_folder, tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2")
    from vaswani_mt.export.marian import export_model
    from vaswani_mt.inference.ctranslate2 import CTranslate2Model

    folder = export_model(fitted_folder, "ctranslate2", tmp_path / "ct2")
    translator = Translator(str(folder), batch_size=2, nbest=2, threads=1)
    expected = [format_output(output, i) for i, output in enumerate(translator.translate(ENGLISH))]
    stop_at_batch(monkeypatch, CTranslate2Model, batch=2)
    sink = io.BytesIO()
    with pytest.raises(TranslationInterrupted) as stop:
        translate_stream(translator, io.BytesIO("\n".join(ENGLISH).encode()), sink)
    assert sink.getvalue().decode() == "".join(expected[: stop.value.written])
    assert {line: format_output(output, line - 1) for line, output in stop.value.later.items()} == {
        line: expected[line - 1] for line in stop.value.later
    }
    assert stop.value.written + len(stop.value.later) == 2


def _main(module, argv):
    try:
        module.main(argv)
    except SystemExit as exit:
        return exit.code
    return None


def test_output_continues_where_an_interrupted_run_stopped_and_translates_no_finished_line_again(
    fitted_folder, tmp_path, monkeypatch, capsys
):
    source, output = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text("\n".join(ENGLISH * 2) + "\n")
    argv = ["--model", str(fitted_folder), "--input", str(source), "--batch_size", "3", "--chunk_size", "12",
            "--num_beams", "2", "--nbest", "2"]  # fmt: skip
    assert _main(translate_cli, [*argv, "--output", str(tmp_path / "whole.de")]) is None
    whole = (tmp_path / "whole.de").read_text()
    with monkeypatch.context() as patch:
        stop_at_batch(patch, TorchBackend, batch=3)  # 6 of the 12 lines done, the longest: not the first ones
        assert _main(translate_cli, [*argv, "--output", str(output)]) == 130
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("interrupted at line ") and "rerun the same command to continue" in message
    assert not output.exists() and Path(f"{output}.partial").exists() and Path(f"{output}.resume").exists()
    assert _main(translate_cli, [*argv, "--num_beams", "3", "--output", str(output)]) == (
        f"error: {output}.partial was written by a run with other options or input (--num_beams): rerun that command "
        f"to continue it, or remove {output}.partial and {output}.resume to start again"
    )
    calls = []
    search = TorchBackend.search
    monkeypatch.setattr(TorchBackend, "search", lambda self, rows, options: calls.append(len(rows.ids)) or search(
        self, rows, options))  # fmt: skip
    assert _main(translate_cli, [*argv, "--output", str(output)]) is None
    assert output.read_text() == whole  # IDs and lines as one run's
    assert sum(calls) == 6 and not Path(f"{output}.partial").exists() and not Path(f"{output}.resume").exists()


def test_an_interrupted_evaluation_leaves_the_output_it_would_replace_as_it_was(fitted_folder, tmp_path, monkeypatch,
                                                                                capsys):  # fmt: skip
    source, reference, output = tmp_path / "t.en", tmp_path / "t.de", tmp_path / "e.hyp"
    source.write_text("\n".join(ENGLISH) + "\n")
    reference.write_text("\n".join(ENGLISH) + "\n")
    output.write_text("one\ntwo\n")
    stop_at_batch(monkeypatch, TorchBackend, batch=2)
    argv = ["--model", str(fitted_folder), "--input", str(source), "--reference_file", str(reference), "--output",
            str(output), "--batch_size", "2", "--num_beams", "1"]  # fmt: skip
    assert _main(evaluate_cli, argv) == 130
    assert output.read_text() == "one\ntwo\n"  # not truncated: the lines done went beside it
    assert Path(f"{output}.partial").read_text().count("\n") == int(capsys.readouterr().err.split("line ")[1].split(
        ":")[0])  # fmt: skip


def test_alignment_methods_a_model_cannot_give_are_refused_in_one_line(fitted, fitted_folder, tokenizer):
    model, _ = fitted
    layers = model.config.num_decoder_layers
    with pytest.raises(ValueError, match=rf"^alignment method 'layer9': .+ has {layers} decoder layers "
                                         rf"\(layer0 to layer{layers - 1}\)$"):  # fmt: skip
        Translator(model, tokenizer, alignments="hard", alignment_method="layer9")
    with pytest.raises(ValueError, match="needs alignments"):
        Translator(model, tokenizer, alignment_method="layer1")
    deeper = ensemble([make_model(), make_model(num_decoder_layers=3)])
    with pytest.raises(ValueError, match="the ensemble's members have 2 and 3 decoder layers: use mean or supervised"):
        Translator(deeper, tokenizer, alignments="hard", alignment_method="layer0")
    assert Translator(deeper, tokenizer, alignments="hard").options.alignment_method is None  # the mean: taken
    code = _main(translate_cli, ["--model", str(fitted_folder), "--alignments", "hard", "--alignment_method",
                                 "supervised"])  # fmt: skip
    assert code == (f"error: alignment method 'supervised': {fitted_folder} has no supervised alignment head (train it "
                    "with --alignment_supervision)")  # fmt: skip
    code = _main(translate_cli, ["--model", str(fitted_folder), "--alignment_method", "layer1"])
    assert code.startswith("error: alignment_method='layer1' needs alignments") and "\n" not in code


def test_an_aligned_translation_keeps_only_its_own_attention_and_pickles_whole(fitted):
    model, tokenizer = fitted
    aligned = Translator(model, tokenizer, alignments="hard").translate(ENGLISH)
    for one in aligned:
        assert one.attention.untyped_storage().nbytes() == one.attention.numel() * one.attention.element_size()
        copy = pickle.loads(pickle.dumps(one))
        assert copy == one and copy.links == one.links and copy.target_ids == one.target_ids
        assert realign(copy, "layer0").links == realign(one, "layer0").links != []


BAD_OPTIONS = {
    "sampling with nbest": ({"sampling": True, "nbest": 2}, "sampling draws one translation per line: nbest must be 1"),
    "topk without sampling": ({"topk": 3}, "topk only goes with sampling"),
    "constraints with sampling": ({"constraints": "unordered", "sampling": True}, "constraints need beam search"),
    "markup with alignments": ({"markup": "xml", "alignments": "hard"}, "markup and alignments do not go together"),
    "markup with nbest": ({"markup": "xml", "nbest": 2}, "markup and n-best lists do not go together"),
    "chunk of 0": ({"chunk_size": 0}, "chunk_size must be at least 1, got 0"),
    "unknown compute type": ({"compute_type": "int4"}, "unknown compute type 'int4'"),
    "unknown order": ({"constraints": "sorted"}, "constraint order must be one of"),
}


@pytest.mark.parametrize(("fields", "message"), BAD_OPTIONS.values(), ids=BAD_OPTIONS)
def test_options_that_do_not_go_together_are_refused_in_one_line(fields, message):
    with pytest.raises(ValueError) as error:
        TranslationOptions(**fields)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_no_function_of_the_inference_layer_or_the_commands_takes_more_than_eight_parameters():
    too_many = []
    for path in [*(ROOT / "vaswani_mt/inference").glob("*.py"), *(ROOT / "vaswani_mt/cli").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "forward":
                arguments = node.args
                count = len(arguments.posonlyargs + arguments.args + arguments.kwonlyargs)
                count += bool(arguments.vararg) + bool(arguments.kwarg)
                if count > 8:
                    too_many.append(f"{path.name}:{node.lineno} {node.name} ({count})")
    assert too_many == []


def test_ctrl_c_while_a_command_starts_ends_it_in_one_line(tmp_path, live_sigint):
    import subprocess
    import sys
    import time

    process = subprocess.Popen([sys.executable, str(ROOT / "scripts/translate.py"), "--model", str(tmp_path)],
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(0.8)  # importing torch and transformers takes seconds
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and stderr.strip().splitlines() == ["interrupted while starting: nothing done"]


def test_the_ctranslate2_conversion_changes_no_registry_of_ctranslate2(fitted_folder, tmp_path, monkeypatch):
    ct2_transformers = pytest.importorskip("ctranslate2.converters.transformers")
    from vaswani_mt.export.marian import export_model

    monkeypatch.setattr(ct2_transformers, "_MODEL_LOADERS", {})  # its private registry: neither read nor written
    folder = export_model(fitted_folder, "ctranslate2", tmp_path / "ct2")
    assert ct2_transformers._MODEL_LOADERS == {} and (folder / "model.bin").is_file()
    assert Translator(str(folder), num_beams=1, threads=1).translate(ENGLISH[:2]) == Translator(
        str(fitted_folder), num_beams=1).translate(ENGLISH[:2])  # fmt: skip


def test_a_rerun_from_line_n_numbers_its_nbest_lists_and_warnings_as_the_whole_run(fitted_folder, tmp_path, capsys):
    whole, rest = tmp_path / "whole.en", tmp_path / "rest.en"
    whole.write_text("\n".join([*ENGLISH, "\x7f\x7f"]) + "\n")  # the last line: characters outside the vocabulary
    rest.write_text("\n".join([*ENGLISH[3:], "\x7f\x7f"]) + "\n")
    argv = ["--model", str(fitted_folder), "--batch_size", "1", "--num_beams", "2", "--nbest", "2"]
    assert _main(translate_cli, [*argv, "--input", str(whole)]) is None
    expected = capsys.readouterr()
    assert _main(translate_cli, [*argv, "--input", str(rest), "--first_line", "4"]) is None
    got = capsys.readouterr()
    assert got.out == "".join(expected.out.splitlines(keepends=True)[6:])  # IDs from 3, as the whole run's
    assert "line 7: " in got.err and "line 7: " in expected.err  # the warning names the line in the whole input


def test_a_backend_is_asked_with_one_typed_request_it_reads_in_its_own_terms(fitted, monkeypatch):
    from vaswani_mt.inference.backends import Search

    model, tokenizer = fitted
    asked = []
    search = TorchBackend.search
    monkeypatch.setattr(TorchBackend, "search", lambda self, batch, options: asked.append(batch.search) or search(
        self, batch, options))  # fmt: skip
    translator = Translator(model, tokenizer, num_beams=2, block=["Buch"], disable_unk=True, max_new_tokens=8)
    translator.translate(["The girl ate an apple.", "How are you?"], prefixes=["Das", ""])
    request = asked[0]
    assert isinstance(request, Search) and request.options.max_new_tokens == 8 and request.terms is None
    assert request.blocked and request.unk == tokenizer.unk_token_id
    assert request.prefixes[0] == tokenizer(text_target="Das", add_special_tokens=False)["input_ids"]
    assert request.prefixes[1] == [] and request.generate_kwargs()["target_prefix"] == request.prefixes


def test_a_search_requests_length_limit_is_generates_rule_the_one_the_controls_and_ctranslate2_read():
    """`Search.limits` (issue 61: one implementation of the per-sentence limit): tokens a translation may have,
    `</s>` counted, as `generate()` limits them; the controls' room is one less, CTranslate2's limit too."""
    from transformers import GenerationConfig

    from vaswani_mt.inference.backends import Search

    saved = GenerationConfig(max_length=20, max_len_a=1, max_len_b=50)  # the paper's |X| + 50, saved
    assert Search(TranslationOptions()).limits(saved, [3, 9]) == [53, 59]
    assert Search(TranslationOptions(max_len_a=0.5, max_len_b=4)).limits(saved, [3, 9]) == [5, 8]
    assert Search(TranslationOptions(max_new_tokens=7)).limits(saved, [3, 9]) == [7, 7]
    assert Search(TranslationOptions(generate_kwargs={"max_length": 12})).limits(saved, [3]) == [11]
    assert Search(TranslationOptions()).limits(GenerationConfig(max_length=20), [3]) == [19]  # no rule saved
