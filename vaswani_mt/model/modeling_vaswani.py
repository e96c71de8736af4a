"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers model.

Reads top to bottom like Figure 1: positional encoding (§3.5), attention (§3.2), feed-forward (§3.3), the
post-LN encoder and decoder layers (§3.1), the two stacks, the encoder-decoder, and the model with the tied
pre-softmax projection (§3.4), its label-smoothed loss (§5.4) and the paper's beam search (§6.1).

The speed machinery lives next door in fast_paths_vaswani.py: dropout with a faster CPU mask (`apply_dropout`),
MKL's packed GEMM for few-row CPU inference (`_project`) and the training loss fused with the projection
(`projected_label_smoothed_cross_entropy`). Where this file calls them, a comment gives the plain computation.

Self-contained (torch, transformers and the sibling files configuration_vaswani.py, fast_paths_vaswani.py and
pipeline_vaswani.py only) so that `save_pretrained` copies it, with them, as Hub remote code.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
from torch import nn
from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging

from .configuration_vaswani import VaswaniConfig
from .fast_paths_vaswani import _project, apply_dropout, projected_label_smoothed_cross_entropy
from .pipeline_vaswani import CUSTOM_PIPELINES

logger = logging.get_logger(__name__)

# transformers 5.24 renamed the KV cache that `generate()` passes to `forward` and reads back from its output, and
# the argument of `create_causal_mask`, from `past_key_values` to `cache`. The model takes either name and writes
# the one the installed version reads, so that it runs (and its remote code runs) under 5.20-5.23 and 5.24+.
_CACHE_OUTPUT_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"
_CACHE_MASK_ARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def _one_cache(cache: Cache | None, past_key_values: Cache | None) -> Cache | None:
    """The cache passed under the new name (`cache`, transformers >= 5.24) or the old one (`past_key_values`)."""
    if cache is not None and past_key_values is not None:
        raise ValueError("pass the KV cache as `cache` or as `past_key_values`, not both")
    return cache if cache is not None else past_key_values


# The Auto classes a saved folder names, so that it loads as Hub remote code with `trust_remote_code=True`.
_AUTO_MAP = {
    "AutoConfig": "configuration_vaswani.VaswaniConfig",
    "AutoModel": "modeling_vaswani.VaswaniModel",
    "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
}


def sinusoidal_position_encoding(positions: torch.Tensor, d_model: int, dtype: torch.dtype) -> torch.Tensor:
    """§3.5: `PE(pos, 2i) = sin(pos / 10000^(2i/d_model))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))`.

    Sines and cosines are interleaved as in the paper's formula. Computed on the fly in float64 (it is tiny),
    so it is exact after `from_pretrained`, which builds the model on the meta device.
    """
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device)
    angles = positions.to(torch.float64).unsqueeze(-1) / torch.pow(10000.0, two_i / d_model)
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[..., :d_model]
    return pe.to(dtype)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (1): `softmax(Q K^T / sqrt(d_k)) V`; illegal connections carry -inf (a large negative) in the mask."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = apply_dropout(weights, dropout, module.training)  # = nn.functional.dropout(weights, dropout, ...)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


class VaswaniAttention(nn.Module):
    """§3.2.2 multi-head attention: `Concat(head_1..head_h) W^O`, `head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)`.

    The h per-head projections are stored as one matrix each (d_model x h*d_k, d_model x h*d_v). Keys and values
    come from `key_value_states` for encoder-decoder attention, else from `hidden_states` (self-attention).
    """

    def __init__(self, config: VaswaniConfig, is_causal: bool, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = config.num_heads
        self.d_k = config.d_k
        self.d_v = config.d_v
        self.scaling = config.d_k**-0.5
        # Read by transformers' sdpa integration: only decoder self-attention may use the causal shortcut.
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.attention_dropout = config.attention_dropout
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.d_model, config.num_heads * config.d_k, bias=bias)
        self.k_proj = nn.Linear(config.d_model, config.num_heads * config.d_k, bias=bias)
        self.v_proj = nn.Linear(config.d_model, config.num_heads * config.d_v, bias=bias)
        self.out_proj = nn.Linear(config.num_heads * config.d_v, config.d_model, bias=bias)

    def _heads(self, states: torch.Tensor, size: int) -> torch.Tensor:
        return states.view(*states.shape[:-1], self.num_heads, size).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        is_cross = key_value_states is not None
        # `_project(linear, x)` is `linear(x)`; few-row CPU inference runs it through a packed GEMM.
        query = self._heads(_project(self.q_proj, hidden_states), self.d_k)

        layer_cache = cache
        if isinstance(cache, EncoderDecoderCache):
            layer_cache = cache.cross_attention_cache if is_cross else cache.self_attention_cache
        if is_cross and layer_cache is not None and cache.is_updated.get(self.layer_idx):
            # The encoder output does not change while decoding: its keys and values are projected once.
            key = layer_cache.layers[self.layer_idx].keys
            value = layer_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross else hidden_states
            key = self._heads(_project(self.k_proj, source), self.d_k)
            value = self._heads(_project(self.v_proj, source), self.d_v)
            if layer_cache is not None:
                key, value = layer_cache.update(key, value, self.layer_idx)
                if is_cross:
                    cache.is_updated[self.layer_idx] = True

        implementation = self.config._attn_implementation
        if output_attentions and implementation != "eager":
            raise ValueError(
                f"output_attentions=True needs the eager attention implementation, not {implementation!r}: load the "
                "model with attn_implementation='eager' or call model.set_attn_implementation('eager')"
            )
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output = _project(self.out_proj, output.reshape(*hidden_states.shape[:-1], self.num_heads * self.d_v))
        return output, (weights if output_attentions else None)


