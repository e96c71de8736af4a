"""The model, exactly as it ships to the Hub: every file here but this one is copied into a saved folder as remote
code, and imports only torch, transformers (with its huggingface_hub, for `@strict`) and its siblings (relatively),
so that a folder loads in a process without vaswani_mt.

- configuration_vaswani.py: `VaswaniConfig` and the presets (base and big of Table 3, and CPU-sized ones);
- modeling_vaswani.py: the paper's encoder-decoder (§3), its label-smoothed loss (§5.4);
- generation_vaswani.py: the paper's beam search (§6.1), our own, from `generate()`;
- constraints_vaswani.py: terminology constraints for it (dynamic beam allocation);
- fast_paths_vaswani.py: faster computations of the same numbers (dropout masks, packed GEMM, fused loss);
- pipeline_vaswani.py: the translation pipeline (`pipeline("translation", model=folder, trust_remote_code=True)`).
"""

from pathlib import Path

from .configuration_vaswani import PRESETS, VaswaniConfig
from .generation_vaswani import gnmt_length_penalty
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
