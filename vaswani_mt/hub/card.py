"""The model card: the Jinja template `model_card.md` rendered with a run's values and huggingface_hub's
`ModelCardData` (`render_model_card`) into the model folder's README.md; checked (`check_card`) and retargeted to a
Hub repository (`card_for_hub`) when published.
"""

from __future__ import annotations

import json
import re
from importlib import resources

import jinja2
import jinja2.meta
import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.repocard import REGEX_YAML_BLOCK

from vaswani_mt.model import REMOTE_CODE_FILES
from vaswani_mt.model.generation_vaswani import PAPER_SEARCH

NATIVE_FORMATS = ("vaswani", "marian")
# The code a `native="vaswani"` folder carries, all of it run by `trust_remote_code`, is the payload's own list,
# `REMOTE_CODE_FILES`; a Marian folder carries no code.

TAGS = ["translation", "transformer", "vaswani_mt", "attention-is-all-you-need"]
# The tag of an imported checkpoint's card (hub/importing.py), whose training data and results are its source's.
IMPORTED_TAG = "vaswani-mt-import"
NOT_EVALUATED = "not evaluated"


def model_card_template() -> str:
    return resources.files("vaswani_mt.hub").joinpath("model_card.md").read_text(encoding="utf-8")


# The transformers versions the remote code runs under, printed on the card: pyproject.toml's requirement
# (tests/hub/test_hub.py checks that they agree).
TRANSFORMERS_REQUIREMENT = "transformers>=5.20,<6"


def usage_section(repo_id: str, example: str, native: str = "vaswani") -> str:
    """The card's "How to use": the translation pipeline and the Auto classes (remote code), or for the Marian
    conversion, `MarianMTModel` without remote code."""
    text = json.dumps(example, ensure_ascii=False)  # a Python string literal, whatever quotes the sentence holds
    if native == "marian":
        return f"""A native `MarianMTModel`: no remote code, any transformers version with Marian.

```python
from transformers import AutoTokenizer, MarianMTModel

model = MarianMTModel.from_pretrained("{repo_id}")
tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
batch = tokenizer([{text}], return_tensors="pt")
print(tokenizer.batch_decode(model.generate(**batch, num_beams=4), skip_special_tokens=True))
```

Greedy search gives the original model's tokens. Beam search here uses transformers' length penalty `|Y|^α` and
a fixed `max_length` of 512, not the paper's GNMT penalty and input length + 50, so beam outputs can differ."""
    return f"""The architecture is this repository's own code, so loading needs `trust_remote_code=True` and
`pip install "{TRANSFORMERS_REQUIREMENT}"` (what vaswani_mt itself requires). transformers 5 has no `translation`
pipeline task of its own; this repository brings one (`pipeline_vaswani.py`, named in `config.json`), which answers
in the translation widget's format.

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

translator = pipeline("translation", model="{repo_id}", trust_remote_code=True)
print(translator([{text}], batch_size=8, num_beams=4))  # [{{"translation_text": ...}}]

model = AutoModelForSeq2SeqLM.from_pretrained("{repo_id}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{repo_id}", trust_remote_code=True)
batch = tokenizer([{text}], return_tensors="pt")
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

`generate()` defaults to the search saved in `generation_config.json`, given under Results (the paper's, §6.1, is
beam 4, GNMT length penalty α = 0.6, maximum output length = input length + 50). The pipeline cuts a source longer
than `max_position_embeddings` (1024 tokens) with a warning, translates an empty line to "", and names characters
outside the vocabulary (they become `<unk>`)."""


def search_summary(generation_config) -> str:
    """The card's words for the beam search a model's generation config runs, and whether it is the paper's."""
    values = {key: getattr(generation_config, key, None) for key in PAPER_SEARCH}
    a = values["max_len_a"]
    length = f"{'' if a == 1 else f'{a} x '}input + {values['max_len_b']}"
    text = f"beam {values['num_beams']}, GNMT length penalty α = {values['length_penalty']}, maximum length = {length}"
    if values == PAPER_SEARCH:
        return f"{text} (§6.1)"
    return f"{text} (the paper's, §6.1: beam 4, α = 0.6, input + 50)"