class VaswaniFeedForward(nn.Module):
    """§3.3: `FFN(x) = max(0, x W1 + b1) W2 + b2`."""

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # = self.fc2(F.dropout(relu(self.fc1(x)))), through the fast paths `_project` and `apply_dropout`.
        hidden_states = nn.functional.relu(_project(self.fc1, hidden_states))
        hidden_states = apply_dropout(hidden_states, self.activation_dropout, self.training)
        return _project(self.fc2, hidden_states)


class VaswaniSublayer(nn.Module):
    """§3.1 / §5.4 post-LN residual wrapper: `LayerNorm(x + Dropout(Sublayer(x)))`."""

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.dropout = config.dropout
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, residual: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        dropped = apply_dropout(sublayer_output, self.dropout, self.training)  # = nn.functional.dropout(...)
        return self.layer_norm(residual + dropped)


class VaswaniEncoderLayer(GradientCheckpointingLayer):
    """§3.1 encoder layer: self-attention, then the feed-forward network, each wrapped post-LN.

    A `GradientCheckpointingLayer`: after `model.activation_checkpointing_enable()` (`gradient_checkpointing_enable()`
    before transformers 5.23), or the Trainer's `--gradient_checkpointing true`, training keeps only each layer's
    input and computes the layer again in the backward pass (same dropout masks: the RNG state is replayed).
    """

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.self_attn = VaswaniAttention(config, is_causal=False)
        self.self_attn_sublayer = VaswaniSublayer(config)
        self.ffn = VaswaniFeedForward(config)
        self.ffn_sublayer = VaswaniSublayer(config)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, weights = self.self_attn(hidden_states, attention_mask, output_attentions=output_attentions)
        hidden_states = self.self_attn_sublayer(hidden_states, attended)
        hidden_states = self.ffn_sublayer(hidden_states, self.ffn(hidden_states))
        return hidden_states, weights


