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

from vaswani_mt.model.configuration_vaswani import VaswaniConfig
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
        activation_function=config.activation_function,
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


def _module_pairs(model: VaswaniForConditionalGeneration, marian: MarianMTModel) -> list[tuple]:
    """Every linear layer and LayerNorm of `model` beside its counterpart in `marian`, as (ours, theirs, whether the
    input side is the hidden dimension, whether the output side is): the one map that both directions copy by."""
    pairs = []

    def attention(ours, theirs):
        pairs.extend(
            (getattr(ours, name), getattr(theirs, name), True, False) for name in ("q_proj", "k_proj", "v_proj")
        )
        pairs.append((ours.out_proj, theirs.out_proj, False, True))

    def sublayers(ours, theirs, names):
        for our_name, their_norm in names:
            if our_name == "ffn":
                pairs.extend(((ours.ffn.fc1, theirs.fc1, True, False), (ours.ffn.fc2, theirs.fc2, False, True)))
            else:
                attention(
                    getattr(ours, our_name), getattr(theirs, "encoder_attn" if our_name == "cross_attn" else our_name)
                )
            pairs.append((getattr(ours, f"{our_name}_sublayer").layer_norm, getattr(theirs, their_norm), None, True))

    encoder = (("self_attn", "self_attn_layer_norm"), ("ffn", "final_layer_norm"))
    decoder = (
        ("self_attn", "self_attn_layer_norm"),
        ("cross_attn", "encoder_attn_layer_norm"),
        ("ffn", "final_layer_norm"),
    )
    for ours, theirs in zip(model.model.encoder.layers, marian.model.encoder.layers, strict=True):
        sublayers(ours, theirs, encoder)
    for ours, theirs in zip(model.model.decoder.layers, marian.model.decoder.layers, strict=True):
        sublayers(ours, theirs, decoder)
    return pairs


def _copy(source: torch.nn.Module, target: torch.nn.Module, perm_in, perm_out) -> None:
    """`target`'s weight and bias from `source`'s, hidden dimensions taken in the order `perm_in` / `perm_out` (None:
    as they are). A missing source bias is zero; a missing target bias only takes a zero one."""
    weight = source.weight.detach()
    if perm_out is not None:
        weight = weight[perm_out]
    if perm_in is not None:
        weight = weight[:, perm_in]
    target.weight.copy_(weight)
    bias = None if source.bias is None else source.bias.detach()
    if bias is not None and perm_out is not None:
        bias = bias[perm_out]
    if target.bias is not None:
        target.bias.copy_(bias) if bias is not None else target.bias.zero_()
    elif bias is not None and bias.any():
        raise ValueError(f"a nonzero bias where the target {type(target).__name__} has none")
    if isinstance(target, torch.nn.LayerNorm):
        target.eps = (
            source.eps
        )  # Marian's config has no eps field (always 1e-5): the in-memory model takes the source's


def _copy_all(model: VaswaniForConditionalGeneration, marian: MarianMTModel, to_marian: bool) -> None:
    """Every weight one way: ours to Marian's hidden order with `hidden_permutation`, or back with its inverse."""
    perm = hidden_permutation(model.config.d_model).to(model.device)
    if not to_marian:
        perm = torch.argsort(perm)
    for ours, theirs, hidden_in, hidden_out in _module_pairs(model, marian):
        source, target = (ours, theirs) if to_marian else (theirs, ours)
        if hidden_in is None:  # a LayerNorm: one vector over the hidden dimension
            _copy(source, target, None, perm)
        else:
            _copy(source, target, perm if hidden_in else None, perm if hidden_out else None)
    shared_source, shared_target = (model.model.shared, marian.model.shared)[:: 1 if to_marian else -1]
    shared_target.weight.copy_(shared_source.weight.detach()[:, perm])