# The model-index names of the test scores, in the order of the card's Results table: sacreBLEU, chrF, then the
# paper's scoring (evaluation.compound_split_bleu).
SACREBLEU_METRIC_NAME = "sacreBLEU (test)"
CHRF_METRIC_NAME = "chrF (test)"
COMPOUND_SPLIT_METRIC_NAME = "tokenized BLEU, compound-split (tensor2tensor)"
# What `card_metadata` reads besides the scores (a template reads what it names).
METADATA_VALUES = ("source_lang", "target_lang", "license", "dataset_id", "dataset_name", "model_name", "examples")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _score(test: dict, key: str) -> float | str:
    # float(): a numpy score would reach the YAML as a python/object tag that safe_load refuses.
    return float(round(test[key], 2)) if _is_number(test.get(key)) else NOT_EVALUATED


def card_values(
    model,
    tokenizer,
    *,
    source_lang: str,
    target_lang: str,
    corpus: dict,
    examples: list[str],
    training: dict,
    test: dict,
    command: str = "",
) -> dict:
    """The values `model_card.md` is rendered with (`render_model_card`), for a trained model.

    `corpus`: `describe_corpus`'s licence, name and notes; `examples`: test sources for the widget and "How to use";
    `training`: the run's preset, pairs, schedule, steps, minutes, hardware, precision and `best` (under early
    stopping); `test`: its test scores, empty if none (a score not measured is left out of the model-index).
    """
    config = model.config
    src, tgt = source_lang, target_lang
    examples = examples or ["Hello."]
    averaged = getattr(model, "averaged_from", [])
    return {
        "source_lang": src,
        "target_lang": tgt,
        "license": corpus["license"],
        "dataset_id": corpus["dataset_id"],
        "dataset_name": corpus["dataset_name"],
        "dataset_note": corpus["dataset_note"],
        "examples": list(examples),
        "model_name": f"vaswani-mt-{training['preset']}-{src}-{tgt}",
        "architecture": f"N = {config.num_encoder_layers}+{config.num_decoder_layers} layers, "
        f"d_model = {config.d_model}, d_ff = {config.d_ff}, h = {config.num_heads}, d_k = d_v = {config.d_k}",
        "vocab_size": len(tokenizer),
        "parameters": f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M",
        "preset": training["preset"],
        "initialisation": f"every weight from N(0, {config.init_std}) (as MarianMTModel; the paper names none)"
        if config.init_std
        else "Xavier-uniform linear layers, N(0, d_model^-0.5) embeddings (tensor2tensor's)",
        "train_pairs": training["train_pairs"],
        "lr_scale": training["lr_scale"],
        "warmup": training["warmup"],
        "label_smoothing": config.label_smoothing,
        "dropout": config.dropout,
        "max_tokens": training["max_tokens"],
        "steps": training["steps"],
        "train_minutes": training["train_minutes"],
        "hardware": training["hardware"],
        "precision": training["precision"],
        "weights_note": _weights_note(averaged, training.get("best")),
        "test_pairs": training["test_pairs"],
        "bleu": _score(test, "score"),
        "chrf": _score(test, "chrf"),
        "signature": test.get("signature", NOT_EVALUATED),
        "compound_split_bleu": _score(test, "compound_split_bleu"),
        "compound_split_signature": test.get("compound_split_signature", NOT_EVALUATED),
        "search": search_summary(model.generation_config),
        "command": command or "scripts/train.py",
        "limitations": corpus["limitations"],
        "repo_id": f"USER/vaswani-mt-{training['preset']}-{src}-{tgt}",  # the model_name
    }


def _weights_note(averaged: list[str], best: dict | None) -> str:
    """Which weights the folder holds: the final ones, one checkpoint, or the mean of several (§6.1), and, when a
    dev metric chose where the run ends (early stopping), which checkpoint was best."""
    if not averaged:
        note = "the final weights"
    elif len(averaged) == 1:
        note = f"the weights of {averaged[0]}"
    else:
        note = f"the average of {len(averaged)} checkpoints ({', '.join(averaged)})"
    if best and best.get("checkpoint"):
        note += f", ending at the best on dev {best['metric']} ({best['checkpoint']}, {best['value']:.2f})"
    return note


