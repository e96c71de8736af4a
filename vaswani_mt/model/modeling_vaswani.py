"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers model.

Reads top to bottom like Figure 1: positional encoding (§3.5), attention (§3.2), feed-forward (§3.3), the
post-LN encoder and decoder layers (§3.1), the two stacks, the encoder-decoder, and the model with the tied
pre-softmax projection (§3.4) and its label-smoothed loss (§5.4).

The paper's beam search (§6.1) lives in beam_search_vaswani.py; faster equivalents of plain operations in
fast_paths_vaswani.py, where a comment here gives the plain computation. Self-contained (torch, transformers and
those sibling files, imported relatively) so that `save_pretrained` copies it as Hub remote code.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import can_return_tuple, logging
from transformers.utils.deprecation import deprecate_kwarg

from .configuration_vaswani import VaswaniConfig
from .fast_paths_vaswani import (
    _project,
    apply_dropout,
    chunked_label_smoothed_cross_entropy,
    projected_label_smoothed_cross_entropy,
)
from .generation_vaswani import VaswaniGenerationMixin

logger = logging.get_logger(__name__)

# transformers 5.24 renamed the KV cache from `past_key_values` to `cache`: `forward` takes `cache` and writes the
# name the installed version reads (5.20+); `past_key_values=` is renamed, with in-tree models' FutureWarning from
# 5.24, silently before it, where `generate()` still passes that name.
_CACHE_RENAMED = "cache" in Seq2SeqLMOutput.__dataclass_fields__
_CACHE_OUTPUT_FIELD = "cache" if _CACHE_RENAMED else "past_key_values"
_CACHE_MASK_ARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
_accept_past_key_values = deprecate_kwarg(
    "past_key_values", "5.40.0" if _CACHE_RENAMED else "5.0.0", new_name="cache", raise_if_both_names=True
)

