"""A folder that is not a servable vaswani_mt model gets one clear line from every entry point (issue 26, item 4).

Each bad folder (missing, empty, garbage or impossible config.json, a config edited after saving, another model type,
pickle-only or truncated weights, a Hub id that cannot be fetched) is given to every entry point: translate,
evaluate, export, publish, attention plots and the demo. Each must end with exactly one line, `error: ...`, that
names the folder and what is wrong, exit non-zero, print no traceback and write nothing. The whole matrix runs
in-process (the scripts' `__main__`, as `python script.py` runs it); a sample runs as real subprocesses, and the full
matrix of subprocesses is marked slow.
"""

import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SENTENCES, make_model

from vaswani_mt.inference.loading import ModelFolderError, load_for_inference

ROOT = Path(__file__).resolve().parents[2]

# Bad folder -> what its message must say, besides the folder's name.
BAD_FOLDERS = {
    "missing": "no such folder",
    "empty": "it has no config.json",
    "garbage_config": "config.json is not valid JSON",
    "impossible_config": "config.json: dropout must be a number in [0, 1), got 1.5",
    "config_disagrees_with_weights": "config.json does not match the weights",
    "marian": "holds a 'marian' model, not a vaswani_mt one",
    "bart": "holds a 'bart' model, not a vaswani_mt one",
    "pickle_only": "has no model.safetensors, only pytorch_model.bin",
    "truncated_weights": "model.safetensors is not a complete safetensors file",
    "unreachable_hub_id": "is not a folder here, and downloading it from the Hub failed",
}
HUB_ID = "nobody-here/no-such-vaswani-model"  # HF_HUB_OFFLINE=1 in these tests: never fetched


def _edit_config(folder: Path, **changes) -> None:
    values = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**values, **changes}))


def _tiny_seq2seq(kind: str):
    """A tiny model of another architecture, as transformers saves it."""
    from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel

    sizes = dict(vocab_size=200, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                 max_position_embeddings=64)  # fmt: skip
    if kind == "marian":
        return MarianMTModel(MarianConfig(**sizes, decoder_start_token_id=0, pad_token_id=1))
    return BartForConditionalGeneration(BartConfig(**sizes))


@pytest.fixture(scope="module")
def bad(tmp_path_factory, tokenizer):
    """The bad folders (name -> path or Hub id), built once from one saved tiny model, and the files to translate."""
    root = tmp_path_factory.mktemp("bad-models")
    good = root / "good"
    model = make_model()
    model.save_pretrained(good)
    tokenizer.save_pretrained(good)

    def variant(name: str) -> Path:
        return Path(shutil.copytree(good, root / name))

    folders = {"missing": root / "missing", "unreachable_hub_id": HUB_ID, "empty": root / "empty"}
    folders["empty"].mkdir()
    folders["garbage_config"] = variant("garbage_config")
    (folders["garbage_config"] / "config.json").write_text("{'d_model': 32,")
    folders["impossible_config"] = variant("impossible_config")
    _edit_config(folders["impossible_config"], dropout=1.5)
    folders["config_disagrees_with_weights"] = variant("config_disagrees")
    _edit_config(folders["config_disagrees_with_weights"], d_ff=128)
    for kind in ("marian", "bart"):
        folders[kind] = root / kind
        _tiny_seq2seq(kind).save_pretrained(folders[kind])
        tokenizer.save_pretrained(folders[kind])
    folders["pickle_only"] = variant("pickle_only")
    (folders["pickle_only"] / "model.safetensors").unlink()
    torch.save(model.state_dict(), folders["pickle_only"] / "pytorch_model.bin")
    folders["truncated_weights"] = variant("truncated_weights")
    weights = folders["truncated_weights"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert set(folders) == set(BAD_FOLDERS)
    (root / "source.en").write_text("\n".join(en for en, _ in SENTENCES[:2]) + "\n")
    (root / "reference.de").write_text("\n".join(de for _, de in SENTENCES[:2]) + "\n")
    return {"root": root, "good": good, **{name: str(path) for name, path in folders.items()}}


def entry_point_command(entry: str, model: str, root: Path, output: Path) -> list[str]:
    """The command line of `entry` on `model`; anything it would write goes under `output`."""
    scripts = ROOT / "scripts"
    return {
        "translate": [scripts / "translate.py", "--model", model, "--input", root / "source.en"],
        "evaluate": [scripts / "evaluate_model.py", "--model", model, "--source_file", root / "source.en",
                     "--reference_file", root / "reference.de", "--output", output / "hypotheses.de"],
        "export": [scripts / "export.py", "--model", model, "--format", "marian", "--output", output / "marian"],
        "publish": [scripts / "push_to_hub.py", "--model", model, "--repo_id", "alice/tiny", "--output",
                    output / "hub", "--dry_run"],
        "attention_plots": [scripts / "visualize_attention.py", "--model", model, "--text", "Hello.",
                            "--output_dir", output / "attention"],
        "demo": [ROOT / "app.py", model, "--port", "9"],  # the model is checked before the server starts
    }[entry]  # fmt: skip


ENTRY_POINTS = ["translate", "evaluate", "export", "publish", "attention_plots", "demo"]


def assert_one_clear_line(message: str, model: str, expected: str) -> None:
    assert message.startswith("error: ") and "\n" not in message.strip(), message
    assert model in message and expected in message, message


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)


