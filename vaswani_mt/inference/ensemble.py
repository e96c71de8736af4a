"""Ensembles of vaswani_mt models (`--model A --model B`, fairseq's `--path a:b`): at every decoding step the
next-token distribution is the mean of the members' probabilities, `log (1/M) sum_m p_m(y | Y<t, X)`, searched with
the paper's beam search (§6.1) as one model is.

`VaswaniEnsemble` has the same `VaswaniGenerationMixin` as `VaswaniForConditionalGeneration`, so `generate()` drives
it like one model. Its encoder output is the members' concatenated along the feature axis; its logits are already
log-probabilities, so scores and n-best lists are the ensemble's log P(Y|X). The members must share one vocabulary.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from vaswani_mt.inference.loading import ModelFolderError, load_for_inference
from vaswani_mt.model.configuration_vaswani import VaswaniConfig
from vaswani_mt.model.generation_vaswani import VaswaniGenerationMixin
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration

# The KV cache's output field: `cache` from transformers 5.24, `past_key_values` before (as in modeling_vaswani.py).
_CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"
# Config fields that must agree for the members' token ids to mean the same tokens.
_VOCABULARY_FIELDS = ("vocab_size", "pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id")


class EnsembleCache:
    """The KV caches of an ensemble's members, in member order: each is the member's own `EncoderDecoderCache`."""

    is_compileable = False  # read by generate() before it considers torch.compile
    is_croppable = False

    def __init__(self, caches: Sequence):
        self.caches = list(caches)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.caches[0].get_seq_length(layer_idx)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for cache in self.caches:
            cache.reorder_cache(beam_idx)


def _refuse_per_member_outputs(output_attentions, output_hidden_states) -> None:
    if output_attentions or output_hidden_states:
        raise ValueError(
            "an ensemble has no attention weights or hidden states of its own (each member has its own): "
            "ask a single model for output_attentions / output_hidden_states"
        )


class _EnsembleEncoder(nn.Module):
    """Every member's encoder (§3.1) on the same source; their outputs concatenated along the feature axis."""

    main_input_name = "input_ids"

    def __init__(self, encoders: Sequence[nn.Module]):
        super().__init__()
        self.encoders = nn.ModuleList(encoders)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = False,
        output_hidden_states: bool | None = False,
        return_dict: bool | None = True,
        **kwargs,
    ) -> BaseModelOutput:
        _refuse_per_member_outputs(output_attentions, output_hidden_states)
        if inputs_embeds is not None:
            raise ValueError("an ensemble takes token ids, not inputs_embeds: each member has its own embedding")
        states = [encoder(input_ids, attention_mask=attention_mask).last_hidden_state for encoder in self.encoders]
        dtype = functools.reduce(torch.promote_types, [state.dtype for state in states])
        return BaseModelOutput(last_hidden_state=torch.cat([state.to(dtype) for state in states], dim=-1))


class VaswaniEnsemble(PreTrainedModel, VaswaniGenerationMixin):
    """Several `VaswaniForConditionalGeneration` models decoding as one, with the first model's generation config
    and the members' smallest `max_position_embeddings`. Build it with `ensemble(models)` or `load_ensemble(folders)`,
    which check that the vocabularies agree."""

    config_class = VaswaniConfig
    main_input_name = "input_ids"
    _supports_sdpa = True
    _supports_attention_backend = True

    def __init__(self, models: Sequence[VaswaniForConditionalGeneration]):
        config = copy.deepcopy(models[0].config)
        config.max_position_embeddings = min(model.config.max_position_embeddings for model in models)
        super().__init__(config)
        self.members = nn.ModuleList(models)
        self.generation_config = copy.deepcopy(models[0].generation_config)
        # No post_init(): it would initialise weights, and the members' are trained.

    def save_pretrained(self, *args, **kwargs):
        raise NotImplementedError(
            "an ensemble is not saved as one model: save its members, or average them (scripts/average_checkpoints.py)"
        )

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """generate() makes no cache: each member's decoder makes its own at the first step (`EnsembleCache`)."""
        return False

    def get_encoder(self, modality: str | None = None) -> _EnsembleEncoder:
        return _EnsembleEncoder([member.get_encoder() for member in self.members])

    def _member_states(self, encoder_outputs) -> list[torch.Tensor]:
        """Each member's encoder output, from the concatenation `_EnsembleEncoder` made (beams repeated since)."""
        state = encoder_outputs[0] if isinstance(encoder_outputs, (tuple, list)) else encoder_outputs.last_hidden_state
        widths = [member.config.d_model for member in self.members]
        if state.shape[-1] != sum(widths):
            raise ValueError(
                f"encoder_outputs of width {state.shape[-1]}, not the ensemble's {sum(widths)} (the members' "
                f"d_model, {' + '.join(map(str, widths))}): make them with the ensemble's get_encoder()"
            )
        parts = state.split(widths, dim=-1)
        return [part.to(member.dtype) for part, member in zip(parts, self.members, strict=True)]

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EnsembleCache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """One decoding step (or a whole teacher-forced target) of every member; `logits` are
        `log (1/M) sum_m softmax(logits_m)` in float32, the ensemble's next-token log-probabilities."""
        _refuse_per_member_outputs(output_attentions, output_hidden_states)
        if labels is not None:
            raise ValueError("an ensemble decodes; it has no training loss: train its members one by one")
        cache = cache if cache is not None else kwargs.pop("past_key_values", None)  # transformers before 5.24
        if encoder_outputs is None:
            encoder_outputs = self.get_encoder()(input_ids, attention_mask=attention_mask)
        states = self._member_states(encoder_outputs)
        caches = cache.caches if cache is not None else [None] * len(self.members)
        log_probs, new_caches = [], []
        for member, state, member_cache in zip(self.members, states, caches, strict=True):
            output = member(
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask,
                encoder_outputs=BaseModelOutput(last_hidden_state=state),
                cache=member_cache,
                use_cache=use_cache,
                return_dict=True,
            )
            log_probs.append(output.logits.float().log_softmax(-1))
            new_caches.append(getattr(output, _CACHE_FIELD))
        # log of the mean of the probabilities, without leaving log space: logsumexp_m(log p_m) - log M
        logits = torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(self.members))
        new_cache = EnsembleCache(new_caches) if all(c is not None for c in new_caches) else None
        output = Seq2SeqLMOutput(logits=logits, **{_CACHE_FIELD: new_cache})
        return output if return_dict is not False else output.to_tuple()

    def reorder_beam_cache(self, cache: EnsembleCache, beam_idx: torch.Tensor) -> None:
        """`VaswaniGenerationMixin.reorder_beam_cache` for every member's cache."""
        for member_cache in cache.caches:
            super().reorder_beam_cache(member_cache, beam_idx)


