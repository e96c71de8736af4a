"""Loading a saved model for inference (`vaswani_mt.inference.loading`): a folder that is not a servable vaswani_mt
model is refused by `load_for_inference` with one line naming the folder and what is wrong, file by file, before any
weight is loaded. The same folders at every command: test_bad_models.py (both build them with tests/conftest.py's
`bad`)."""

import shutil
from pathlib import Path

import pytest
from conftest import BAD_FOLDERS, assert_one_clear_line, edit_config

from vaswani_mt.inference.loading import ModelFolderError, load_for_inference


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
        ("config.json", b'{"model_type": "vaswani_mt", "d_model": "32"}', "Field 'd_model' expected int, got str"),
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
    edit_config(deeper, num_encoder_layers=3)
    with pytest.raises(ModelFolderError, match=r"tensors the config needs are not in the weights \(first: model\.enc"):
        load_for_inference(str(deeper), device="cpu")
    shallower = Path(shutil.copytree(bad["good"], tmp_path / "shallower"))
    edit_config(shallower, num_decoder_layers=1)
    with pytest.raises(ModelFolderError, match=r"tensors in the weights are not in the model \(first: model\.dec"):
        load_for_inference(str(shallower), device="cpu")


def test_loading_something_else_says_what_it_is(tmp_path):
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_for_inference(str(tmp_path))
    from transformers import MarianConfig

    MarianConfig().save_pretrained(tmp_path / "marian")
    with pytest.raises(ValueError, match="'marian' model, not a vaswani_mt"):
        load_for_inference(str(tmp_path / "marian"))


def test_no_circle_of_imports_in_the_inference_layer_deferred_or_not():
    """Every import counts, at the top or inside a function: a deferred import is still a circle (issue 61)."""
    import ast

    folder = Path(__file__).resolve().parents[2] / "vaswani_mt" / "inference"
    imports = {}
    for path in folder.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vaswani_mt.inference."):
                names.add(node.module.rsplit(".", 1)[1])
            elif isinstance(node, ast.Import):
                names |= {a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith("vaswani_mt.inference.")}
        imports[path.stem] = names - {path.stem}

    def circle(start: str, path: list[str]) -> list[str] | None:
        for name in sorted(imports.get(path[-1], ())):
            if name == start:
                return [*path, name]
            if name not in path:
                found = circle(start, [*path, name])
                if found:
                    return found
        return None

    circles = [" -> ".join(found) for module in sorted(imports) if (found := circle(module, [module]))]
    assert circles == []


def test_loading_a_folder_imports_neither_the_translator_nor_the_pipeline(fitted_folder):
    import subprocess
    import sys

    code = ("import sys\nfrom vaswani_mt.inference.loading import load_for_inference\n"
            f"load_for_inference({str(fitted_folder)!r}, device='cpu')\n"
            "print(sorted(m for m in sys.modules if m.startswith('vaswani_mt.inference.')))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = done.stdout.strip()
    assert "pipeline" not in loaded and "translator" not in loaded, loaded