class VaswaniDecoderLayer(GradientCheckpointingLayer):
    """§3.1 decoder layer: masked self-attention, encoder-decoder attention, feed-forward; each wrapped post-LN.

    Checkpointed like `VaswaniEncoderLayer`; the decoder then trains without a KV cache (a replayed layer would
    write it twice).
    """

    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__()
        self.self_attn = VaswaniAttention(config, is_causal=True, layer_idx=layer_idx)
        self.self_attn_sublayer = VaswaniSublayer(config)
        self.cross_attn = VaswaniAttention(config, is_causal=False, layer_idx=layer_idx)
        self.cross_attn_sublayer = VaswaniSublayer(config)
        self.ffn = VaswaniFeedForward(config)
        self.ffn_sublayer = VaswaniSublayer(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        self_attention_mask: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor,
        cross_attention_mask: torch.Tensor | None,
        cache: Cache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        attended, self_weights = self.self_attn(
            hidden_states, self_attention_mask, cache=cache, output_attentions=output_attentions
        )
        hidden_states = self.self_attn_sublayer(hidden_states, attended)
        attended, cross_weights = self.cross_attn(
            hidden_states,
            cross_attention_mask,
            key_value_states=encoder_hidden_states,
            cache=cache,
            output_attentions=output_attentions,
        )
        hidden_states = self.cross_attn_sublayer(hidden_states, attended)
        hidden_states = self.ffn_sublayer(hidden_states, self.ffn(hidden_states))
        return hidden_states, self_weights, cross_weights


class VaswaniPreTrainedModel(PreTrainedModel):
    config: VaswaniConfig
    config_class = VaswaniConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _supports_sdpa = True
    _supports_attention_backend = True
    supports_gradient_checkpointing = True
    _no_split_modules = ["VaswaniEncoderLayer", "VaswaniDecoderLayer"]

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Saves as a Hub-ready folder: safetensors weights (the shared matrix once), config.json whose `auto_map`
        names AutoConfig, AutoModel and AutoModelForSeq2SeqLM and whose `custom_pipelines` names the translation
        pipeline, generation_config.json, and the code files: this one and those it imports relatively
        (configuration_vaswani.py, fast_paths_vaswani.py, pipeline_vaswani.py), which transformers'
        `custom_object_save` copies."""
        self.config.auto_map = dict(_AUTO_MAP)
        self.config.custom_pipelines = {task: dict(info) for task, info in CUSTOM_PIPELINES.items()}
        return super().save_pretrained(save_directory, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.init_std
        if isinstance(module, nn.Embedding):
            # Embeddings are multiplied by sqrt(d_model) (§3.4), so they start at unit scale: N(0, d_model^-0.5).
            init.normal_(module.weight, mean=0.0, std=std if std is not None else self.config.d_model**-0.5)
        elif isinstance(module, nn.Linear):
            if std is None:
                init.xavier_uniform_(module.weight)
            else:
                init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


class _VaswaniStack(nn.Module):
    """What both stacks share: token embedding x sqrt(d_model) plus positional encoding, then dropout (§3.4, §3.5)."""

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.config = config
        self.dropout = config.dropout  # P_drop after the embedding sums; training.set_dropout may change it
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.embed_scale = math.sqrt(config.d_model)
        self.embed_positions = (
            nn.Embedding(config.max_position_embeddings, config.d_model)
            if config.position_encoding == "learned"
            else None
        )
        # The sinusoids of the positions seen so far, computed on first use (not a buffer: nothing to save or load).
        self._position_table: torch.Tensor | None = None

    def _sinusoids(self, start: int, length: int, like: torch.Tensor) -> torch.Tensor:
        """Rows `start .. start + length - 1` of the §3.5 table: the same values as `sinusoidal_position_encoding`,
        computed once instead of at every step of decoding."""
        table = self._position_table
        if table is None or table.shape[0] < start + length or table.device != like.device or table.dtype != like.dtype:
            size = max(start + length, 256, 0 if table is None else 2 * table.shape[0])
            positions = torch.arange(size, device=like.device)
            table = self._position_table = sinusoidal_position_encoding(positions, self.config.d_model, like.dtype)
        return table[start : start + length]

    def embed(self, input_ids: torch.Tensor, past_length: int = 0) -> torch.Tensor:
        length = input_ids.shape[1]
        if past_length + length > self.config.max_position_embeddings and self.embed_positions is not None:
            raise ValueError(
                f"sequence of {past_length + length} positions is longer than the learned positional encoding "
                f"(max_position_embeddings={self.config.max_position_embeddings})"
            )
        embeddings = self.embed_tokens(input_ids) * self.embed_scale
        if self.embed_positions is not None:
            positions = torch.arange(past_length, past_length + length, device=input_ids.device)
            embeddings = embeddings + self.embed_positions(positions)
        else:
            embeddings = embeddings + self._sinusoids(past_length, length, embeddings)
        return apply_dropout(embeddings, self.dropout, self.training)  # = nn.functional.dropout(embeddings, ...)


class VaswaniEncoder(_VaswaniStack):
    """§3.1 encoder: N identical layers; no LayerNorm after the last one (post-LN)."""

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.layers = nn.ModuleList([VaswaniEncoderLayer(config) for _ in range(config.num_encoder_layers)])

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = True,
        **kwargs,
    ) -> BaseModelOutput:
        hidden_states = self.embed(input_ids)
        # Padding is masked in every attention; the encoder is never causal.
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask)
        all_hidden = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layers:
            hidden_states, weights = layer(hidden_states, mask, output_attentions=output_attentions)
            if output_hidden_states:
                all_hidden += (hidden_states,)
            if output_attentions:
                all_attentions += (weights,)
        return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden, attentions=all_attentions)


class VaswaniDecoder(_VaswaniStack):
    """§3.1 decoder: N identical layers with masked self-attention and attention over the encoder output."""

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.layers = nn.ModuleList([VaswaniDecoderLayer(config, i) for i in range(config.num_decoder_layers)])

    def _checkpointing(self) -> bool:
        return any(layer.gradient_checkpointing for layer in self.layers)

    def forward(
        self,
        input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> tuple:
        if use_cache and self.training and torch.is_grad_enabled() and self._checkpointing():
            logger.warning_once("use_cache=True does not go with activation checkpointing: training without the cache")
            use_cache, cache = False, None
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        hidden_states = self.embed(input_ids, past_length)
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        if attention_mask is None:
            attention_mask = torch.ones(
                input_ids.shape[0], past_length + input_ids.shape[1], dtype=torch.long, device=input_ids.device
            )
        # §3.2.3: each position attends to itself and earlier positions only.
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            **{_CACHE_MASK_ARG: self_cache},
        )
        cross_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        all_hidden = (hidden_states,) if output_hidden_states else None
        self_attentions = () if output_attentions else None
        cross_attentions = () if output_attentions else None
        for layer in self.layers:
            hidden_states, self_weights, cross_weights = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,
                cross_mask,
                cache=cache if use_cache else None,
                output_attentions=output_attentions,
            )
            if output_hidden_states:
                all_hidden += (hidden_states,)
            if output_attentions:
                self_attentions += (self_weights,)
                cross_attentions += (cross_weights,)
        return hidden_states, (cache if use_cache else None), all_hidden, self_attentions, cross_attentions


class VaswaniModel(VaswaniPreTrainedModel):
    """The encoder-decoder of Figure 1, returning the decoder's last hidden states.

    `shared` is the one embedding matrix of §3.4; the encoder's and decoder's `embed_tokens` are tied to it.
    """

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = VaswaniEncoder(config)
        self.decoder = VaswaniDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        self.encoder.embed_tokens = value
        self.decoder.embed_tokens = value

    def get_encoder(self, modality: str | None = None) -> VaswaniEncoder:
        return self.encoder

    def get_decoder(self) -> VaswaniDecoder:
        return self.decoder

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        output_attentions = bool(output_attentions if output_attentions is not None else self.config.output_attentions)
        output_hidden_states = bool(
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = bool(use_cache if use_cache is not None else (self.config.use_cache and not self.training))
        cache = _one_cache(cache, past_key_values)
        if encoder_outputs is None:
            if input_ids is None:
                raise ValueError("pass input_ids (the source sentence) or encoder_outputs")
            encoder_outputs = self.encoder(
                input_ids,
                attention_mask=attention_mask,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        if decoder_input_ids is None:
            raise ValueError("pass decoder_input_ids, or labels to VaswaniForConditionalGeneration")
        hidden, cache, dec_hidden, dec_attentions, cross_attentions = self.decoder(
            decoder_input_ids,
            encoder_outputs.last_hidden_state,
            attention_mask=decoder_attention_mask,
            encoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=hidden,
            **{_CACHE_OUTPUT_FIELD: cache},
            decoder_hidden_states=dec_hidden,
            decoder_attentions=dec_attentions,
            cross_attentions=cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: the decoder input is the target shifted right by one, starting with the start token."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


# §6.1's search, the generation config every new model starts with: beam size 4, GNMT length penalty alpha 0.6,
# at most max_len_a * |X| + max_len_b output tokens (fairseq's names) = input length + 50.
PAPER_SEARCH = {"num_beams": 4, "length_penalty": 0.6, "max_len_a": 1, "max_len_b": 50}


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """§6.1 and Wu et al. (2016): `lp(Y) = ((5 + |Y|) / (5 + 1))^alpha`; beam scores are `log P(Y|X) / lp(Y)`."""
    return ((5.0 + length) / 6.0) ** alpha


class PerSentenceMaxLength(LogitsProcessor):
    """§6.1 "maximum output length = input length + 50": each sentence stops at its own `a * |X| + b` tokens.

    At a sentence's last allowed step only EOS stays possible. Its score is left as the model's own
    log-probability, so beam scores remain true `log P(Y|X)`.
    """

    def __init__(self, max_lengths: torch.Tensor, eos_token_id: int):
        self.max_lengths = max_lengths  # generated tokens allowed per sentence, EOS included
        self.eos_token_id = eos_token_id
        self.prompt_length: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        generated = input_ids.shape[1] - self.prompt_length
        limits = self.max_lengths.to(scores.device).repeat_interleave(scores.shape[0] // self.max_lengths.shape[0])
        at_limit = generated + 1 >= limits
        if at_limit.any():
            eos_scores = scores[:, self.eos_token_id].clone()
            scores = scores.masked_fill(at_limit[:, None], -float("inf"))
            scores[:, self.eos_token_id] = torch.where(at_limit, eos_scores, scores[:, self.eos_token_id])
        return scores


class VaswaniForConditionalGeneration(VaswaniPreTrainedModel, GenerationMixin):
    """The Transformer for translation: the encoder-decoder plus the pre-softmax projection tied to the shared
    embedding (§3.4), with the label-smoothed loss (§5.4) and the paper's beam search from `generate()` (§6.1)."""

    _tied_weights_keys = {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        # §6.1: beam size 4, length penalty alpha = 0.6 (GNMT formula, see `_update_finished_beams`), maximum
        # output length = input length + 50 (fairseq's names: max_len_a * |X| + max_len_b), terminating early when
        # no running hypothesis can still beat the finished ones.
        for key, value in PAPER_SEARCH.items():
            setattr(self.generation_config, key, value)
        self.generation_config.early_stopping = "never"
        # These are our own settings, not copies of the model config: without this, loading drops max_len_a/b.
        self.generation_config._from_model_config = False

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def get_encoder(self, modality: str | None = None) -> VaswaniEncoder:
        return self.model.encoder

    def get_decoder(self) -> VaswaniDecoder:
        return self.model.decoder

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch, target_length)`, *optional*):
            Target token ids ending in EOS; -100 and the pad id are ignored. The decoder input is built from them
            by `shift_tokens_right` when `decoder_input_ids` is not given.
        num_items_in_batch (`int`, *optional*):
            Number of target tokens in the whole optimizer step (all accumulation micro-batches, all processes).
            Given by `Trainer`; the loss is then `sum / num_items_in_batch`, so that gradient accumulation and
            DDP give the gradient of the global mean. Without it, the loss is the mean over this batch's tokens.

        In training mode with `labels` (and gradients enabled) only the loss is computed, on the real target tokens,
        and `logits` is `None`; in eval mode, or without labels, the logits are returned as usual.
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            past_key_values=past_key_values,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        if labels is not None and self.training and torch.is_grad_enabled():
            # Training needs the loss only: it is computed on real target tokens without keeping the logits.
            logits, loss = None, self._training_loss(outputs.last_hidden_state, labels, num_items_in_batch)
        else:
            logits = _project(self.lm_head, outputs.last_hidden_state)  # = self.lm_head(last_hidden_state)
            loss = self.loss(logits, labels, num_items_in_batch) if labels is not None else None
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{_CACHE_OUTPUT_FIELD: getattr(outputs, _CACHE_OUTPUT_FIELD)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def loss(
        self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """§5.4 label-smoothed cross-entropy: the target distribution is `(1 - eps) * one_hot + eps / V`.

        Positions labelled -100 or with the pad id are ignored.
        """
        labels = labels.to(logits.device).masked_fill(labels == self.config.pad_token_id, -100)
        total = nn.functional.cross_entropy(
            logits.float().view(-1, logits.shape[-1]),
            labels.view(-1),
            ignore_index=-100,
            reduction="sum",
            label_smoothing=self.config.label_smoothing,
        )
        if num_items_in_batch is None:
            num_items_in_batch = labels.ne(-100).sum().clamp(min=1)
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    def _training_loss(
        self, hidden_states: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None
    ) -> torch.Tensor:
        """The same value as `loss(lm_head(hidden_states), labels, num_items_in_batch)`, computed only for real target
        tokens and without vocabulary-sized tensors beyond one chunk (`projected_label_smoothed_cross_entropy`)."""
        labels = labels.to(hidden_states.device).masked_fill(labels == self.config.pad_token_id, -100)
        real = labels.ne(-100)
        if num_items_in_batch is None:
            num_items_in_batch = real.sum().clamp(min=1)
        # = self.loss(self.lm_head(hidden_states), labels, num_items_in_batch), without keeping the logits
        return projected_label_smoothed_cross_entropy(
            hidden_states[real],
            self.lm_head.weight,
            labels[real],
            float(self.config.label_smoothing),
            1.0 / float(num_items_in_batch),
        )

    # ----- Generation: the paper's beam search (§6.1) -----

    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, logits_processor=None, **kwargs):
        """`GenerationMixin.generate` with the paper's defaults: 4 beams, GNMT length penalty with alpha 0.6 and a
        maximum output length of each sentence's own input length + 50.

        The per-sentence limit `max_len_a * |X| + max_len_b` (fairseq's names; the generation config holds a=1,
        b=50) applies unless `max_length` or `max_new_tokens` is given explicitly.
        """
        gen_config = generation_config if generation_config is not None else self.generation_config
        max_len_a = kwargs.pop("max_len_a", getattr(gen_config, "max_len_a", None))
        max_len_b = kwargs.pop("max_len_b", getattr(gen_config, "max_len_b", None))
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        explicit_length = "max_length" in kwargs or "max_new_tokens" in kwargs
        if generation_config is not None and generation_config.max_new_tokens is not None:
            explicit_length = True
        if max_len_b is not None and not explicit_length and input_ids is not None:
            mask = kwargs.get("attention_mask")
            source_lengths = mask.sum(-1) if mask is not None else input_ids.ne(self.config.pad_token_id).sum(-1)
            limits = (float(max_len_a or 0) * source_lengths + max_len_b).long().clamp(min=1)
            kwargs["max_new_tokens"] = int(limits.max())
            eos = gen_config.eos_token_id if gen_config.eos_token_id is not None else self.config.eos_token_id
            eos = eos[0] if isinstance(eos, list) else eos
            logits_processor = LogitsProcessorList(list(logits_processor or []))
            logits_processor.append(PerSentenceMaxLength(limits, eos))
        return super().generate(
            inputs, generation_config=generation_config, logits_processor=logits_processor, **kwargs
        )

    def _reorder_cache(self, cache: Cache, beam_idx: torch.Tensor) -> Cache:
        """Beam search's reordering after each step, for self-attention only: every beam of a sentence holds the
        same encoder-decoder attention keys and values (beams only move within their sentence), so reordering
        those would copy the whole encoder cache at every step for nothing."""
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache

    def _update_finished_beams(self, **kwargs):
        """Scores finished hypotheses with the GNMT penalty `log P(Y|X) / ((5 + |Y|) / 6)^alpha` (§6.1) instead of
        transformers' `log P(Y|X) / |Y|^alpha`. |Y| counts generated tokens with the final EOS and without the
        decoder start token."""
        # transformers passes every argument by keyword (generation/utils.py, `_beam_search`).
        length = kwargs["cur_len"] + 1 - kwargs["decoder_prompt_len"]
        kwargs["topk_log_probs"] = kwargs["topk_log_probs"] / gnmt_length_penalty(length, kwargs["length_penalty"])
        kwargs["length_penalty"] = 0.0  # transformers then divides by |Y|^0 = 1
        return super()._update_finished_beams(**kwargs)

    @staticmethod
    def _check_early_stop_heuristic(
        is_early_stop_heuristic_unsatisfied: torch.Tensor,
        running_beam_scores: torch.Tensor,
        beam_scores: torch.Tensor,
        is_sent_finished: torch.Tensor,
        cur_len: int,
        max_length: int,
        decoder_prompt_len: int,
        early_stopping: bool | str,
        length_penalty: float,
    ) -> torch.Tensor:
        """Early termination (§6.1) with the GNMT penalty: a sentence is done when even the best running hypothesis,
        scored with the largest penalty it could still reach, cannot beat the worst finished one (tensor2tensor's
        bound; exact with `early_stopping="never"`)."""
        if early_stopping == "never" and length_penalty > 0.0:
            best_length = max_length - decoder_prompt_len
        else:
            best_length = cur_len - decoder_prompt_len
        best_running = running_beam_scores[:, :1] / gnmt_length_penalty(best_length, length_penalty)
        worst_finished = torch.where(is_sent_finished, torch.min(beam_scores, dim=1, keepdim=True)[0], -1.0e9)
        return is_early_stop_heuristic_unsatisfied & torch.any(best_running > worst_finished, dim=-1, keepdim=True)


VaswaniConfig.register_for_auto_class("AutoConfig")
VaswaniModel.register_for_auto_class("AutoModel")
VaswaniForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


__all__ = [
    "PAPER_SEARCH",
    "PerSentenceMaxLength",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "gnmt_length_penalty",
    "shift_tokens_right",
    "sinusoidal_position_encoding",
]