def eval_results(values: dict) -> list[EvalResult]:
    """The card's model-index entries: one per measured test score, on the test split of the training corpus. A score
    not measured is left out (the Hub wants a number for every metric value, not null)."""
    scores = (
        ("bleu", values.get("bleu"), SACREBLEU_METRIC_NAME),
        ("chrf", values.get("chrf"), CHRF_METRIC_NAME),
        ("bleu", values.get("compound_split_bleu"), COMPOUND_SPLIT_METRIC_NAME),
    )
    return [
        EvalResult(
            task_type="translation",
            task_name=f"Translation {values['source_lang']}-{values['target_lang']}",
            dataset_type=values["dataset_id"],
            dataset_name=values["dataset_name"],
            dataset_split="test",
            metric_type=metric,
            metric_value=value,
            metric_name=name,
        )
        for metric, value, name in scores
        if _is_number(value)
    ]


def card_metadata(values: dict) -> ModelCardData:
    """The card's YAML front matter: every field the Hub reads for a translation model (`check_card`)."""
    results = eval_results(values)
    return ModelCardData(
        language=[values["source_lang"], values["target_lang"]],
        license=values["license"],
        library_name="transformers",
        pipeline_tag="translation",
        tags=list(TAGS),
        datasets=[values["dataset_id"]],
        metrics=["bleu", "chrf"],
        # Without results, a model_name would be written as a key of its own, not as the model-index name.
        model_name=values["model_name"] if results else None,
        eval_results=results or None,
        widget=[{"text": text} for text in values["examples"]],
    )


def render_model_card(values: dict, template: str | None = None) -> str:
    """The model card for `values` (`card_values`): the Jinja `template` (default: `model_card.md`) filled, with
    `card_metadata` as YAML at `{{ card_data }}`; `usage` defaults to `usage_section`. A value the template or the
    metadata needs and `values` lacks is an error, not a blank."""
    template = model_card_template() if template is None else template
    values = dict(values)
    if "usage" not in values and "repo_id" in values and values.get("examples"):
        values["usage"] = usage_section(values["repo_id"], values["examples"][0])
    # from_template renders a name it is not given as a blank: list the names it would miss first.
    named = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template)) - {"card_data"}
    missing = sorted((named | set(METADATA_VALUES)) - set(values))
    if missing:
        raise ValueError(f"model card values missing: {', '.join(missing)}")
    card = ModelCard.from_template(card_metadata(values), template_str=template, **values)
    return f"{card}\n"  # jinja drops the template's final newline


def split_card(card: str) -> tuple[dict, str]:
    """The YAML front matter (parsed) and the markdown body of a model card, split where the Hub splits it
    (huggingface_hub's copy of the Hub server's pattern)."""
    match = REGEX_YAML_BLOCK.search(card)
    if not match:
        raise ValueError("the model card has no YAML front matter (--- ... ---) at its top")
    metadata = yaml.safe_load(match.group(2))
    if not isinstance(metadata, dict):
        raise ValueError("the model card's front matter is not a YAML mapping")
    return metadata, card[match.end() :]


