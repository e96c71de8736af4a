"""Hub publishing: the card's YAML holds every field the Hub reads and any text round-trips through it, the dry-run
folder loads in a fresh process without vaswani_mt, the Marian variant says what it is, and upload failures say why
and keep the folder."""

import ast
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ENGLISH, card_values, make_model
from huggingface_hub import ModelCard

from vaswani_mt.data.corpus import describe_corpus
from vaswani_mt.hub import card as hub_card
from vaswani_mt.hub.card import (
    CHRF_METRIC_NAME,
    COMPOUND_SPLIT_METRIC_NAME,
    REMOTE_CODE_FILES,
    SACREBLEU_METRIC_NAME,
    TRANSFORMERS_REQUIREMENT,
    card_for_hub,
    check_card,
    render_model_card,
    search_summary,
    split_card,
)
from vaswani_mt.hub.publish import HubUploadError, build_hub_folder, check_hub_files, check_hub_folder, upload_folder

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]

ROOT = Path(__file__).resolve().parents[2]
SCORE = {
    "score": 12.3456,
    "chrf": 40.0,
    "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
    "compound_split_bleu": 13.5678,
    "compound_split_signature": "moses:de|escape:yes|compound:##AT##|sacremoses:0.2.0|nrefs:1|case:mixed|eff:no|"
    "tok:none|smooth:none|version:2.6.0",
}
EXAMPLES = ['She said "hello".', "How are you today?"]


