"""vaswani_mt: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers model.

Importing the package registers the config and models with AutoConfig, AutoModel and AutoModelForSeq2SeqLM, and
does nothing else: the subpackages (data, training, evaluation, inference, hub, export, cli) load when imported.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from . import model
from .model import *  # noqa: F403 (the public API is the model's: model.__all__)
from .model import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel

__version__ = "0.1.0"

AutoConfig.register(VaswaniConfig.model_type, VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)

__all__ = [*model.__all__, "__version__"]
