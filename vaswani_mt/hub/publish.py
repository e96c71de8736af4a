"""Publishing on the Hugging Face Hub: the exact folder the Hub gets, checked before any upload.

`build_hub_folder` writes what a Hub repository receives; `check_hub_folder` proves it loads, in a fresh process
without vaswani_mt, to the tokens the model gives here; `upload_folder` sends it, reporting failures plainly and
keeping the folder on disk.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from vaswani_mt.inference.loading import PICKLE_SUFFIXES
from vaswani_mt.system.folders import check_replaceable, written_whole

from .card import NATIVE_FORMATS, REMOTE_CODE_FILES, card_for_hub, check_card


def build_hub_folder(
    model: str | os.PathLike, output: str | os.PathLike, repo_id: str, native: str = "vaswani", overwrite: bool = False
):
    """Writes the exact folder a Hub repository receives for the vaswani_mt model in `model` (a folder written by
    training, with its README.md card) and returns `(output, model, tokenizer)` (the loaded model, for checks).

    `native="vaswani"`: safetensors, config.json with `auto_map` and `custom_pipelines`, the remote code files,
    tokenizer, generation config, README.md; `native="marian"`: the exact `MarianMTModel` conversion, which loads
    without remote code, with its own card. A non-empty `output` is an error unless `overwrite`, which replaces it
    whole (`system.written_whole`).
    """
    from vaswani_mt.export.marian import save_marian
    from vaswani_mt.inference.loading import load_for_inference

    if native not in NATIVE_FORMATS:
        raise ValueError(f"--native must be one of {NATIVE_FORMATS}, got {native!r}")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id):
        raise ValueError(f"--repo_id must look like USER/NAME, got {repo_id!r}")
    output = Path(output)
    check_replaceable(output, overwrite, reads=[model])  # before the model loads: a refusal costs nothing
    loaded, tokenizer = load_for_inference(str(model), device="cpu")
    card_path = Path(model, "README.md")
    if not card_path.is_file():
        raise ValueError(
            f"{model} has no model card (README.md): scripts/train.py writes one with the measured test BLEU; for a "
            "model trained elsewhere, render model_card.md with vaswani_mt.hub.card.render_model_card"
        )
    card = card_for_hub(card_path.read_text(encoding="utf-8"), repo_id, native)
    check_card(card)
    with written_whole(output) as staging:
        if native == "marian":
            save_marian(loaded, tokenizer, staging)
        else:
            loaded.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
        (staging / "README.md").write_text(card, encoding="utf-8")
    return output, loaded, tokenizer


# Runs in a fresh interpreter in which `import vaswani_mt` fails: only the folder's own code may run.
_FRESH_PROCESS_CHECK = r"""
import json, sys
sys.modules["vaswani_mt"] = None
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
folder, native, sentences, new_tokens = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
batch = tokenizer(sentences, return_tensors="pt", padding=True)
tokens = model.generate(**batch, num_beams=1, max_new_tokens=new_tokens).tolist()
result = {"model_type": config.model_type, "class": type(model).__name__, "module": type(model).__module__,
          "tokens": tokens}
if native == "vaswani":
    translator = pipeline("translation", model=folder, trust_remote_code=True)
    result["pipeline"] = translator(sentences, num_beams=1, max_new_tokens=new_tokens)