@pytest.mark.parametrize("folder", list(BAD_FOLDERS))
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_refuses_every_bad_folder_in_one_line(entry, folder, bad, tmp_path, monkeypatch, capfd,
                                                                 offline):  # fmt: skip
    command = [str(part) for part in entry_point_command(entry, bad[folder], bad["root"], tmp_path)]
    monkeypatch.setattr(sys, "argv", command)
    if entry == "demo":  # a folder that loaded would start a server here: fail instead of serving
        monkeypatch.setattr("gradio.Blocks.launch", lambda *args, **kwargs: pytest.fail("the demo started"))
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(command[0], run_name="__main__")  # what `python script.py ...` runs
    # `sys.exit("error: ...")`: the interpreter prints the string to stderr and exits with status 1.
    assert isinstance(exit_.value.code, str), exit_.value.code
    assert_one_clear_line(exit_.value.code, bad[folder], BAD_FOLDERS[folder])
    out, err = capfd.readouterr()
    assert "Traceback" not in err and not out
    assert not any(tmp_path.iterdir())  # nothing written: the folder is checked before any output exists


@pytest.mark.parametrize("folder", list(BAD_FOLDERS))
def test_load_for_inference_names_the_folder_and_the_problem(folder, bad, offline):
    with pytest.raises(ModelFolderError) as error:
        load_for_inference(bad[folder], device="cpu")
    assert_one_clear_line(f"error: {error.value}", bad[folder], BAD_FOLDERS[folder])


def test_the_good_folder_the_bad_ones_come_from_loads(bad):
    model, tokenizer = load_for_inference(str(bad["good"]), device="cpu")
    assert model.config.d_ff == 64 and len(tokenizer) <= model.config.vocab_size


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        ("config.json", b"", "config.json is empty"),
        ("config.json", b"\xff\xfe{}", "config.json is not UTF-8 text"),
        ("config.json", b"[1, 2]", "config.json holds a JSON list, not an object"),
        ("config.json", b'{"d_model": 32}', "holds a config.json without model_type, not a vaswani_mt one"),
        ("config.json", b'{"model_type": "vaswani_mt", "d_model": "32"}', "d_model must be a positive integer"),
        ("generation_config.json", b'{"num_beams": "4"}', "generation_config.json has an impossible num_beams: '4'"),
        ("tokenizer.json", None, "has no tokenizer.json"),
        ("tokenizer.json", b'{"model": 1}', "the tokenizer does not load"),
    ],
)
def test_each_broken_file_of_a_folder_gets_its_own_message(bad, tmp_path, file, content, message):
    folder = Path(shutil.copytree(bad["good"], tmp_path / "model"))
    if content is None:
        (folder / file).unlink()
    else:
        (folder / file).write_bytes(content)
    with pytest.raises(ModelFolderError) as error:
        load_for_inference(str(folder), device="cpu")
    assert_one_clear_line(f"error: {error.value}", str(folder), message)


def test_a_missing_tensor_or_an_unexpected_one_is_named(bad, tmp_path):
    deeper = Path(shutil.copytree(bad["good"], tmp_path / "deeper"))
    _edit_config(deeper, num_encoder_layers=3)
    with pytest.raises(ModelFolderError, match=r"tensors the config needs are not in the weights \(first: model\.enc"):
        load_for_inference(str(deeper), device="cpu")
    shallower = Path(shutil.copytree(bad["good"], tmp_path / "shallower"))
    _edit_config(shallower, num_decoder_layers=1)
    with pytest.raises(ModelFolderError, match=r"tensors in the weights are not in the model \(first: model\.dec"):
        load_for_inference(str(shallower), device="cpu")


def run_script(command: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, *map(str, command)], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env, stdin=subprocess.DEVNULL)  # fmt: skip


def assert_refused_in_one_line(result: subprocess.CompletedProcess, model: str, expected: str) -> None:
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not result.stdout, result.stderr[-2000:]
    assert_one_clear_line(result.stderr.strip().splitlines()[-1], model, expected)


# Two real processes in the default run (each pays ~10 s of imports on one core): the rest of the matrix runs
# in-process above, and all of it as processes under -m slow.
@pytest.mark.parametrize(("entry", "folder"), [("translate", "config_disagrees_with_weights"), ("publish", "marian")])
def test_scripts_refuse_a_bad_folder_as_real_processes(entry, folder, bad, tmp_path):
    result = run_script(entry_point_command(entry, bad[folder], bad["root"], tmp_path), cwd=tmp_path)
    assert_refused_in_one_line(result, bad[folder], BAD_FOLDERS[folder])
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("folder", list(BAD_FOLDERS))
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_refuses_every_bad_folder_as_a_real_process(entry, folder, bad, tmp_path):
    result = run_script(entry_point_command(entry, bad[folder], bad["root"], tmp_path / "out"), cwd=tmp_path)
    assert_refused_in_one_line(result, bad[folder], BAD_FOLDERS[folder])
    assert not (tmp_path / "out").exists()
