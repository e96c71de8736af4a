"""vaswani_mt: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers model.

Importing the package registers the config and models with AutoConfig, AutoModel and AutoModelForSeq2SeqLM.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .model import (
    PRESETS,
    VaswaniConfig,
    VaswaniForConditionalGeneration,
    VaswaniModel,
    VaswaniPreTrainedModel,
    gnmt_length_penalty,
    sinusoidal_position_encoding,
)

__version__ = "0.1.0"

AutoConfig.register(VaswaniConfig.model_type, VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)

__all__ = [
    "PRESETS",
    "VaswaniConfig",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "gnmt_length_penalty",
    "sinusoidal_position_encoding",
]
