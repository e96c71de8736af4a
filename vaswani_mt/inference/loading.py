"""Loading a saved vaswani_mt model for inference: one place that checks a model folder, for every entry point.

`scripts/translate.py`, `scripts/evaluate_model.py`, `scripts/export.py`, `scripts/push_to_hub.py`,
`scripts/visualize_attention.py` and the demo all load through `load_for_inference`, so a folder that cannot be
served gets the same `ModelFolderError`: one line that names the folder (as the user gave it), the file and the
problem, before any weights are read. What it checks, in order:

- the path: no such folder, a file instead of a folder, a Hub id that does not download;
- `config.json`: missing, empty, not UTF-8, not JSON, not a JSON object, another model type (our Marian and
  CTranslate2 exports named as such, with how to run them; translate and evaluate take a CTranslate2 export,
  `is_ctranslate2_folder`, checked by `check_ctranslate2_folder`), or a value that
  `VaswaniConfig` refuses (a size that is not a positive integer, a rate outside [0, 1), ...);
- the weights: safetensors only (a pickle file can run code when it is loaded, so a folder with only
  `pytorch_model.bin` is refused), complete (a truncated file is caught by its header), and holding exactly the
  tensors, of exactly the shapes, that the config builds. transformers 5 raises on a shape mismatch only after a
  multi-line report, and on a missing or unexpected tensor it merely warns and initialises the missing one at
  random: a `config.json` edited after saving (more layers, learned positions, attention biases) would load and
  translate garbage;
- `generation_config.json`: if present, a JSON object whose search settings have the right types (transformers
  silently drops a broken one, and with it the paper's beam search);
- the tokenizer: `tokenizer.json`, or an imported checkpoint's `MarianTokenizer` files (`source.spm`, `target.spm`,
  `vocab.json`), present and loadable, with no more tokens than the model's vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError

from vaswani_mt.model.configuration_vaswani import VaswaniConfig
from vaswani_mt.system.messages import error_line

# What a model folder may hold as weights, and the suffixes of pickle files, refused here and by hub.check_hub_files.
_SAFETENSORS, _SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
# Files fetched from a Hub repository: configs, tokenizer files (SentencePiece models too) and safetensors weights,
# never code or pickles.
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.spm"]
# The tokenizer files a folder holds: ours (`tokenizers`' one file) or an imported OPUS-MT checkpoint's MarianTokenizer.
TOKENIZER_FILES = (("tokenizer.json",), ("source.spm", "target.spm", "vocab.json"))


def tokenizer_files(folder: Path) -> tuple[str, ...] | None:
    """The tokenizer files `folder` has (one set of `TOKENIZER_FILES`), or None."""
    return next((names for names in TOKENIZER_FILES if all((folder / name).is_file() for name in names)), None)


class ModelFolderError(ValueError):
    """A folder (or Hub id) that is not a loadable vaswani_mt model; the message names it and the problem in one
    line. A `ValueError`, so that callers that report bad arguments report this one too."""


def local_folder(model: str, patterns: list[str] = _HUB_PATTERNS) -> Path:
    """`model` as a folder on this machine: the folder itself, or the Hub repository's files that match `patterns`
    (ours: configs, tokenizer files, safetensors) in the local cache. ModelFolderError, one line, otherwise."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelFolderError(f"{model} is a file, not a model folder")
    if path.is_absolute() or model.startswith((".", "~")) or len(path.parts) != 2 or path.parent.is_dir():
        raise ModelFolderError(f"{model}: no such folder (and not a Hub id of the form USER/NAME)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, allow_patterns=patterns))
    except Exception as error:  # offline, no such repository, refused: huggingface_hub's and the HTTP client's types
        raise ModelFolderError(
            f"{model} is not a folder here, and downloading it from the Hub failed ({error_line(error)})"
        ) from error


def _read_json_object(model: str, folder: Path, name: str) -> dict:
    path = folder / name
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ModelFolderError(f"{model} is not a model folder: it has no {name}") from None
    except OSError as error:
        raise ModelFolderError(f"{model}: cannot read {name} ({error.strerror or error})") from error
    except UnicodeDecodeError as error:
        raise ModelFolderError(f"{model}: {name} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not text.strip():
        raise ModelFolderError(f"{model}: {name} is empty")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelFolderError(f"{model}: {name} is not valid JSON ({error.msg} at line {error.lineno} column "
                               f"{error.colno})") from None  # fmt: skip
    if not isinstance(value, dict):
        raise ModelFolderError(f"{model}: {name} holds a JSON {type(value).__name__}, not an object")
    return value


def _read_config(model: str, folder: Path) -> VaswaniConfig:
    values = _read_json_object(model, folder, "config.json")
    model_type = values.get("model_type")
    if model_type == "marian":  # an OPUS-MT checkpoint, or what `vaswani-mt-export --format marian` writes
        raise ModelFolderError(
            f"{model} holds a 'marian' model, not a vaswani_mt one: import the MarianMTModel exactly with "
            f"vaswani-mt-import --model {model} --output OUT (scripts/import_model.py) and use OUT, or run it in "
            "transformers alone (MarianMTModel.from_pretrained(folder))"
        )
    if not model_type and (folder / "model.bin").is_file():  # `--format ctranslate2`: CTranslate2's own config.json
        raise ModelFolderError(
            f"{model} holds a CTranslate2 export (model.bin), not a vaswani_mt model: vaswani-mt-translate and "
            "vaswani-mt-evaluate take it as --model, Python as vaswani_mt.export.ctranslate2.CTranslate2Model(folder) "
            "(docs/export.md); here, use the vaswani_mt folder it came from"
        )
    if model_type != VaswaniConfig.model_type:
        what = f"a {model_type!r} model" if model_type else "a config.json without model_type"
        raise ModelFolderError(f"{model} holds {what}, not a vaswani_mt one")
    try:
        return VaswaniConfig.from_pretrained(folder)
    except StrictDataclassError as error:  # @strict's cause names the field and the value
        raise ModelFolderError(f"{model}: config.json: {' '.join(str(error.__cause__).split())}") from error
    except (ValueError, TypeError) as error:
        raise ModelFolderError(f"{model}: config.json: {error_line(error)}") from error


def _saved_shapes(model: str, folder: Path) -> dict[str, tuple[int, ...]]:
    """The name and shape of every tensor in the folder's safetensors file(s), read from their headers."""
    from safetensors import SafetensorError, safe_open

    if (folder / _SAFETENSORS).is_file():
        files = [_SAFETENSORS]
    elif (folder / _SAFETENSORS_INDEX).is_file():
        weight_map = _read_json_object(model, folder, _SAFETENSORS_INDEX).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFolderError(f"{model}: {_SAFETENSORS_INDEX} has no weight_map")
        files = sorted(set(map(str, weight_map.values())))
    else:
        pickles = sorted(p.name for p in folder.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
        if pickles:
            raise ModelFolderError(
                f"{model} has no {_SAFETENSORS}, only {', '.join(pickles)}: vaswani_mt loads weights from safetensors "
                "only (loading a pickle can run code)"
            )
        raise ModelFolderError(f"{model} has no weights: no {_SAFETENSORS} (or {_SAFETENSORS_INDEX})")
    shapes = {}
    for name in files:
        try:
            with safe_open(folder / name, framework="pt") as weights:
                for key in weights.keys():  # safe_open is not a mapping: no `in weights`
                    shapes[key] = tuple(weights.get_slice(key).get_shape())
        except (SafetensorError, OSError) as error:
            raise ModelFolderError(
                f"{model}: {name} is not a complete safetensors file ({error_line(error)})"
            ) from None
    return shapes


def _check_weights_match_config(model: str, folder: Path, config: VaswaniConfig) -> None:
    from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration

    saved = _saved_shapes(model, folder)
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        skeleton = VaswaniForConditionalGeneration(config)
    expected = {key: tuple(tensor.shape) for key, tensor in skeleton.state_dict().items()}
    tied = set(skeleton.all_tied_weights_keys)  # saved once, under the name they are tied to
    missing = [key for key in expected if key not in saved and key not in tied]
    unexpected = [key for key in saved if key not in expected]
    mismatched = [key for key in expected if key in saved and saved[key] != expected[key]]
    problems = []
    if mismatched:
        key = mismatched[0]
        more = f" ({len(mismatched) - 1} more tensors differ in shape)" if len(mismatched) > 1 else ""
        problems.append(f"{key} is {list(saved[key])} in the weights but {list(expected[key])} by config.json{more}")
    if missing:
        problems.append(f"{len(missing)} tensors the config needs are not in the weights (first: {missing[0]})")
    if unexpected:
        problems.append(f"{len(unexpected)} tensors in the weights are not in the model (first: {unexpected[0]})")
    if problems:
        raise ModelFolderError(
            f"{model}: config.json does not match the weights: {'; '.join(problems)}; was config.json edited after "
            "the model was saved?"
        )


def _check_generation_config(model: str, folder: Path) -> None:
    if not (folder / "generation_config.json").is_file():
        return  # the model's own defaults (the paper's search) apply
    values = _read_json_object(model, folder, "generation_config.json")
    checks = {
        "num_beams": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
        "length_penalty": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "max_len_a": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
        "max_len_b": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "max_length": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
    }
    for key, valid in checks.items():
        if values.get(key) is not None and not valid(values[key]):
            raise ModelFolderError(f"{model}: generation_config.json has an impossible {key}: {values[key]!r}")


def _load_tokenizer(model: str, folder: Path, config: VaswaniConfig):
    from transformers import AutoTokenizer

    if tokenizer_files(folder) is None:
        raise ModelFolderError(f"{model} has no tokenizer.json: save the tokenizer next to the model")
    for name in ("tokenizer.json", "vocab.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (folder / name).is_file():
            _read_json_object(model, folder, name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as error:  # the tokenizers library raises KeyError, TypeError, its own Exception, ...
        raise ModelFolderError(f"{model}: the tokenizer does not load ({error_line(error)})") from error
    if len(tokenizer) > config.vocab_size:
        raise ModelFolderError(
            f"{model}: the tokenizer has {len(tokenizer)} tokens but config.json's vocab_size is {config.vocab_size}"
        )
    return tokenizer


def is_ctranslate2_folder(model: str | Path) -> bool:
    """Whether `model` is a folder here holding a CTranslate2 export (`vaswani-mt-export --format ctranslate2`):
    `model.bin` beside CTranslate2's own config.json (no model_type). The commands that translate take one."""
    folder = Path(str(model)).expanduser()
    if not (folder / "model.bin").is_file():
        return False
    try:
        values = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not one that serves: `check_model_folder` names the problem
        return False
    return isinstance(values, dict) and not values.get("model_type")


def check_ctranslate2_folder(model: str) -> Path:
    """Checks a CTranslate2 export (`is_ctranslate2_folder`) as `check_model_folder` checks ours, before it loads: its
    tokenizer.json (and tokenizer_config.json), and generation_config.json, the search, if present. Returns the
    folder, or raises `ModelFolderError`."""
    folder = Path(str(model)).expanduser()
    if tokenizer_files(folder) is None:
        raise ModelFolderError(f"{model} has no tokenizer.json: export the model again with vaswani-mt-export, "
                               "which copies it")  # fmt: skip
    for name in ("tokenizer.json", "vocab.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            _read_json_object(model, folder, name)
    _check_generation_config(model, folder)
    return folder


# The files of a folder (ours or a CTranslate2 export) that make its translations, beside its *.safetensors.
_TRANSLATING_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    _SAFETENSORS_INDEX,
    "model.bin",
    *(name for files in TOKENIZER_FILES for name in files),
}


def model_files(model: str | Path) -> list[Path]:
    """The files of a model folder (or Hub id) that its translations depend on: weights, configs, tokenizer and
    vocabularies; what a resumable run's key hashes (cli/translate.py)."""
    folder = local_folder(str(model))
    return sorted(path for path in folder.iterdir() if path.is_file() and (
        path.name in _TRANSLATING_FILES or path.suffix == ".safetensors" or "vocabulary" in path.name))  # fmt: skip


def check_model_folder(model: str) -> tuple[Path, VaswaniConfig]:
    """Checks that `model` (a folder or Hub id) holds a loadable vaswani_mt model without loading its weights;
    returns the folder on this machine and its config, or raises `ModelFolderError`. `load_for_inference` runs it
    (and then also loads the tokenizer, which it checks too)."""
    folder = local_folder(str(model))
    config = _read_config(str(model), folder)
    _check_weights_match_config(str(model), folder, config)
    _check_generation_config(str(model), folder)
    return folder, config


def load_for_inference(model: str, device: str | None = None, attn_implementation: str | None = None,
                       compute_type: str = "float32"):  # fmt: skip
    """A saved vaswani_mt model (folder or Hub id) and its tokenizer, in eval mode on `device` (default: GPU if
    there is one). Anything else raises `ModelFolderError`, one line that says what is wrong with the folder.
    `attn_implementation="eager"` is what `output_attentions` needs. `compute_type` (`inference.compute_types`:
    float32, bfloat16, int8, auto) is applied once the weights are loaded, the folder unchanged; one this device
    cannot run well raises `ValueError`, one line, before anything is read."""
    from vaswani_mt.inference.compute_types import apply_compute_type, resolve_compute_type
    from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    compute_type = resolve_compute_type(compute_type, device)
    model = str(model)
    folder, config = check_model_folder(model)
    tokenizer = _load_tokenizer(model, folder, config)
    options = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        loaded = VaswaniForConditionalGeneration.from_pretrained(folder, config=config, use_safetensors=True, **options)
    except (OSError, ValueError, RuntimeError) as error:  # what the checks above cannot foresee
        raise ModelFolderError(f"{model}: the weights do not load ({error_line(error)})") from error
    return apply_compute_type(loaded.to(device).eval(), compute_type), tokenizer


__all__ = [
    "PICKLE_SUFFIXES",
    "TOKENIZER_FILES",
    "ModelFolderError",
    "check_ctranslate2_folder",
    "check_model_folder",
    "is_ctranslate2_folder",
    "load_for_inference",
    "local_folder",
    "model_files",
    "tokenizer_files",
]
