"""A saved folder is Hub-ready: it loads through the Auto classes in a fresh process without vaswani_mt, and the code
that `trust_remote_code` runs from it is the model's own files only, importing torch, transformers, a few standard
modules and each other (issue 26, item 5)."""

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SENTENCES, make_model

import vaswani_mt.model
from vaswani_mt.hub.card import REMOTE_CODE_FILES
from vaswani_mt.hub.publish import check_hub_files
from vaswani_mt.inference.loading import PICKLE_SUFFIXES

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]

PACKAGE = Path(vaswani_mt.model.__file__).parent  # the remote-code payload

# What the remote code may import besides torch, transformers and its sibling files. The issue asks for "torch,
# transformers and each other"; these standard modules are pure language helpers (no files, processes, network or
# code loading), named one by one so that a new import is a decision: `__future__` (annotations), `typing` and
# `collections.abc` (type hints), `inspect` (reading a transformers signature to support two versions), `math`
# (sqrt, isfinite), `re` (the pipeline's text clean-up), `weakref` (a cache that does not keep tensors alive) and
# `pathlib` (`save_pretrained` copies pipeline_vaswani.py into the folder it saves, which the model does not import;
# nothing reads a file when a folder is loaded).
STANDARD_MODULES = {"__future__", "collections.abc", "copy", "inspect", "math", "pathlib", "re", "typing", "weakref"}
THIRD_PARTY = {"torch", "transformers", "huggingface_hub"}  # huggingface_hub: @strict, a transformers 5 dependency
# Builtins, and functions by their attribute name (`torch.load`, `pickle.loads`, `os.system`, ...), that run or load
# code or pickles, or read files: remote code calls none of them.
FORBIDDEN_BUILTINS = {"eval", "exec", "compile", "__import__", "open"}
FORBIDDEN_ATTRIBUTES = {"import_module", "load", "loads", "system", "popen"}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import in the file, at any depth (inside functions too); level > 0 is relative."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
    return found


def _relative_closure(folder: Path, modules: set[str]) -> set[str]:
    """The files of `modules` (names in the folder) and of everything they import relatively, transitively."""
    files, todo = set(), [f"{module}.py" for module in modules]
    while todo:
        name = todo.pop()
        if name not in files:
            files.add(name)
            todo += [f"{module}.py" for level, module in _imports(folder / name) if level == 1]
    return files


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("saved")
    make_model().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_remote_code_imports_only_torch_transformers_listed_standard_modules_and_each_other(saved_folder):
    code = sorted(saved_folder.glob("*.py"))
    assert {path.name for path in code} == set(REMOTE_CODE_FILES)
    assert STANDARD_MODULES <= set(sys.stdlib_module_names) | {"collections.abc"}
    for path in code:
        for level, module in _imports(path):
            if level:  # a sibling file that travels in the same folder, never a package above it
                assert level == 1 and (saved_folder / f"{module}.py").is_file(), (path.name, level, module)
            else:
                assert module.split(".")[0] in THIRD_PARTY or module in STANDARD_MODULES, (path.name, module)
        calls = [
            node.func for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.Call)
        ]
        builtins = {call.id for call in calls if isinstance(call, ast.Name)} & FORBIDDEN_BUILTINS
        attributes = {call.attr for call in calls if isinstance(call, ast.Attribute)} & FORBIDDEN_ATTRIBUTES
        assert not builtins and not attributes, (path.name, builtins, attributes)


def test_import_reader_sees_what_the_rule_forbids(tmp_path):
    (tmp_path / "modeling_x.py").write_text(
        "import os\nfrom . import sibling\ndef f():\n    import pickle\n    from ..pkg import y\n"
    )
    assert _imports(tmp_path / "modeling_x.py") == [(0, "os"), (1, ""), (0, "pickle"), (2, "pkg")]


def test_saved_folder_carries_the_models_code_files_and_nothing_else(saved_folder):
    config = json.loads((saved_folder / "config.json").read_text())
    entry_points = {target.split(".")[0] for target in config["auto_map"].values()}
    entry_points |= {info["impl"].split(".")[0] for info in config["custom_pipelines"].values()}
    needed = _relative_closure(saved_folder, entry_points)  # what the Auto classes and the pipeline can reach
    files = {path.name for path in saved_folder.iterdir()}
    assert {name for name in files if name.endswith(".py")} == needed == set(REMOTE_CODE_FILES)
    assert not [name for name in files if name.lower().endswith(PICKLE_SUFFIXES)]
    assert all(path.is_file() for path in saved_folder.iterdir())  # no folder that could hide more
    assert check_hub_files(saved_folder) == sorted(files)  # what publishing checks before it uploads


def test_saved_folder_holds_safetensors_code_and_auto_map(model, tokenizer, tmp_path):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "configuration_vaswani.py",
        "modeling_vaswani.py",
        "fast_paths_vaswani.py",
        "generation_vaswani.py",
        "beam_search_vaswani.py",
        "pipeline_vaswani.py",
        "tokenizer.json",
    } <= files
    # The code files are the package's own, byte for byte: the search, the fast paths and the pipeline travel with
    # the model.
    for name in REMOTE_CODE_FILES:
        assert (tmp_path / name).read_bytes() == (PACKAGE / name).read_bytes(), name
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl"))]
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map == {
        "AutoConfig": "configuration_vaswani.VaswaniConfig",
        "AutoModel": "modeling_vaswani.VaswaniModel",
        "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
    }


