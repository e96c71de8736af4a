import json
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.model.configuration_vaswani import PRESETS

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]


def test_base_and_big_presets_match_table_3():
    base = VaswaniConfig.from_preset("base", vocab_size=37000)
    assert (base.num_encoder_layers, base.num_decoder_layers, base.d_model, base.d_ff, base.num_heads) == (
        6,
        6,
        512,
        2048,
        8,
    )
    assert (base.d_k, base.d_v, base.dropout, base.label_smoothing) == (64, 64, 0.1, 0.1)
    big = VaswaniConfig.from_preset("big")
    assert (big.d_model, big.d_ff, big.num_heads, big.dropout, big.d_k) == (1024, 4096, 16, 0.3, 64)


def test_paper_defaults_for_the_rest():
    config = VaswaniConfig()
    assert config.attention_dropout == 0.0 and config.activation_dropout == 0.0
    assert config.layer_norm_eps == 1e-6 and config.attention_bias is False
    assert config.position_encoding == "sinusoidal" and config.tie_word_embeddings is True


def test_base_model_has_the_papers_65m_parameters():
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("base", vocab_size=37000))
    # MarianMTModel of the same shape has 63,082,496 (ANCHORS.md); it adds 4 x 512 attention biases in 18 attentions.
    assert sum(p.numel() for p in model.parameters()) == 63_082_496 - 18 * 4 * 512


def test_preset_overrides_and_free_head_sizes():
    config = VaswaniConfig.from_preset("base", d_k=16)  # Table 3 row B
    assert config.d_k == 16 and config.d_v == 64
    config = VaswaniConfig(d_model=512, num_heads=32, d_k=16, d_v=16)  # Table 3 row A
    assert (config.d_k, config.d_v) == (16, 16)


def test_attribute_map_lets_generic_code_find_sizes():
    config = VaswaniConfig.from_preset("big")
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (1024, 16, 6)


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"d_model": 0}, "d_model", "0"),
        ({"d_ff": -5}, "d_ff", "-5"),
        ({"num_encoder_layers": 0}, "num_encoder_layers", "0"),
        ({"d_model": 100, "num_heads": 8}, "d_model", "100"),
        ({"dropout": 1.0}, "dropout", "1.0"),
        ({"attention_dropout": -0.1}, "attention_dropout", "-0.1"),
        ({"position_encoding": "rotary"}, "position_encoding", "rotary"),
        ({"vocab_size": 50, "pad_token_id": 50}, "pad_token_id", "50"),
        ({"eos_token_id": -1}, "eos_token_id", "-1"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings", "§3.4"),
        ({"num_heads": 0}, "num_heads", "0"),
        ({"d_k": -8}, "d_k", "-8"),
        ({"vocab_size": "37000"}, "vocab_size", "'37000'"),
        ({"d_model": 512.0}, "d_model", "512.0"),
        ({"num_decoder_layers": True}, "num_decoder_layers", "True"),
        ({"max_position_embeddings": None}, "max_position_embeddings", "None"),
        ({"label_smoothing": 1.0}, "label_smoothing", "1.0"),
        ({"label_smoothing": -0.1}, "label_smoothing", "-0.1"),
        ({"activation_dropout": float("nan")}, "activation_dropout", "nan"),
        ({"dropout": "0.1"}, "dropout", "'0.1'"),
        ({"position_encoding": None}, "position_encoding", "None"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps", "0.0"),
        ({"init_std": -0.02}, "init_std", "-0.02"),
        ({"attention_bias": "no"}, "attention_bias", "'no'"),
    ],
)
def test_invalid_values_are_refused_as_strict_configs_are_naming_field_and_value(kwargs, field, value):
    # huggingface_hub's @strict wraps the cause: a TypeError from the field's type, a ValueError from a validate_*.
    with pytest.raises(StrictDataclassError) as error:
        VaswaniConfig(**kwargs)
    cause = str(error.value.__cause__)
    assert field in cause and value in cause and "\n" not in cause


def test_a_value_set_after_building_is_checked_by_type_and_by_validate():
    config = VaswaniConfig.from_preset("tiny")
    with pytest.raises(StrictDataclassError, match="d_model"):
        config.d_model = "64"
    config.dropout = 1.5  # a value check needs the other fields: validate() runs it, as save_pretrained does
    with pytest.raises(StrictDataclassError) as error:
        config.validate()
    assert str(error.value.__cause__) == "dropout must be a number in [0, 1), got 1.5"