def check_card(card: str) -> dict:
    """Parses the card's front matter and checks every field the Hub reads for a translation model: raises
    ValueError naming what is missing; returns the metadata. An imported checkpoint's card (`IMPORTED_TAG`) needs no
    datasets, metrics or model-index of its own: they are its source's, which it names."""
    metadata, _ = split_card(card)
    problems = []
    if metadata.get("pipeline_tag") != "translation":
        problems.append("pipeline_tag: translation")
    if metadata.get("library_name") != "transformers":
        problems.append("library_name: transformers")
    languages = metadata.get("language")
    if not (isinstance(languages, list) and len(languages) == 2 and all(languages)):
        problems.append("language: [source, target]")
    if not metadata.get("license"):
        problems.append("license")
    widget = metadata.get("widget") or []
    if not (widget and all(isinstance(w, dict) and str(w.get("text", "")).strip() for w in widget)):
        problems.append("widget: examples with text")
    if IMPORTED_TAG in (metadata.get("tags") or []):  # an imported checkpoint: its data and results are its source's
        if problems:
            raise ValueError("the model card lacks: " + "; ".join(problems))
        return metadata
    if not metadata.get("datasets"):
        problems.append("datasets")
    if "bleu" not in (metadata.get("metrics") or []):
        problems.append("metrics: [bleu]")
    try:
        result = metadata["model-index"][0]["results"][0]
        bleu = next(m for m in result["metrics"] if m["type"] == "bleu").get("value")
        if result["task"]["type"] != "translation" or not result["dataset"]["type"]:
            raise KeyError("task or dataset")
        if not _is_number(bleu):
            raise KeyError(f"bleu value {bleu!r} is not a measured number")
        for metric in result["metrics"]:  # the Hub wants a number for each
            if not _is_number(value := metric.get("value")):
                raise KeyError(f"{metric.get('name') or metric['type']} value {value!r} is not a measured number")
    except (KeyError, IndexError, TypeError, StopIteration) as error:
        problems.append(f"model-index (translation task, dataset, sacreBLEU value): {error}")
    if problems:
        raise ValueError("the model card lacks: " + "; ".join(problems))
    return metadata


_MARIAN_NOTE = (
    "> **This repository holds the exact `transformers.MarianMTModel` conversion of a vaswani_mt model** "
    "(published with `scripts/push_to_hub.py --native marian`), so that hosted inference, which does not run "
    "remote code, can serve it. The weights are the original's with the hidden dimension permuted into "
    "Marian's [sin | cos] layout of the positional encoding and zero attention biases: the logits agree to "
    "float round-off (Marian's config cannot store the original LayerNorm eps of 1e-6 and uses 1e-5, a change "
    "of about 1e-6 relative). The results below were measured with the original model and its search."
)


def card_for_hub(card: str, repo_id: str, native: str = "vaswani") -> str:
    """A rendered model card retargeted to a Hub repository: its title and model-index name, its "How to use"
    (remote code and the pipeline, or MarianMTModel), and for the Marian conversion a note that says what it is."""
    if native not in NATIVE_FORMATS:
        raise ValueError(f"native must be one of {NATIVE_FORMATS}, got {native!r}")
    split_card(card)  # a card without front matter is an error here; ModelCard would only warn
    hub_card = ModelCard(card)
    data, name = hub_card.data, repo_id.split("/")[-1]
    if data.eval_results:
        data.model_name = name
    example = next((w["text"] for w in data.get("widget", []) if isinstance(w, dict) and "text" in w), "Hello.")
    if native == "marian":
        data.tags = [*(data.tags or []), "marian"]
    # The body is the markdown model_card.md wrote: its first heading is the title, "## How to use" a section.
    body = re.sub(r"^# .*$", f"# {name}", hub_card.text, count=1, flags=re.M)
    if native == "marian":
        body = re.sub(r"^(# .*\n)", lambda m: f"{m.group(1)}\n{_MARIAN_NOTE}\n", body, count=1, flags=re.M)
    usage = usage_section(repo_id, example, native)
    section = re.compile(r"^## How to use\n.*?(?=^## |\Z)", re.S | re.M)
    if section.search(body):
        body = section.sub(lambda m: f"## How to use\n\n{usage}\n\n", body, count=1)
    else:
        body = body.rstrip("\n") + f"\n\n## How to use\n\n{usage}\n"
    hub_card.text = body
    return str(hub_card)


__all__ = [
    "CHRF_METRIC_NAME",
    "COMPOUND_SPLIT_METRIC_NAME",
    "NOT_EVALUATED",
    "REMOTE_CODE_FILES",
    "SACREBLEU_METRIC_NAME",
    "TRANSFORMERS_REQUIREMENT",
    "card_for_hub",
    "card_metadata",
    "card_values",
    "check_card",
    "eval_results",
    "model_card_template",
    "render_model_card",
    "search_summary",
    "split_card",
    "usage_section",
]