def _front_matter(card: str) -> tuple[dict, str]:
    """The card's YAML (parsed by PyYAML alone) and its body: the card opens with `---` and the YAML ends at the next
    line that is `---`, as the Hub reads it."""
    assert card.startswith("---\n")
    front, body = card[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


def test_rendered_card_yaml_parses_and_holds_every_field(model, tokenizer):
    card = render_model_card(card_values(model, tokenizer, SCORE, EXAMPLES))
    metadata, body = _front_matter(card)
    assert metadata == check_card(card)
    assert metadata["pipeline_tag"] == "translation" and metadata["library_name"] == "transformers"
    assert metadata["language"] == ["en", "de"] and metadata["license"] == "apache-2.0"
    assert metadata["datasets"] == ["tests/six-sentences"] and metadata["metrics"] == ["bleu", "chrf"]
    assert metadata["tags"] == ["translation", "transformer", "vaswani_mt", "attention-is-all-you-need"]
    assert metadata["widget"] == [{"text": text} for text in EXAMPLES]  # quotes survive the YAML
    [index] = metadata["model-index"]
    [result] = index["results"]
    assert index["name"] == "vaswani-mt-tiny-en-de"
    assert result["task"] == {"type": "translation", "name": "Translation en-de"}
    assert result["dataset"] == {"name": "six test sentences", "type": "tests/six-sentences", "split": "test"}
    assert result["metrics"] == [
        {"type": "bleu", "value": 12.35, "name": SACREBLEU_METRIC_NAME},
        {"type": "chrf", "value": 40.0, "name": CHRF_METRIC_NAME},
        {"type": "bleu", "value": 13.57, "name": COMPOUND_SPLIT_METRIC_NAME},
    ]
    assert card.endswith("```\n") and body == split_card(card)[1]
    for section in ("## Model", "## Training", "## Results", "## Limitations", "## How to use", "## Citation"):
        assert section in body
    assert "pytest tests/" in body and "@inproceedings{vaswani2017attention" in body
    assert 'pipeline("translation", model="USER/vaswani-mt-tiny-en-de", trust_remote_code=True)' in body


def test_card_gives_the_papers_compound_split_bleu_beside_sacrebleu_each_with_its_signature(model, tokenizer):
    body = split_card(render_model_card(card_values(model, tokenizer, SCORE, EXAMPLES)))[1]
    assert "| split | sacreBLEU | chrF | tokenized BLEU, compound-split (the paper's scoring) |" in body
    assert "| test (6 pairs) | 12.35 | 40.0 | 13.57 |" in body
    assert f"sacreBLEU signature: `{SCORE['signature']}`" in body
    assert f"Signature: `{SCORE['compound_split_signature']}`" in body and "tokenizer.perl -l de" in body
    # Not measured: the table says so, and model-index lists sacreBLEU alone (the Hub wants numbers there).
    unmeasured = {key: value for key, value in SCORE.items() if not key.startswith("compound_split")}
    card = render_model_card(card_values(model, tokenizer, unmeasured, EXAMPLES))
    assert "| 12.35 | 40.0 | n/a |" in card
    metrics = check_card(card)["model-index"][0]["results"][0]["metrics"]
    assert [m["name"] for m in metrics] == [SACREBLEU_METRIC_NAME, CHRF_METRIC_NAME]
    # A card that gives a metric without a number (a hand edit, an older card) is refused before publishing.
    for position, name in ((0, "bleu"), (2, COMPOUND_SPLIT_METRIC_NAME)):
        metadata, body = split_card(render_model_card(card_values(model, tokenizer, SCORE, EXAMPLES)))
        metadata["model-index"][0]["results"][0]["metrics"][position]["value"] = None
        with pytest.raises(ValueError, match=re.escape(f"{name} value None is not a measured number")):
            check_card("---\n" + yaml.safe_dump(metadata) + "---\n" + body)


def test_a_card_without_test_scores_says_so_and_has_no_model_index(model, tokenizer):
    training = {"preset": "tiny", "train_pairs": 6, "test_pairs": 6, "lr_scale": 1.0, "warmup": 4, "max_tokens": 256,
                "steps": 40, "train_minutes": 0.01, "hardware": "CPU", "precision": "float32"}  # fmt: skip
    values = hub_card.card_values(model, tokenizer, source_lang="en", target_lang="de", corpus=describe_corpus("x"),
                                  examples=EXAMPLES, training=training, test={})  # fmt: skip
    card = render_model_card(values)
    metadata, body = _front_matter(card)
    # The Hub wants a number for every model-index value: nothing measured, no model-index (nor a stray model_name).
    assert "model-index" not in metadata and "model_name" not in metadata
    assert metadata["widget"] == [{"text": text} for text in EXAMPLES] and metadata["datasets"] == ["x"]
    assert "| test (6 pairs) | not evaluated | not evaluated | not evaluated |" in body
    with pytest.raises(ValueError, match="model-index"):
        check_card(card)
    # A value the body or the metadata needs is an error, not a blank.
    with pytest.raises(ValueError, match=r"model card values missing: dataset_note, license$"):
        render_model_card({k: v for k, v in values.items() if k not in ("dataset_note", "license")})


def test_the_card_training_writes_parses_and_its_model_index_is_the_results_table(fitted_folder):
    card = (fitted_folder / "README.md").read_text(encoding="utf-8")
    metadata, body = _front_matter(card)
    assert metadata["license"] == "apache-2.0" and metadata["datasets"] == ["tests/six-sentences"]
    assert metadata["language"] == ["en", "de"] and metadata["pipeline_tag"] == "translation"
    assert [w["text"] for w in metadata["widget"]] == ENGLISH[:2]
    [result] = metadata["model-index"][0]["results"]
    assert result["dataset"] == {"name": "six test sentences", "type": "tests/six-sentences", "split": "test"}
    types = [(m["type"], m["name"]) for m in result["metrics"]]
    assert types == [("bleu", SACREBLEU_METRIC_NAME), ("chrf", CHRF_METRIC_NAME), ("bleu", COMPOUND_SPLIT_METRIC_NAME)]
    # The model-index gives the numbers of the body's Results table, in its order.
    row = re.search(r"^\| test \(6 pairs\) \| (.*) \|$", body, flags=re.M).group(1).split(" | ")
    assert [m["value"] for m in result["metrics"]] == [float(cell) for cell in row]
    assert all(isinstance(m["value"], float) and 0 <= m["value"] <= 100 for m in result["metrics"])
    # huggingface_hub reads the same results back.
    loaded = ModelCard.load(fitted_folder / "README.md")
    assert [(r.metric_type, r.metric_value, r.dataset_split) for r in loaded.data.eval_results] == [
        (m["type"], m["value"], "test") for m in result["metrics"]
    ]


TRICKY = ["She said: \"hello\" -- 'hi'.", "a: b\n---\nc: #d", "- [not, a list] & *no alias", "{{ not jinja }} {% x %}"]


def test_quotes_colons_and_newlines_round_trip_through_the_yaml_unchanged(model, tokenizer):
    values = {
        **card_values(model, tokenizer, SCORE, TRICKY),
        "dataset_id": 'user/set: "v2"',
        "dataset_name": 'Ding\'s "dictionary": {{ de }}-en\nsecond line',
        "model_name": "model: 'x' #1",
        "license": 'other: see "LICENSE"',
    }
    card = render_model_card(values)
    metadata, body = _front_matter(card)
    assert metadata == check_card(card)
    assert metadata["widget"] == [{"text": text} for text in TRICKY]
    assert metadata["datasets"] == [values["dataset_id"]] and metadata["license"] == values["license"]
    [index] = metadata["model-index"]
    assert index["name"] == values["model_name"]
    assert index["results"][0]["dataset"]["name"] == values["dataset_name"]
    assert index["results"][0]["dataset"]["type"] == values["dataset_id"]
    # The body holds the values as given (not re-rendered as a template), and the usage code quotes the first example
    # as a Python string.
    assert f"- Data: {values['dataset_name']}: 6 training pairs" in body
    call = re.search(r"^print\(translator\((\[.*\]), batch_size", body, flags=re.M).group(1)
    assert ast.literal_eval(call) == [TRICKY[0]]
    # Retargeted for the Hub, every value keeps its text.
    hub = card_for_hub(card, "alice/tricky")
    hub_metadata = split_card(hub)[0]
    assert hub_metadata["widget"] == metadata["widget"] and hub_metadata["license"] == values["license"]
    assert hub_metadata["model-index"][0]["results"] == index["results"]
    assert ast.literal_eval(re.search(r"translator\((\[.*\]), batch_size", hub).group(1)) == [TRICKY[0]]


def test_card_states_the_saved_search_and_whether_it_is_the_papers(model, tokenizer):
    body = split_card(render_model_card(card_values(model, tokenizer, SCORE, EXAMPLES)))[1]
    assert "Search: beam 4, GNMT length penalty α = 0.6, maximum length = input + 50 (§6.1)." in body
    config = copy.deepcopy(model.generation_config)
    config.length_penalty, config.max_len_a, config.max_len_b = 1.2, 1.2, 4
    assert search_summary(config) == (
        "beam 4, GNMT length penalty α = 1.2, maximum length = 1.2 x input + 4 (the paper's, §6.1: beam 4, α = 0.6, "
        "input + 50)"
    )


def test_card_check_names_what_is_missing(model, tokenizer):
    card = render_model_card(card_values(model, tokenizer, SCORE, EXAMPLES))
    metadata, body = split_card(card)
    del metadata["model-index"]
    metadata["pipeline_tag"] = "text-generation"
    broken = "---\n" + yaml.safe_dump(metadata) + "---\n" + body
    with pytest.raises(ValueError, match=r"pipeline_tag: translation.*model-index"):
        check_card(broken)


def test_card_for_the_hub_names_the_repository_and_the_marian_card_says_what_it_is(model, tokenizer):
    card = render_model_card(card_values(model, tokenizer, SCORE, EXAMPLES))
    ours = card_for_hub(card, "alice/tiny-en-de")
    assert split_card(ours)[0]["model-index"][0]["name"] == "tiny-en-de" and "\n# tiny-en-de\n" in ours
    retargeted, rendered = split_card(ours)[0], split_card(card)[0]
    retargeted["model-index"][0]["name"] = rendered["model-index"][0]["name"]
    assert retargeted == rendered  # but for the name, the metadata is the card's
    assert 'AutoModelForSeq2SeqLM.from_pretrained("alice/tiny-en-de", trust_remote_code=True)' in ours
    # The card names the transformers versions the package requires (and is tested with).
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert re.findall(r'^\s*"(transformers\s*[<>=!~][^"]*)",', pyproject, flags=re.MULTILINE) == [
        TRANSFORMERS_REQUIREMENT
    ]
    assert f'pip install "{TRANSFORMERS_REQUIREMENT}"' in ours
    assert "USER/" not in ours
    marian = card_for_hub(card, "alice/tiny-en-de-marian", native="marian")
    metadata, body = split_card(marian)
    assert "marian" in metadata["tags"] and check_card(marian)
    assert "exact `transformers.MarianMTModel` conversion" in body
    assert 'MarianMTModel.from_pretrained("alice/tiny-en-de-marian")' in body and "trust_remote_code" not in body


def test_dry_run_builds_the_hub_folder_that_loads_in_a_fresh_process_without_vaswani_mt(fitted_folder, tmp_path):
    output = tmp_path / "hub"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "push_to_hub.py"), "--model", str(fitted_folder),
         "--repo_id", "alice/tiny-en-de", "--output", str(output), "--dry_run"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "same greedy tokens" in result.stdout and "dry run: not uploaded" in result.stdout
    files = {p.name for p in output.iterdir()}
    assert files == {
        "README.md", "config.json", "generation_config.json", "model.safetensors", "configuration_vaswani.py",
        "modeling_vaswani.py", "generation_vaswani.py", "beam_search_vaswani.py", "constraints_vaswani.py",
        "fast_paths_vaswani.py", "pipeline_vaswani.py", "processors_vaswani.py",
        "tokenizer.json", "tokenizer_config.json",
    }  # fmt: skip
    config = json.loads((output / "config.json").read_text())
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    assert "translation" in config["custom_pipelines"]
    assert check_card((output / "README.md").read_text())["model-index"][0]["name"] == "tiny-en-de"
    assert check_hub_files(output) == sorted(files)  # no pickle, no code but the model's