def test_head_sizes_need_divisibility_only_when_not_given():
    with pytest.raises(StrictDataclassError, match=r"d_model \(100\) must be divisible by num_heads \(8\)"):
        VaswaniConfig(d_model=100, num_heads=8)
    with pytest.raises(StrictDataclassError, match=r"d_model \(100\) must be divisible by num_heads \(8\)"):
        VaswaniConfig(d_model=100, num_heads=8, d_k=16)  # d_v would still be d_model / h
    config = VaswaniConfig(d_model=100, num_heads=8, d_k=16, d_v=12)
    assert (config.d_k, config.d_v) == (16, 12)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_and_its_saved_config_loads_unchanged(name, tmp_path):
    config = VaswaniConfig.from_preset(name)
    config.save_pretrained(tmp_path)
    loaded = VaswaniConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
    assert (loaded.d_model, loaded.d_k * loaded.num_heads) == (PRESETS[name]["d_model"], PRESETS[name]["d_model"])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dropout", 1.5, "dropout must be a number in [0, 1), got 1.5"),
        ("d_model", "32", "Field 'd_model' expected int, got str (value: '32')"),
        ("num_heads", 0, "num_heads must be a positive integer, got 0"),
        (
            "position_encoding",
            "rotary",
            "Field 'position_encoding' expected one of ('sinusoidal', 'learned'), got rotary",
        ),
    ],
)
def test_an_impossible_value_in_config_json_is_refused_when_loaded(tmp_path, field, value, message):
    VaswaniConfig.from_preset("tiny").save_pretrained(tmp_path)
    values = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**values, field: value}))
    with pytest.raises(StrictDataclassError) as error:
        VaswaniConfig.from_pretrained(tmp_path)
    assert str(error.value.__cause__) == message


_FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", ["config_329911a_small.json", "config_329911a_tiny_learned.json"])
def test_config_json_saved_before_strict_loads_with_every_value(tmp_path, name):
    # Saved by the package at 329911a (hand-written checks): every field comes back, and saving it again (which runs
    # validate()) writes the same values.
    saved = json.loads((_FIXTURES / name).read_text())
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = VaswaniConfig.from_pretrained(tmp_path)
    fields = {k: v for k, v in saved.items() if k not in ("transformers_version", "auto_map", "architectures",
                                                          "custom_pipelines", "dtype")}  # fmt: skip
    assert {k: getattr(config, k) for k in fields} == fields
    config.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert {k: again[k] for k in fields} == fields


# Any JSON value a config.json could hold, for any field: each config either builds a model or is refused by @strict
# naming a field it was given (never a bare TypeError, ZeroDivisionError, or a model that cannot be built).
_JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "32", "sinusoidal", "learned", "rotary"]),
    st.lists(st.integers(-1, 3), max_size=2),
)
_FIELDS = [
    "vocab_size", "d_model", "d_ff", "num_heads", "d_k", "d_v", "num_encoder_layers", "num_decoder_layers",
    "dropout", "attention_dropout", "label_smoothing", "position_encoding", "max_position_embeddings",
    "layer_norm_eps", "attention_bias", "init_std", "pad_token_id", "eos_token_id",
]  # fmt: skip


@settings(max_examples=150, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(st.dictionaries(st.sampled_from(_FIELDS), _JSON_VALUES, min_size=1, max_size=3))
def test_any_config_values_build_a_model_or_are_refused_naming_a_field(overrides):
    values = {**PRESETS["tiny"], "vocab_size": 64, **overrides}
    try:
        config = VaswaniConfig(**values)
    except StrictDataclassError as error:
        message = str(error.__cause__)
        assert "\n" not in message
        names = [(f"Field '{field}'", f"{field} ", f"{field} (") for field in _FIELDS]
        assert any(message.startswith(named) for named in names), message
        return
    with torch.device("meta"):  # shapes only: a config that builds must build a model
        model = VaswaniForConditionalGeneration(config)
    attention = model.model.encoder.layers[0].self_attn
    assert attention.q_proj.weight.shape == (config.num_heads * config.d_k, config.d_model)
    assert 0 <= config.dropout < 1 and 0 <= config.label_smoothing < 1


def test_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="huge"):
        VaswaniConfig.from_preset("huge")


def test_config_round_trips_through_json(tmp_path):
    config = VaswaniConfig.from_preset("tiny", d_k=4, position_encoding="learned")
    config.save_pretrained(tmp_path)
    loaded = VaswaniConfig.from_pretrained(tmp_path)
    assert (loaded.d_k, loaded.d_v, loaded.position_encoding, loaded.model_type) == (4, 8, "learned", "vaswani_mt")
