"""Exact conversion of a vaswani_mt model to `transformers.MarianMTModel`.

Marian is the same post-LN architecture written by others, with three differences that this conversion absorbs:
its sinusoids are laid out as [sin | cos] halves instead of the paper's interleaved sin/cos, its attention
projections have biases, and its LayerNorm eps is fixed at 1e-5. Permuting the hidden dimension with
`[0, 2, 4, ..., 1, 3, 5, ...]` in every weight that touches it turns our interleaved encoding into Marian's layout;
LayerNorm, residual adds, ReLU and the dot products of attention are all indifferent to a consistent permutation
of that dimension, so the converted model computes the same logits. The biases are set to zero.

Equal logits (to float64 round-off) against an implementation we did not write are the proof of fidelity, and a
native Marian folder can be served by hosted inference without remote code.

`export_model` writes such a folder (`save_marian`, with the tokenizer) or converts it further to CTranslate2
(`ctranslate2.to_ctranslate2`), the C++ engine users pick for fast Marian decoding.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from transformers import MarianConfig, MarianMTModel

from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration, sinusoidal_position_encoding

_MARIAN_LAYER_NORM_EPS = 1e-5


def hidden_permutation(d_model: int) -> torch.Tensor:
    """Index `p` with `marian_hidden[j] = ours[p[j]]`: even dimensions (sines) first, then odd ones (cosines)."""
    return torch.cat((torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)))


def marian_config(config) -> MarianConfig:
    """The `MarianConfig` of the same shape as a `VaswaniConfig`."""
    if config.position_encoding != "sinusoidal":
        raise ValueError(f"to_marian needs sinusoidal position encodings, got {config.position_encoding!r}")
    if config.d_k * config.num_heads != config.d_model or config.d_v != config.d_k:
        raise ValueError(
            f"to_marian needs d_k = d_v = d_model / num_heads (Marian has no free head sizes), got "
            f"d_k={config.d_k}, d_v={config.d_v}, d_model={config.d_model}, num_heads={config.num_heads}"
        )
    if config.d_model % 2:
        raise ValueError(f"to_marian needs an even d_model, got {config.d_model}")
    return MarianConfig(
        vocab_size=config.vocab_size,
        decoder_vocab_size=config.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.num_encoder_layers,
        decoder_layers=config.num_decoder_layers,
        encoder_attention_heads=config.num_heads,
        decoder_attention_heads=config.num_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        activation_function="relu",
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        max_position_embeddings=config.max_position_embeddings,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        init_std=config.init_std if config.init_std is not None else 0.02,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        forced_eos_token_id=None,
        decoder_start_token_id=config.decoder_start_token_id,
    )


def _linear(
    ours: torch.nn.Linear, marian: torch.nn.Linear, perm_in: torch.Tensor | None, perm_out: torch.Tensor | None
):
    weight = ours.weight.detach()
    if perm_out is not None:
        weight = weight[perm_out]
    if perm_in is not None:
        weight = weight[:, perm_in]
    marian.weight.copy_(weight)
    if marian.bias is not None:
        if ours.bias is None:
            marian.bias.zero_()
        else:
            bias = ours.bias.detach()
            marian.bias.copy_(bias[perm_out] if perm_out is not None else bias)


def _layer_norm(ours: torch.nn.LayerNorm, marian: torch.nn.LayerNorm, perm: torch.Tensor) -> None:
    marian.weight.copy_(ours.weight.detach()[perm])
    marian.bias.copy_(ours.bias.detach()[perm])
    # Marian's config has no eps field (always 1e-5); the in-memory model takes ours so logits match exactly.
    marian.eps = ours.eps


def _attention(ours, marian, perm: torch.Tensor) -> None:
    for name in ("q_proj", "k_proj", "v_proj"):
        _linear(getattr(ours, name), getattr(marian, name), perm_in=perm, perm_out=None)
    _linear(ours.out_proj, marian.out_proj, perm_in=None, perm_out=perm)


def _feed_forward(ours, marian_layer, perm: torch.Tensor) -> None:
    _linear(ours.fc1, marian_layer.fc1, perm_in=perm, perm_out=None)
    _linear(ours.fc2, marian_layer.fc2, perm_in=None, perm_out=perm)


@torch.no_grad()
def to_marian(model: VaswaniForConditionalGeneration) -> MarianMTModel:
    """Returns a `MarianMTModel` that computes the same logits as `model` (same dtype and device, eval mode).

    The returned model's LayerNorms use `model`'s eps in memory. Marian's saved config cannot hold it: reloaded
    from disk a Marian folder uses 1e-5, which changes logits by about 1e-6 relative (tokens stay the same).
    """
    config = model.config
    perm = hidden_permutation(config.d_model).to(model.device)
    marian = MarianMTModel(marian_config(config)).to(device=model.device, dtype=model.dtype).eval()
    marian.generation_config.num_beams = model.generation_config.num_beams
    marian.generation_config.length_penalty = model.generation_config.length_penalty
    marian.generation_config.bad_words_ids = None

    marian.model.shared.weight.copy_(model.model.shared.weight.detach()[:, perm])
    marian.final_logits_bias.zero_()
    # Marian builds its table through float32; ours is float64 before the cast. Same values, finer round-off.
    positions = torch.arange(config.max_position_embeddings, device=model.device)
    table = sinusoidal_position_encoding(positions, config.d_model, model.dtype)[:, perm]
    marian.model.encoder.embed_positions.weight.copy_(table)
    marian.model.decoder.embed_positions.weight.copy_(table)
    for ours, theirs in zip(model.model.encoder.layers, marian.model.encoder.layers, strict=True):
        _attention(ours.self_attn, theirs.self_attn, perm)
        _layer_norm(ours.self_attn_sublayer.layer_norm, theirs.self_attn_layer_norm, perm)
        _feed_forward(ours.ffn, theirs, perm)
        _layer_norm(ours.ffn_sublayer.layer_norm, theirs.final_layer_norm, perm)
    for ours, theirs in zip(model.model.decoder.layers, marian.model.decoder.layers, strict=True):
        _attention(ours.self_attn, theirs.self_attn, perm)
        _layer_norm(ours.self_attn_sublayer.layer_norm, theirs.self_attn_layer_norm, perm)
        _attention(ours.cross_attn, theirs.encoder_attn, perm)
        _layer_norm(ours.cross_attn_sublayer.layer_norm, theirs.encoder_attn_layer_norm, perm)
        _feed_forward(ours.ffn, theirs, perm)
        _layer_norm(ours.ffn_sublayer.layer_norm, theirs.final_layer_norm, perm)
    marian.tie_weights()
    return marian


# What a hosted Marian model may generate: `max_length` of the generation config (Marian's own default, 20 tokens in
# transformers 4's hosted widget, would cut translations short; OPUS-MT models publish 512).
MARIAN_MAX_LENGTH = 512


def save_marian(model: VaswaniForConditionalGeneration, tokenizer, output: str | Path) -> Path:
    """Writes the exact `MarianMTModel` conversion of `model` with `tokenizer` to `output`: a native transformers
    folder (no remote code) that `MarianMTModel`/`AutoModelForSeq2SeqLM` and `AutoTokenizer` load."""
    output = Path(output)
    marian = to_marian(model.float())
    marian.generation_config.max_length = MARIAN_MAX_LENGTH
    marian.save_pretrained(output)
    tokenizer.save_pretrained(output)
    # `TokenizersBackend` is transformers 5's name; transformers 4 (and the Hub's hosted inference) know the same
    # tokenizer.json-backed class as PreTrainedTokenizerFast, which transformers 5 also maps to it.
    config_path = output / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text(encoding="utf-8"))
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return output


def export_model(model: str | Path, fmt: str, output: str | Path, quantization: str | None = None) -> Path:
    """Exports a saved vaswani_mt model (folder or Hub id) as a native Marian folder (`fmt="marian"`) or a
    CTranslate2 model (`fmt="ctranslate2"`, through the Marian folder). A folder that is not a loadable vaswani_mt
    model raises `loading.ModelFolderError` (a `ValueError`), before anything is written. `output` is written whole
    (`system.written_whole`): what was there stays until the export is complete, then is replaced."""
    from vaswani_mt.inference.loading import load_for_inference
    from vaswani_mt.system.folders import written_whole

    from .ctranslate2 import to_ctranslate2

    if fmt not in ("marian", "ctranslate2"):
        raise ValueError(f"unknown export format {fmt!r}: choose 'marian' or 'ctranslate2'")
    if quantization and fmt != "ctranslate2":
        raise ValueError("--quantization applies to the ctranslate2 format only")
    loaded, tokenizer = load_for_inference(str(model), device="cpu")
    with written_whole(output) as staging:
        if fmt == "marian":
            save_marian(loaded, tokenizer, staging)
        else:
            with tempfile.TemporaryDirectory(prefix="vaswani-marian-") as marian_dir:
                save_marian(loaded, tokenizer, marian_dir)
                to_ctranslate2(marian_dir, staging, quantization)
            loaded.generation_config.save_pretrained(staging)  # the model's search, for ctranslate2_search
    return Path(output)


__all__ = [
    "MARIAN_MAX_LENGTH",
    "export_model",
    "hidden_permutation",
    "marian_config",
    "save_marian",
    "to_marian",
]
