"""vaswani_mt: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers model.

Importing the package registers the config and models with AutoConfig, AutoModel and AutoModelForSeq2SeqLM, and
does nothing else: the subpackages (data, training, evaluation, inference, hub, export, cli) load when imported.
"""

import os
import sys


def _started_as_a_command() -> bool:
    """Whether this process is one of our commands (`vaswani-mt-*`, scripts/*.py, app.py) rather than a program
    that imports the package: only a command ends in one line when Ctrl-C comes while it starts."""
    path = sys.argv[0] if sys.argv and sys.argv[0] else ""
    name, folder = os.path.basename(path), os.path.basename(os.path.dirname(os.path.abspath(path)))
    return name.startswith("vaswani-mt-") or (name.endswith(".py") and folder == "scripts") or name == "app.py"


# What a command says when Ctrl-C comes while it starts (importing, checking, loading): one line for all.
STOPPED_STARTING = "interrupted while starting: nothing done"

try:  # torch and transformers take seconds to import
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    from . import model
    from .model import *  # noqa: F403 (the public API is the model's: model.__all__)
    from .model import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel
except KeyboardInterrupt:
    if not _started_as_a_command():
        raise
    print(STOPPED_STARTING, file=sys.stderr)
    raise SystemExit(130) from None

__version__ = "0.1.0"

AutoConfig.register(VaswaniConfig.model_type, VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)

__all__ = [*model.__all__, "__version__"]