def test_marian_hub_folder_loads_without_remote_code_and_gives_the_same_greedy_tokens(fitted_folder, tmp_path):
    folder, model, tokenizer = build_hub_folder(fitted_folder, tmp_path / "marian", "alice/m", native="marian")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "marian"
    assert not list(folder.glob("*.py"))
    report = check_hub_folder(folder, model, tokenizer, native="marian")  # raises on other tokens
    assert report["class"] == "MarianMTModel" and report["module"].startswith("transformers.models.marian")


def test_building_refuses_a_folder_without_card_or_of_another_model(tmp_path, tokenizer):
    bare = tmp_path / "bare"
    make_model().save_pretrained(bare)
    tokenizer.save_pretrained(bare)
    with pytest.raises(ValueError, match="no model card"):
        build_hub_folder(bare, tmp_path / "out", "alice/x")
    with pytest.raises(ValueError, match="USER/NAME"):
        build_hub_folder(bare, tmp_path / "out", "not a repo id")
    with pytest.raises(ValueError, match=r"no config\.json"):
        build_hub_folder(tmp_path, tmp_path / "out", "alice/x")


@pytest.mark.parametrize(
    ("extra", "native", "message"),
    [
        ("pytorch_model.bin", "vaswani", r"holds pytorch_model\.bin: a Hub folder holds weights as safetensors only"),
        ("optimizer.pt", "vaswani", r"holds optimizer\.pt"),
        ("sub/state.pkl", "vaswani", r"holds sub/state\.pkl"),
        ("setup.py", "vaswani", r"holds code that is not the model's: setup\.py"),
        ("modeling_vaswani.py", "marian", r"holds code that is not the model's: .*modeling_vaswani\.py"),
        ("-modeling_vaswani.py", "vaswani", r"lacks the model's code files modeling_vaswani\.py"),
    ],
)
def test_publishing_refuses_a_folder_with_pickles_or_other_code(tmp_path, extra, native, message):
    code = REMOTE_CODE_FILES if native == "vaswani" else ()
    for name in ("config.json", "model.safetensors", *code):
        (tmp_path / name).write_text("{}")
    if extra.startswith("-"):
        (tmp_path / extra[1:]).unlink()
    else:
        (tmp_path / extra).parent.mkdir(exist_ok=True)
        (tmp_path / extra).write_text("x")
    with pytest.raises(RuntimeError, match=message):
        check_hub_files(tmp_path, native)
    model = make_model()
    with pytest.raises(RuntimeError, match=message):  # before the card or the fresh process
        check_hub_folder(tmp_path, model, None, native)


def test_upload_failures_say_why_and_keep_the_folder(tmp_path, monkeypatch):
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "README.md").write_text("card")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(HubUploadError, match=r"no Hugging Face token.*hf auth login.*is kept.*with --overwrite"):
        upload_folder(folder, "alice/x")
    with pytest.raises(HubUploadError, match=r"cannot reach the Hugging Face Hub.*is kept"):
        upload_folder(folder, "alice/x", token="hf_test", endpoint="http://127.0.0.1:9")  # nothing listens there
    assert (folder / "README.md").read_text() == "card"
