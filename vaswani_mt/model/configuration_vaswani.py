"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Self-contained (transformers only) so that `save_pretrained` can copy it as Hub remote code.
"""

import math
from typing import Any, ClassVar, Literal

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

# Table 3's "base" and "big", a "tiny" shape for tests and two CPU shapes, "small" and "mini" (without dropout: it
# learns faster so in a float32 CPU's half hour, benchmarks/RESULTS.md). Values not named take the base model's.
PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(d_model=512, d_ff=2048, num_heads=8, num_encoder_layers=6, num_decoder_layers=6, dropout=0.1),
    "big": dict(d_model=1024, d_ff=4096, num_heads=16, num_encoder_layers=6, num_decoder_layers=6, dropout=0.3),
    "small": dict(d_model=256, d_ff=1024, num_heads=4, num_encoder_layers=3, num_decoder_layers=3, dropout=0.1),
    "mini": dict(d_model=128, d_ff=512, num_heads=4, num_encoder_layers=3, num_decoder_layers=3, dropout=0.0),
    "tiny": dict(
        vocab_size=1000, d_model=32, d_ff=64, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, dropout=0.1
    ),
}

_SIZES = ("vocab_size", "d_model", "d_ff", "num_heads", "d_k", "d_v", "num_encoder_layers", "num_decoder_layers",
          "max_position_embeddings")  # fmt: skip
_RATES = ("dropout", "attention_dropout", "activation_dropout", "label_smoothing")
_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")


@strict
class VaswaniConfig(PreTrainedConfig):
    r"""
    Configuration of [`VaswaniModel`] and [`VaswaniForConditionalGeneration`]. The defaults are the paper's base
    model (Table 3, first row); [`VaswaniConfig.from_preset`] gives "base", "big", "small", "mini" and "tiny".
    Checked as transformers 5 checks its configs (`@strict`): a value of the wrong type is refused when it is set,
    an impossible one (a size that is not positive, a rate outside [0, 1), ...) when the config is built or saved;
    both errors name the field and the value.

    Args:
        vocab_size (`int`, defaults to 37000):
            Size of the one BPE vocabulary shared by source and target (§5.1).
        d_model (`int`, defaults to 512):
            Width of every sub-layer output and of the embeddings, `d_model` (§3.1).
        d_ff (`int`, defaults to 2048):
            Inner size of the position-wise feed-forward network, `d_ff` (§3.3).
        num_heads (`int`, defaults to 8):
            Number of attention heads, `h` (§3.2.2).
        d_k (`int`, *optional*):
            Size of queries and keys per head, `d_k`; defaults to `d_model / h`. Table 3 rows A and B vary it freely.
        d_v (`int`, *optional*):
            Size of values per head, `d_v`; defaults to `d_model / h`.
        num_encoder_layers (`int`, defaults to 6):
            Number of layers `N` in the encoder stack (§3.1).
        num_decoder_layers (`int`, defaults to 6):
            Number of layers `N` in the decoder stack (§3.1).
        dropout (`float`, defaults to 0.1):
            `P_drop` (§5.4): applied to the sums of embeddings and positional encodings and to every sub-layer
            output before the residual add and normalization.
        attention_dropout (`float`, defaults to 0.0):
            Dropout on attention weights. The paper names none.
        activation_dropout (`float`, defaults to 0.0):
            Dropout after the ReLU inside the feed-forward network. The paper names none.
        position_encoding (`str`, defaults to `"sinusoidal"`):
            `"sinusoidal"` (§3.5) or `"learned"` (Table 3 row E).
        max_position_embeddings (`int`, defaults to 1024):
            Positions of the learned encoding; with sinusoids, the longest input the model is meant to see.
        layer_norm_eps (`float`, defaults to 1e-6):
            Epsilon of every LayerNorm (tensor2tensor's value).
        attention_bias (`bool`, defaults to `False`):
            Whether the Q, K, V and output projections have biases (the paper writes plain matrices).
        activation_function (`str`, defaults to `"relu"`):
            The FFN's non-linearity (§3.3: `max(0, .)`, ReLU). `"swish"` (= `"silu"`) and `"gelu"` are there for
            imported checkpoints (OPUS-MT's opus-mt-en-de uses swish: `export.marian.from_marian`).
        logits_bias (`bool`, defaults to `False`):
            Whether a bias, not trained (a buffer, as Marian's `final_logits_bias`), is added to the pre-softmax
            logits. The paper has none (§3.4); OPUS-MT checkpoints do.
        init_std (`float`, *optional*):
            If set, every weight is initialised from N(0, init_std); if `None`, embeddings from N(0, d_model^-0.5)
            (as tensor2tensor and fairseq, since they are scaled by sqrt(d_model)) and linear weights Xavier-uniform.
        label_smoothing (`float`, defaults to 0.1):
            `epsilon_ls` of the training loss (§5.4).
        pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id (`int`):
            Special tokens, in fairseq's order: `<s>`=0, `<pad>`=1, `</s>`=2 (`<unk>`=3 lives in the tokenizer).
            The decoder starts from `<s>`.
        tie_word_embeddings (`bool`, defaults to `True`):
            The source and target embeddings and the pre-softmax projection are one matrix (§3.4); must be `True`.
        alignment_head (`list[int]`, *optional*):
            `[layer, head]`: the decoder layer (from 0) and head of the encoder-decoder attention trained to align
            (Garg et al. 2019, `--alignment_supervision`); `None` for a model trained without alignment labels.
    """

    model_type = "vaswani_mt"
    # The KV cache is not a prediction; transformers >= 5.24 names it `cache`, earlier versions `past_key_values`.
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["cache", "past_key_values"]
    attribute_map: ClassVar[dict[str, str]] = {
        "hidden_size": "d_model",
        "num_attention_heads": "num_heads",
        "num_hidden_layers": "num_encoder_layers",
        "intermediate_size": "d_ff",
    }

    vocab_size: int = 37000
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    d_k: int | None = None
    d_v: int | None = None
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    position_encoding: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_position_embeddings: int = 1024
    layer_norm_eps: float | int = 1e-6
    attention_bias: bool = False
    activation_function: Literal["relu", "swish", "silu", "gelu"] = "relu"
    logits_bias: bool = False
    init_std: float | int | None = None
    label_smoothing: float | int = 0.1
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 0
    tie_word_embeddings: bool = True
    alignment_head: list[int] | None = None
    is_encoder_decoder: bool = True
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        # transformers runs `validate()` only when a config is saved; the model must not be built from one it refuses.
        self.validate()
        if self.d_k is None:
            self.d_k = self.d_model // self.num_heads
        if self.d_v is None:
            self.d_v = self.d_model // self.num_heads

    def validate_sizes(self):
        for name in _SIZES:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads}) unless d_k and d_v are "
                "both given"
            )

    def validate_rates(self):
        for name in _RATES:
            if not 0.0 <= (value := getattr(self, name)) < 1.0:  # NaN too
                raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")

    def validate_scales(self):
        if not (self.layer_norm_eps > 0 and math.isfinite(self.layer_norm_eps)):
            raise ValueError(f"layer_norm_eps must be a positive number, got {self.layer_norm_eps!r}")
        if self.init_std is not None and not 0 < self.init_std < math.inf:
            raise ValueError(f"init_std must be a positive number or None, got {self.init_std!r}")

    def validate_shared_embeddings(self):
        if not self.tie_word_embeddings:
            raise ValueError(
                "tie_word_embeddings must be True: the source embedding, target embedding and pre-softmax "
                "projection share one matrix (§3.4)"
            )

    def validate_token_ids(self):
        # Stricter than transformers' own check, which only warns: an id outside the vocabulary cannot be embedded.
        for name in _TOKENS:
            value = getattr(self, name)
            ids = value if isinstance(value, list) else [value]
            if value == [] or any(token is not None and not 0 <= token < self.vocab_size for token in ids):
                raise ValueError(f"{name} must be an integer in [0, vocab_size={self.vocab_size}), got {value!r}")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "VaswaniConfig":
        """Builds a config from a named preset ("base", "big", "small", "mini", "tiny"); keyword arguments override it.

        >>> VaswaniConfig.from_preset("big", vocab_size=37000).d_model
        1024
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


__all__ = ["PRESETS", "VaswaniConfig"]