def _vocabulary_difference(first, other) -> str | None:
    """How two models' configs disagree on the vocabulary (size or special token ids), or None if they agree."""
    for field in _VOCABULARY_FIELDS:
        a, b = getattr(first.config, field, None), getattr(other.config, field, None)
        if a != b:
            return f"{field} is {a} and {b}"
    return None


def _tokenizer_difference(first, other) -> str | None:
    """How two tokenizers disagree (their token -> id maps, their special tokens), or None if they are the same."""
    vocab_a, vocab_b = first.get_vocab(), other.get_vocab()
    if vocab_a != vocab_b:
        if len(vocab_a) != len(vocab_b):
            return f"their tokenizers have {len(vocab_a)} and {len(vocab_b)} tokens"
        token = next(token for token in sorted(vocab_a) if vocab_a[token] != vocab_b.get(token))
        return f"their tokenizers differ (token {token!r} is {vocab_a[token]} and {vocab_b.get(token)})"
    for name in ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id"):
        a, b = getattr(first, name, None), getattr(other, name, None)
        if a != b:
            return f"their tokenizers' {name} is {a} and {b}"
    return None


def ensemble(models: Sequence[VaswaniForConditionalGeneration], names: Sequence[str] | None = None) -> VaswaniEnsemble:
    """The models as one `VaswaniEnsemble` (mean of their probabilities at each step, the first model's search).

    They must be on one device and share one vocabulary (`vocab_size` and special token ids): otherwise `ValueError`,
    one line naming the two models by `names` (default: "model 1", "model 2", ...).
    """
    models = list(models)
    if not models:
        raise ValueError("an ensemble needs at least one model")
    names = list(names) if names is not None else [f"model {i + 1}" for i in range(len(models))]
    for name, model in zip(names[1:], models[1:], strict=True):
        difference = _vocabulary_difference(models[0], model)
        if difference is not None:
            raise ValueError(f"{names[0]} and {name} cannot be ensembled: not the same vocabulary ({difference})")
        if model.device != models[0].device:
            raise ValueError(f"{names[0]} and {name} cannot be ensembled: on {models[0].device} and {model.device}")
    return VaswaniEnsemble(models).eval()


def load_ensemble(folders: Sequence[str], device: str | None = None, compute_type: str = "float32"):
    """The models saved in `folders` (folders or Hub ids) as one ensemble, and the tokenizer they share, on `device`
    (default: GPU if there is one), each member with `compute_type` (`load_for_inference`). One folder gives that
    model itself. A folder that is not a servable model, or two whose vocabularies differ, raises `ModelFolderError`
    in one line naming the folders.
    """
    folders = [str(folder) for folder in folders]
    if not folders:
        raise ModelFolderError("an ensemble needs at least one model folder")
    first, tokenizer = load_for_inference(folders[0], device=device, compute_type=compute_type)
    if len(folders) == 1:
        return first, tokenizer
    models = [first]
    for folder in folders[1:]:
        model, other = load_for_inference(folder, device=device, compute_type=compute_type)
        difference = _tokenizer_difference(tokenizer, other) or _vocabulary_difference(first, model)
        if difference is not None:
            raise ModelFolderError(
                f"{folders[0]} and {folder} cannot be ensembled: not the same vocabulary ({difference})"
            )
        models.append(model)
    return ensemble(models, names=folders), tokenizer


__all__ = ["EnsembleCache", "VaswaniEnsemble", "ensemble", "load_ensemble"]