# The Auto classes a saved folder names, so that it loads as Hub remote code with `trust_remote_code=True`.
_AUTO_MAP = {
    "AutoConfig": "configuration_vaswani.VaswaniConfig",
    "AutoModel": "modeling_vaswani.VaswaniModel",
    "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
}
# The pipeline config.json names (`custom_pipelines`, as `Pipeline.save_pretrained` writes it), so that
# `pipeline("translation", model=folder, trust_remote_code=True)` finds it.
_PIPELINE_FILE = "pipeline_vaswani.py"
_CUSTOM_PIPELINES = {
    "translation": {"impl": "pipeline_vaswani.TranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}
}


def sinusoidal_position_encoding(positions: torch.Tensor, d_model: int, dtype: torch.dtype) -> torch.Tensor:
    """§3.5: `PE(pos, 2i) = sin(pos / 10000^(2i/d_model))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))`.

    Sines and cosines interleaved as in the formula; computed in float64, not stored, so it is exact after
    `from_pretrained` (which builds the model on the meta device).
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
        # `_project(linear, x)` is `linear(x)`; CPU float32 inference runs it through a prepacked weight.
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
    """§3.3: `FFN(x) = max(0, x W1 + b1) W2 + b2`; another activation only where an imported checkpoint has one."""

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.activation_dropout = config.activation_dropout
        name = config.activation_function
        self.activation = nn.functional.relu if name == "relu" else ACT2FN[name]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # = self.fc2(F.dropout(relu(self.fc1(x)))), through the fast paths `_project` and `apply_dropout`.
        hidden_states = self.activation(_project(self.fc1, hidden_states))
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

    A `GradientCheckpointingLayer`: with activation checkpointing on, training keeps only each layer's input and
    computes the layer again in the backward pass (same dropout masks: the RNG state is replayed).
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

    Checkpointed like `VaswaniEncoderLayer`, then without a KV cache (a replayed layer would write it twice).
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

    def save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
        """Saves as a Hub-ready folder: weights, config.json whose `auto_map` names the Auto classes, the generation
        config, the code files this one imports relatively and the translation pipeline, which transformers copies
        only for a saved pipeline object (config.json names none where `_pipeline_source()` finds none). With
        `push_to_hub=True` the folder is uploaded once complete, pipeline included.
        """
        self.config.auto_map = dict(_AUTO_MAP)
        pipeline = self._pipeline_source()
        if pipeline is not None:
            self.config.custom_pipelines = {task: dict(info) for task, info in _CUSTOM_PIPELINES.items()}
        elif hasattr(self.config, "custom_pipelines"):  # loaded from a folder that named it
            del self.config.custom_pipelines
        result = super().save_pretrained(save_directory, *args, **kwargs)
        is_main_process = args[0] if args else kwargs.get("is_main_process", True)
        if pipeline is not None and is_main_process and Path(save_directory).is_dir():
            (Path(save_directory) / _PIPELINE_FILE).write_bytes(pipeline.read_bytes())
        if push_to_hub and is_main_process:
            hub = {key: kwargs[key] for key in ("commit_message", "create_pr", "private", "token") if key in kwargs}
            self.push_to_hub(kwargs.get("repo_id", Path(save_directory).name), **hub)
        return result

    def _pipeline_source(self) -> Path | None:
        """The pipeline_vaswani.py to ship: the file next to this one (for remote code, in transformers' module
        cache), else the one in the local folder the model was loaded from; None if there is none."""
        folders = [Path(__file__).parent]
        loaded_from = getattr(self.config, "_name_or_path", None)
        if loaded_from and Path(loaded_from).is_dir():
            folders.append(Path(loaded_from))
        return next((folder / _PIPELINE_FILE for folder in folders if (folder / _PIPELINE_FILE).is_file()), None)

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
        if getattr(module, "final_logits_bias", None) is not None:  # the model itself, with a logits bias
            init.zeros_(module.final_logits_bias)


class _VaswaniStack(nn.Module):
    """What both stacks share: token embedding x sqrt(d_model) plus positional encoding, then dropout (§3.4, §3.5)."""

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.config = config
        self.dropout = config.dropout  # §5.4: P_drop on the sums of embeddings and positional encodings
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
        if torch.compiler.is_compiling():  # in the graph (fused, cheap), not a cache whose first fill would recompile
            positions = torch.arange(start, start + length, device=like.device)
            return sinusoidal_position_encoding(positions, self.config.d_model, like.dtype)
        table = self._position_table
        if table is None or table.shape[0] < start + length or table.device != like.device or table.dtype != like.dtype:
            size = max(start + length, 256, 0 if table is None else 2 * table.shape[0])
            positions = torch.arange(size, device=like.device)
            table = self._position_table = sinusoidal_position_encoding(positions, self.config.d_model, like.dtype)
        return table[start : start + length]

    def embed(
        self, input_ids: torch.Tensor | None, past_length: int = 0, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`Dropout(E[x] * sqrt(d_model) + PE)` for token ids `x`, or for `inputs_embeds` given in place of `E[x]`."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass the tokens as ids or as embeddings (inputs_embeds), exactly one of them")
        length = (input_ids if inputs_embeds is None else inputs_embeds).shape[1]
        if past_length + length > self.config.max_position_embeddings and self.embed_positions is not None:
            raise ValueError(
                f"sequence of {past_length + length} positions is longer than the learned positional encoding "
                f"(max_position_embeddings={self.config.max_position_embeddings})"
            )
        embeddings = (self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds) * self.embed_scale
        if self.embed_positions is not None:
            positions = torch.arange(past_length, past_length + length, device=embeddings.device)
            embeddings = embeddings + self.embed_positions(positions)
        else:
            embeddings = embeddings + self._sinusoids(past_length, length, embeddings)
        return apply_dropout(embeddings, self.dropout, self.training)  # = nn.functional.dropout(embeddings, ...)


class VaswaniEncoder(_VaswaniStack):
    """§3.1 encoder: N identical layers; no LayerNorm after the last one (post-LN)."""

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.layers = nn.ModuleList([VaswaniEncoderLayer(config) for _ in range(config.num_encoder_layers)])

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        hidden_states = self.embed(input_ids, inputs_embeds=inputs_embeds)
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
        input_ids: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        inputs_embeds: torch.Tensor | None = None,
    ) -> tuple:
        if use_cache and self.training and torch.is_grad_enabled() and self._checkpointing():
            logger.warning_once("use_cache=True does not go with activation checkpointing: training without the cache")
            use_cache, cache = False, None
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        hidden_states = self.embed(input_ids, past_length, inputs_embeds=inputs_embeds)
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        if attention_mask is None:
            batch, length = hidden_states.shape[:2]
            attention_mask = torch.ones(batch, past_length + length, dtype=torch.long, device=hidden_states.device)
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
    """The encoder-decoder of Figure 1, returning the decoder's last hidden states; `shared` is the one embedding
    matrix of §3.4, to which the encoder's and decoder's `embed_tokens` are tied."""

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

    @can_return_tuple
    @_accept_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        r"""
        inputs_embeds, decoder_inputs_embeds (`torch.Tensor` of shape `(batch, length, d_model)`, *optional*):
            Token embeddings in place of `input_ids` / `decoder_input_ids`, as `get_input_embeddings()` gives them:
            they are scaled by sqrt(d_model) and added to the positional encoding as the ids' would be (§3.4, §3.5).
        """
        output_attentions = bool(output_attentions if output_attentions is not None else self.config.output_attentions)
        output_hidden_states = bool(
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = bool(use_cache if use_cache is not None else (self.config.use_cache and not self.training))
        if encoder_outputs is None:
            if input_ids is None and inputs_embeds is None:
                raise ValueError("pass input_ids (the source sentence), inputs_embeds or encoder_outputs")
            encoder_outputs = self.encoder(
                input_ids,
                attention_mask=attention_mask,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
                inputs_embeds=inputs_embeds,
                return_dict=True,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            raise ValueError(
                "pass decoder_input_ids or decoder_inputs_embeds, or labels to VaswaniForConditionalGeneration"
            )
        hidden, cache, dec_hidden, dec_attentions, cross_attentions = self.decoder(
            decoder_input_ids,
            encoder_outputs.last_hidden_state,
            attention_mask=decoder_attention_mask,
            encoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            inputs_embeds=decoder_inputs_embeds,
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


class VaswaniForConditionalGeneration(VaswaniPreTrainedModel, VaswaniGenerationMixin):
    """The Transformer for translation: the encoder-decoder plus the pre-softmax projection tied to the shared
    embedding (§3.4), with the label-smoothed loss (§5.4) and the paper's beam search from `generate()` (§6.1,
    `VaswaniGenerationMixin`)."""

    _tied_weights_keys = {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }
    # The tied copies are never saved (only model.shared.weight is): Trainer's resume then ties them again
    # instead of warning that they are missing.
    _keys_to_ignore_on_save = set(_tied_weights_keys)

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.logits_bias:  # an imported checkpoint's (Marian's `final_logits_bias`); saved, never trained
            self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        self.post_init()
        self._use_paper_search()  # §6.1: beam 4, GNMT alpha 0.6, |X| + 50 (generation_vaswani.py)

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

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """transformers' resize of the one shared matrix; a logits bias is resized alike (new tokens get 0)."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if self.config.logits_bias:
            old, size = self.final_logits_bias, embeddings.weight.shape[0]
            kept = min(size, old.shape[1])
            new = old.new_zeros(1, size)
            new[:, :kept] = old[:, :kept]
            self.register_buffer("final_logits_bias", new)
        return embeddings

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @can_return_tuple
    @_accept_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch, target_length)`, *optional*):
            Target token ids ending in EOS; -100 and the pad id are ignored. The decoder input is built from them
            by `shift_tokens_right` when neither `decoder_input_ids` nor `decoder_inputs_embeds` is given.
        num_items_in_batch (`int`, *optional*):
            Number of target tokens in the whole optimizer step (all accumulation micro-batches, all processes).
            Given by `Trainer`; the loss is then `sum / num_items_in_batch`, so that gradient accumulation and
            DDP give the gradient of the global mean. Without it, the loss is the mean over this batch's tokens.
        inputs_embeds, decoder_inputs_embeds (`torch.Tensor` of shape `(batch, length, d_model)`, *optional*):
            Token embeddings in place of the ids, as in [`VaswaniModel`].

        In training mode with `labels` (and gradients enabled) only the loss is computed and `logits` is `None`.
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            return_dict=True,
        )
        if labels is not None and self.training and torch.is_grad_enabled():
            # Training needs the loss only: it is computed on real target tokens without keeping the logits.
            logits, loss = None, self._training_loss(outputs.last_hidden_state, labels, num_items_in_batch)
        else:
            logits = _project(self.lm_head, outputs.last_hidden_state)  # = self.lm_head(last_hidden_state)
            if self.config.logits_bias:
                logits = logits + self.final_logits_bias.to(logits.dtype)
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
        """§5.4 label-smoothed cross-entropy, target distribution `(1 - eps) * one_hot + eps / V`; positions
        labelled -100 or with the pad id are ignored."""
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
        _gather_sharded_projection(self.lm_head)
        bias = self.final_logits_bias[0] if self.config.logits_bias else None
        if torch.compiler.is_compiling():
            # torch.compile of the step: one graph over every position (selecting the real tokens has a data-dependent
            # shape, a graph break), in chunks whose number is fixed by the vocabulary
            dtype = torch.promote_types(hidden_states.dtype, torch.float32)
            return chunked_label_smoothed_cross_entropy(
                hidden_states.flatten(0, 1),
                self.lm_head.weight,
                labels.flatten(),
                float(self.config.label_smoothing),
                1.0 / torch.as_tensor(num_items_in_batch, dtype=dtype, device=hidden_states.device),
                bias=bias,
            )
        # = self.loss(self.lm_head(hidden_states), labels, num_items_in_batch), without keeping the logits
        return projected_label_smoothed_cross_entropy(
            hidden_states[real],
            self.lm_head.weight,
            labels[real],
            float(self.config.label_smoothing),
            1.0 / float(num_items_in_batch),
            bias=bias,
        )


def _gather_sharded_projection(lm_head: nn.Module) -> None:
    """Under FSDP2 (`fully_shard`), the pre-softmax matrix gathered before the fused loss reads it: the loss calls no
    module, so no FSDP hook gathers it there. `lm_head.weight` is the gathered tensor while the group holding it (§3.4:
    with the embedding) is unsharded; where the group was resharded before the loss (tests/fsdp_worker.py's
    `resharded`; the H200 run's `mixed torch.Tensor and DTensor`, RESULTS.md) it is the sharded DTensor, and the
    group is gathered again through FSDP's public `unshard`: its backward reduces the gradient and reshards, as for
    any group. No-op outside FSDP2."""
    if type(lm_head.weight).__name__ != "DTensor" or not hasattr(lm_head, "unshard"):
        return
    lm_head.unshard()


VaswaniConfig.register_for_auto_class("AutoConfig")
VaswaniModel.register_for_auto_class("AutoModel")
VaswaniForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


__all__ = [
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "shift_tokens_right",
    "sinusoidal_position_encoding",
]