@torch.no_grad()
def to_marian(model: VaswaniForConditionalGeneration) -> MarianMTModel:
    """Returns a `MarianMTModel` that computes the same logits as `model` (same dtype and device, eval mode).

    The returned model's LayerNorms use `model`'s eps in memory. Marian's saved config cannot hold it: reloaded
    from disk a Marian folder uses 1e-5, which changes logits by about 1e-6 relative (tokens stay the same).
    """
    config = model.config
    marian = MarianMTModel(marian_config(config)).to(device=model.device, dtype=model.dtype).eval()
    marian.generation_config.num_beams = model.generation_config.num_beams
    marian.generation_config.length_penalty = model.generation_config.length_penalty
    marian.generation_config.bad_words_ids = model.generation_config.bad_words_ids

    _copy_all(model, marian, to_marian=True)
    if config.logits_bias:
        marian.final_logits_bias.copy_(model.final_logits_bias)
    else:
        marian.final_logits_bias.zero_()
    # Marian builds its table through float32; ours is float64 before the cast. Same values, finer round-off.
    table = _marian_positions(config.d_model, config.max_position_embeddings, model.device, model.dtype)
    marian.model.encoder.embed_positions.weight.copy_(table)
    marian.model.decoder.embed_positions.weight.copy_(table)
    marian.tie_weights()
    return marian


def _marian_positions(d_model: int, length: int, device, dtype) -> torch.Tensor:
    """The §3.5 table in Marian's layout ([sin | cos] halves)."""
    positions = torch.arange(length, device=device)
    return sinusoidal_position_encoding(positions, d_model, dtype)[:, hidden_permutation(d_model).to(device)]


# What `from_marian` cannot represent exactly, as (the field, its value that is refused, why); transformers' Marian
# code itself ignores the BART-era fields, so a config that sets them describes a model neither computes.
_REFUSED = (
    (
        "share_encoder_decoder_embeddings",
        False,
        "separate source and target embeddings (the opus-mt-tc-big models); §3.4 shares one matrix",
    ),
    ("tie_word_embeddings", False, "a pre-softmax matrix of its own; §3.4 shares one matrix"),
    ("normalize_before", True, "pre-LN sub-layers; the paper's are post-LN (§3.1)"),
    ("normalize_embedding", True, "a LayerNorm on the embeddings (layernorm_embedding), which the paper has not"),
    ("layernorm_embedding", True, "a LayerNorm on the embeddings, which the paper has not"),
    ("add_final_layer_norm", True, "a LayerNorm after each stack (pre-LN), which the paper has not"),
    ("static_position_embeddings", False, "learned positions where from_marian reads sinusoids (§3.5)"),
    ("scale_embedding", False, "embeddings not multiplied by sqrt(d_model) (§3.4)"),
)
_ACTIVATIONS = ("relu", "swish", "silu", "gelu")


