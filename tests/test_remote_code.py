"""A saved folder is Hub-ready: it loads through the Auto classes in a fresh process without vaswani_mt."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from conftest import SENTENCES, make_model

import vaswani_mt

PACKAGE = Path(vaswani_mt.__file__).parent


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
        "pipeline_vaswani.py",
        "tokenizer.json",
    } <= files
    # The code files are the package's own, byte for byte: the fast paths and the pipeline travel with the model.
    for name in ("configuration_vaswani.py", "modeling_vaswani.py", "fast_paths_vaswani.py", "pipeline_vaswani.py"):
        assert (tmp_path / name).read_bytes() == (PACKAGE / name).read_bytes(), name
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl"))]
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map == {
        "AutoConfig": "configuration_vaswani.VaswaniConfig",
        "AutoModel": "modeling_vaswani.VaswaniModel",
        "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
    }


FRESH_PROCESS = r"""
import json, sys
sys.modules["vaswani_mt"] = None  # the package must not be importable: only the folder's own code may run
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer
folder, sentences = sys.argv[1], json.loads(sys.argv[2])
config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
base = AutoModel.from_pretrained(folder, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
assert model.lm_head.weight is model.model.shared.weight
modeling = sys.modules[type(model).__module__]
fast_paths = modeling.apply_dropout.__module__  # the speed paths come from the folder too
batch = tokenizer(sentences, return_tensors="pt", padding=True)
print(json.dumps({
    "config": type(config).__name__, "base": type(base).__name__, "model": type(model).__module__,
    "fast_paths": fast_paths,
    "tokens": model.generate(**batch, max_len_b=8).tolist(),
}))
"""


def test_fresh_process_without_package_loads_and_generates_the_same_tokens(tmp_path):
    model = make_model(seed=1)
    from conftest import train_tokenizer  # the session fixture cannot be shared with a subprocess

    tokenizer = train_tokenizer([s for pair in SENTENCES for s in pair] * 4, vocab_size=200, min_frequency=1)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "fast_paths_vaswani.py").is_file()  # modeling_vaswani.py imports it
    sentences = [english for english, _ in SENTENCES[:3]]
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(tmp_path / "model"), json.dumps(sentences)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"},
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["config"] == "VaswaniConfig" and out["base"] == "VaswaniModel"
    assert out["model"].startswith("transformers_modules.") and out["model"].endswith(".modeling_vaswani")
    assert out["fast_paths"] == out["model"].removesuffix("modeling_vaswani") + "fast_paths_vaswani"
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        assert out["tokens"] == model.generate(**batch, max_len_b=8).tolist()
