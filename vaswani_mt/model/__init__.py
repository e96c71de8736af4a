"""The model, exactly as it ships to the Hub: every file here but this one is copied into a saved folder as remote
code and imports only torch, transformers (with huggingface_hub) and its siblings, so it loads without vaswani_mt.

configuration (Table 3's presets), modeling (§3, §5.4), generation and beam_search (§6.1), constraints (terminology),
fast_paths (the same numbers, faster) and pipeline (`pipeline("translation", ...)`), each `*_vaswani.py`.
"""

from pathlib import Path

from .beam_search_vaswani import gnmt_length_penalty
from .configuration_vaswani import PRESETS, VaswaniConfig
from .modeling_vaswani import (
    VaswaniForConditionalGeneration,
    VaswaniModel,
    VaswaniPreTrainedModel,
    sinusoidal_position_encoding,
)

# The files a saved folder carries as remote code: every module here but this one.
REMOTE_CODE_FILES = tuple(sorted(path.name for path in Path(__file__).parent.glob("*_vaswani.py")))

__all__ = [
    "PRESETS",
    "REMOTE_CODE_FILES",
    "VaswaniConfig",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "gnmt_length_penalty",
    "sinusoidal_position_encoding",
]
