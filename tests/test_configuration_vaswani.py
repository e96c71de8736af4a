import pytest

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration


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
    ],
)
def test_invalid_values_raise_value_error_naming_field_and_value(kwargs, field, value):
    with pytest.raises(ValueError) as error:
        VaswaniConfig(**kwargs)
    assert field in str(error.value) and value in str(error.value)


def test_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="huge"):
        VaswaniConfig.from_preset("huge")


def test_config_round_trips_through_json(tmp_path):
    config = VaswaniConfig.from_preset("tiny", d_k=4, position_encoding="learned")
    config.save_pretrained(tmp_path)
    loaded = VaswaniConfig.from_pretrained(tmp_path)
    assert (loaded.d_k, loaded.d_v, loaded.position_encoding, loaded.model_type) == (4, 8, "learned", "vaswani_mt")