def vaswani_config(marian_config: MarianConfig) -> VaswaniConfig:
    """The `VaswaniConfig` of a `MarianConfig`, or ValueError (one line, naming the field) for one that the paper's
    architecture cannot compute exactly."""
    for field, refused, why in _REFUSED:
        if getattr(marian_config, field, not refused) == refused:
            raise ValueError(f"cannot import this Marian model exactly: {field} is {refused} ({why})")
    sides = (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"))
    differ = [(a, b) for a, b in sides if getattr(marian_config, a) != getattr(marian_config, b)]
    vocab = marian_config.decoder_vocab_size or marian_config.vocab_size
    if vocab != marian_config.vocab_size:
        differ.append(("vocab_size", "decoder_vocab_size"))
    if differ:
        a, b = differ[0]
        raise ValueError(f"cannot import this Marian model exactly: {a} is {getattr(marian_config, a)} but {b} is "
                         f"{getattr(marian_config, b)}; the paper's stacks have one size")  # fmt: skip
    if marian_config.activation_function not in _ACTIVATIONS:
        raise ValueError(f"cannot import this Marian model exactly: activation_function is "
                         f"{marian_config.activation_function!r}, not one of {', '.join(_ACTIVATIONS)}")  # fmt: skip
    if marian_config.d_model % 2 or marian_config.d_model % marian_config.encoder_attention_heads:
        raise ValueError(f"cannot import this Marian model exactly: d_model is {marian_config.d_model}, which must be "
                         f"even and divisible by {marian_config.encoder_attention_heads} heads")  # fmt: skip
    return VaswaniConfig(
        vocab_size=marian_config.vocab_size,
        d_model=marian_config.d_model,
        d_ff=marian_config.encoder_ffn_dim,
        num_heads=marian_config.encoder_attention_heads,
        num_encoder_layers=marian_config.encoder_layers,
        num_decoder_layers=marian_config.decoder_layers,
        dropout=marian_config.dropout,
        attention_dropout=marian_config.attention_dropout,
        activation_dropout=marian_config.activation_dropout,
        activation_function=marian_config.activation_function,
        max_position_embeddings=marian_config.max_position_embeddings,
        layer_norm_eps=_MARIAN_LAYER_NORM_EPS,
        init_std=marian_config.init_std,
        pad_token_id=marian_config.pad_token_id,
        bos_token_id=marian_config.bos_token_id,
        eos_token_id=marian_config.eos_token_id,
        decoder_start_token_id=marian_config.decoder_start_token_id,
    )


@torch.no_grad()
def from_marian(marian: MarianMTModel) -> VaswaniForConditionalGeneration:
    """The exact inverse of `to_marian`: a `VaswaniForConditionalGeneration` that computes `marian`'s logits (float32,
    eval mode), such as an OPUS-MT checkpoint's. What the paper's architecture cannot represent is refused in one
    line that names the field (`vaswani_config`, and positions that are not the sinusoids of §3.5). Biases are
    kept where the checkpoint has nonzero ones: attention biases (`attention_bias`) and the logits bias
    (`logits_bias`, Marian's `final_logits_bias`), so that our own models come back with the paper's config."""
    config = vaswani_config(marian.config)
    layers = [*marian.model.encoder.layers, *marian.model.decoder.layers]
    attentions = [
        getattr(layer, name) for layer in layers for name in ("self_attn", "encoder_attn") if hasattr(layer, name)
    ]
    config.attention_bias = any(
        getattr(attention, name).bias is not None and getattr(attention, name).bias.any()
        for attention in attentions for name in ("q_proj", "k_proj", "v_proj", "out_proj")
    )  # fmt: skip
    config.logits_bias = bool(marian.final_logits_bias.any())
    config.layer_norm_eps = layers[0].self_attn_layer_norm.eps
    marian = marian.float()
    table = _marian_positions(config.d_model, config.max_position_embeddings, marian.device, torch.float32)
    for stack in ("encoder", "decoder"):
        saved = getattr(marian.model, stack).embed_positions.weight
        if saved.shape != table.shape or not torch.allclose(saved, table, rtol=0, atol=1e-5):
            raise ValueError(f"cannot import this Marian model exactly: model.{stack}.embed_positions.weight is not "
                             "the sinusoidal encoding of §3.5 (learned positions?)")  # fmt: skip
    if marian.lm_head.weight.data_ptr() != marian.model.shared.weight.data_ptr() and not torch.equal(
        marian.lm_head.weight, marian.model.shared.weight
    ):
        raise ValueError("cannot import this Marian model exactly: lm_head.weight is not model.shared.weight (§3.4 "
                         "shares one matrix)")  # fmt: skip
    model = VaswaniForConditionalGeneration(config).to(marian.device).eval()
    _copy_all(model, marian, to_marian=False)
    if config.logits_bias:
        model.final_logits_bias.copy_(marian.final_logits_bias)
    model.tie_weights()
    return model


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
    if not tokenizer.is_fast:  # an imported checkpoint's MarianTokenizer, a class every transformers knows
        return output
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
    "from_marian",
    "hidden_permutation",
    "marian_config",
    "save_marian",
    "to_marian",
    "vaswani_config",
]
