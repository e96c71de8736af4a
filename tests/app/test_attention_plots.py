"""Attention pictures: the weights of the translation itself, per layer and head, drawn to PNG files."""

import pytest
import torch

from vaswani_mt.app.attention_plots import heatmap_figure, plot_attentions, translate_with_attention
from vaswani_mt.inference.loading import load_for_inference

pytestmark = pytest.mark.transformers_internals


def test_attentions_are_those_of_the_translation_per_layer_and_head(fitted_folder):
    model, tokenizer = load_for_inference(str(fitted_folder))  # sdpa by default: switched to eager
    attentions = translate_with_attention(model, tokenizer, "The girl ate an apple.", num_beams=1)
    assert attentions.translation == "Das Mädchen hat einen Apfel gegessen."
    assert model.config._attn_implementation == "eager"
    source, target = len(attentions.source_tokens), len(attentions.target_tokens)
    assert attentions.source_tokens[-1] == "</s>" and attentions.target_tokens[-1] == "</s>"
    assert attentions.decoder_input_tokens[0] == "<s>" and len(attentions.decoder_input_tokens) == target
    layers, heads = model.config.num_encoder_layers, model.config.num_heads
    assert attentions.encoder.shape == (layers, heads, source, source)
    assert attentions.decoder.shape == (layers, heads, target, target)
    assert attentions.cross.shape == (layers, heads, target, source)
    for weights in (attentions.encoder, attentions.decoder, attentions.cross):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert torch.all(attentions.decoder.triu(1) == 0)  # §3.2.3: no position sees a later one


def test_plots_are_png_files_per_kind_and_layer(fitted_folder, tmp_path):
    model, tokenizer = load_for_inference(str(fitted_folder), attn_implementation="eager")
    attentions = translate_with_attention(model, tokenizer, "How are you today?")
    paths = plot_attentions(attentions, tmp_path)
    layers = model.config.num_encoder_layers
    assert sorted(p.name for p in paths) == sorted(
        f"{kind}_layer{layer}.png" for kind in ("encoder", "decoder", "cross") for layer in range(1, layers + 1)
    )
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    figure = heatmap_figure(attentions, "cross")
    assert figure.axes[0].get_title().startswith("encoder-decoder attention, layer 2")
    with pytest.raises(ValueError, match="empty"):
        translate_with_attention(model, tokenizer, "  ")