FRESH_PROCESS = r"""
import json, os, sys
from pathlib import Path
sys.modules["vaswani_mt"] = None  # the package must not be importable: only the folder's own code may run
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer
folder, bare, sentences = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
base = AutoModel.from_pretrained(folder, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
assert model.lm_head.weight is model.model.shared.weight
modeling = sys.modules[type(model).__module__]
batch = tokenizer(sentences, return_tensors="pt", padding=True)

def saved(model, name):  # the files and the config.json's custom_pipelines of the model saved again
    model.save_pretrained(name)
    return sorted(os.listdir(name)), json.loads(Path(name, "config.json").read_text()).get("custom_pipelines")

print(json.dumps({
    "config": type(config).__name__, "base": type(base).__name__, "model": type(model).__module__,
    "fast_paths": modeling.apply_dropout.__module__,  # the speed paths come from the folder too
    "generation": modeling.VaswaniGenerationMixin.__module__,  # and the search
    "beam_search": sys.modules[modeling.VaswaniGenerationMixin.__module__].beam_search.__module__,
    "pipeline_imported": sorted(name for name in sys.modules if "pipeline_vaswani" in name),
    "pipeline_in_module_cache": Path(modeling.__file__).with_name("pipeline_vaswani.py").exists(),
    "tokens": model.generate(**batch, max_len_b=8).tolist(),
    "constrained": model.generate(**batch, max_len_b=8, constraints=[[[20, 21]], [], [[30], [40, 41]]],
                                  target_prefix=[[], [50], []]).tolist(),
    "saved_again": saved(model, "again"),
    "saved_from_bare": saved(AutoModelForSeq2SeqLM.from_pretrained(bare, trust_remote_code=True), "from_bare"),
}))
"""


def test_fresh_process_without_package_loads_and_generates_the_same_tokens(tmp_path):
    model = make_model(seed=1)
    from conftest import train_tokenizer  # the session fixture cannot be shared with a subprocess

    tokenizer = train_tokenizer([s for pair in SENTENCES for s in pair] * 4, vocab_size=200, min_frequency=1)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "fast_paths_vaswani.py").is_file()  # modeling_vaswani.py imports it
    # The same folder without the pipeline file (its config.json still names it).
    shutil.copytree(tmp_path / "model", tmp_path / "bare", ignore=shutil.ignore_patterns("pipeline_vaswani.py"))
    sentences = [english for english, _ in SENTENCES[:3]]
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(tmp_path / "model"), str(tmp_path / "bare"), json.dumps(sentences)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "HF_MODULES_CACHE": str(tmp_path / "modules"),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
        },
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["config"] == "VaswaniConfig" and out["base"] == "VaswaniModel"
    assert out["model"].startswith("transformers_modules.") and out["model"].endswith(".modeling_vaswani")
    assert out["fast_paths"] == out["model"].removesuffix("modeling_vaswani") + "fast_paths_vaswani"
    assert out["generation"] == out["model"].removesuffix("modeling_vaswani") + "generation_vaswani"
    assert out["beam_search"] == out["model"].removesuffix("modeling_vaswani") + "beam_search_vaswani"
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        assert out["tokens"] == model.generate(**batch, max_len_b=8).tolist()
        controls = {"constraints": [[[20, 21]], [], [[30], [40, 41]]], "target_prefix": [[], [50], []]}
        assert out["constrained"] == model.generate(**batch, max_len_b=8, **controls).tolist()
    # Loading the model reads no pipeline code, so transformers' module cache lacks the file; saved again, the model
    # takes it from the folder it was loaded from, and without one there it names no pipeline.
    assert out["pipeline_imported"] == [] and not out["pipeline_in_module_cache"]
    files, pipelines = out["saved_again"]
    assert {"generation_vaswani.py", "beam_search_vaswani.py", "pipeline_vaswani.py"} <= set(files)
    assert set(pipelines) == {"translation"}
    assert (tmp_path / "again" / "pipeline_vaswani.py").read_bytes() == (PACKAGE / "pipeline_vaswani.py").read_bytes()
    files, pipelines = out["saved_from_bare"]
    assert {"generation_vaswani.py", "beam_search_vaswani.py"} <= set(files) and "pipeline_vaswani.py" not in files
    assert pipelines is None


def test_save_pretrained_with_push_to_hub_uploads_the_folder_once_the_pipeline_is_in_it(model, tmp_path, monkeypatch):
    """transformers uploads inside its own `save_pretrained`, before the model copies the pipeline file: the model
    uploads the complete folder afterwards instead (with `push_to_hub`, which saves a fresh copy and sends it)."""
    uploads = []

    def push_to_hub(self, repo_id, **kwargs):
        uploads.append((repo_id, kwargs, (tmp_path / "pipeline_vaswani.py").is_file()))

    monkeypatch.setattr(type(model), "push_to_hub", push_to_hub)
    model.save_pretrained(tmp_path, push_to_hub=True, repo_id="alice/tiny", commit_message="first")
    assert uploads == [("alice/tiny", {"commit_message": "first"}, True)]


def test_the_model_code_does_not_import_the_pipeline():
    """The pipeline is not part of the model: modeling_vaswani.py and the files it imports name no pipeline module,
    neither for Python nor for transformers, which copies and loads a model file with those it imports."""
    from transformers.dynamic_module_utils import get_relative_import_files

    modeling = PACKAGE / "modeling_vaswani.py"
    closure = _relative_closure(PACKAGE, {"modeling_vaswani"})
    assert closure == {
        f"{name}_vaswani.py"
        for name in "modeling configuration generation beam_search constraints fast_paths processors".split()
    }
    assert {Path(path).name for path in get_relative_import_files(str(modeling))} == closure - {modeling.name}
    for name in closure:
        assert not [module for _, module in _imports(PACKAGE / name) if "pipeline" in module], name