print(json.dumps(result))
"""


def check_hub_files(folder: str | os.PathLike, native: str = "vaswani") -> list[str]:
    """Raises RuntimeError if `folder` (or a folder inside it) holds a pickle (`.bin`, `.pt`, ...: loading one can run
    code) or code other than the model's own `REMOTE_CODE_FILES` (none for `native="marian"`), or lacks one of them.
    Returns the folder's files, relative to it."""
    folder = Path(folder)
    files = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    pickles = [name for name in files if name.lower().endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise RuntimeError(f"{folder} holds {', '.join(pickles)}: a Hub folder holds weights as safetensors only")
    code = {name for name in files if name.endswith(".py")}
    expected = set(REMOTE_CODE_FILES) if native == "vaswani" else set()
    if code - expected:
        raise RuntimeError(f"{folder} holds code that is not the model's: {', '.join(sorted(code - expected))}")
    if expected - code:
        raise RuntimeError(f"{folder} lacks the model's code files {', '.join(sorted(expected - code))}")
    return files


def check_hub_folder(folder: str | os.PathLike, model, tokenizer, native: str = "vaswani", new_tokens: int = 16):
    """Validates a folder from `build_hub_folder`: its files (`check_hub_files`), its card (`check_card`), and, in a
    fresh offline process without vaswani_mt, the Auto classes and pipeline giving the greedy tokens `model` gives
    here for the card's widget examples. Returns the report."""
    import torch

    folder = Path(folder)
    check_hub_files(folder, native)
    metadata = check_card((folder / "README.md").read_text(encoding="utf-8"))
    sentences = [w["text"] for w in metadata["widget"]]
    with tempfile.TemporaryDirectory(prefix="vaswani-hub-check-") as scratch:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        env.update({"HF_MODULES_CACHE": str(Path(scratch, "modules")), "HF_HUB_OFFLINE": "1"})
        env.update({"TOKENIZERS_PARALLELISM": "false"})
        process = subprocess.run(
            [sys.executable, "-c", _FRESH_PROCESS_CHECK, str(folder.resolve()), native, json.dumps(sentences),
             str(new_tokens)],
            capture_output=True, text=True, cwd=scratch, env=env, stdin=subprocess.DEVNULL, timeout=600,
        )  # fmt: skip
    if process.returncode != 0:
        raise RuntimeError(f"{folder} does not load in a fresh process without vaswani_mt:\n{process.stderr[-3000:]}")
    report = json.loads(process.stdout.strip().splitlines()[-1])
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = model.generate(**batch, num_beams=1, max_new_tokens=new_tokens).tolist()
    if report["tokens"] != expected:
        raise RuntimeError(f"{folder} loads in a fresh process but gives other greedy tokens than the model here")
    if native == "vaswani":
        texts = tokenizer.batch_decode(expected, skip_special_tokens=True)
        if [r["translation_text"] for r in report["pipeline"]] != [t.strip() for t in texts]:
            raise RuntimeError(f"the translation pipeline of {folder} translates otherwise than the model")
    report.update(files=sorted(p.name for p in folder.iterdir()), sentences=sentences)
    return report


class HubUploadError(RuntimeError):
    """An upload that did not happen, with the reason in plain words; the folder is still on disk."""


def upload_folder(
    folder: str | os.PathLike,
    repo_id: str,
    token: str | None = None,
    private: bool = False,
    message: str = "",
    endpoint: str | None = None,
) -> str:
    """Creates `repo_id` (if needed) and uploads `folder` to it with `huggingface_hub`; returns the commit URL.
    `endpoint`: another Hub than huggingface.co (default: HF_ENDPOINT or huggingface.co)."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    kept = (f"The folder {folder} is kept; once the problem is fixed, upload it with `hf upload {repo_id} {folder}`, "
            "or run the same command with --overwrite (it builds the folder again)")  # fmt: skip
    token = token or get_token()
    if not token:
        raise HubUploadError(
            f"no Hugging Face token: run `hf auth login` or set HF_TOKEN (a token with write access). {kept}"
        )
    api = HfApi(token=token, endpoint=endpoint)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder), repo_id=repo_id, commit_message=message or "Upload vaswani_mt model"
        )
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", None)
        reason = {401: "the token was refused", 403: f"the token may not write to {repo_id}"}.get(status, str(error))
        raise HubUploadError(f"upload to {repo_id} failed: {reason}. {kept}") from error
    except Exception as error:  # network errors come from the HTTP client (httpx, requests) as their own types
        names = " ".join(cls.__name__ for cls in type(error).__mro__)
        if isinstance(error, OSError) or re.search(r"Connect|Timeout|Network|Offline|Transport", names):
            reason = f"cannot reach the Hugging Face Hub ({type(error).__name__}: {error})"
            raise HubUploadError(f"{reason}. {kept}") from error
        raise HubUploadError(f"upload to {repo_id} failed: {type(error).__name__}: {error}. {kept}") from error
    return str(getattr(commit, "commit_url", commit))


def publish(
    model: str | os.PathLike,
    repo_id: str,
    output: str | os.PathLike | None = None,
    native: str = "vaswani",
    dry_run: bool = False,
    token: str | None = None,
    private: bool = False,
    overwrite: bool = False,
    log=print,
) -> dict:
    """`scripts/push_to_hub.py`: builds the Hub folder, validates it in a fresh process and, unless `dry_run`,
    uploads it. Returns the folder, the check's report and the commit URL (None on a dry run)."""
    suffix = "-hub" if native == "vaswani" else "-hub-marian"
    output = Path(output) if output else Path(str(model).rstrip("/\\") + suffix)
    folder, loaded, tokenizer = build_hub_folder(model, output, repo_id, native, overwrite)
    log(f"built {folder}: {', '.join(sorted(p.name for p in folder.iterdir()))}")
    report = check_hub_folder(folder, loaded, tokenizer, native)
    log(f"checked: loads as {report['class']} in a fresh process without vaswani_mt; same greedy tokens")
    if dry_run:
        log(f"dry run: not uploaded. The folder to upload is {folder}")
        return {"folder": str(folder), "report": report, "url": None}
    url = upload_folder(folder, repo_id, token=token, private=private)
    log(f"uploaded to {url}")
    return {"folder": str(folder), "report": report, "url": url}


__all__ = ["HubUploadError", "build_hub_folder", "check_hub_files", "check_hub_folder", "publish", "upload_folder"]
