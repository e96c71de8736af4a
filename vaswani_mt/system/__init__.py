"""The process and the machine: the allocator setting training uses (`retain_freed_memory`) and the demo undoes
after each answer (`return_freed_memory`), whether the hardware multiplies bf16 natively (`native_bf16`), a folder
replaced only when asked and written whole (`check_replaceable`, `written_whole`), and how another library's error
reads in our one-line messages (`error_line`). Imports nothing of vaswani_mt, so any layer may use it; nothing here
runs at import time."""

from .allocator import retain_freed_memory, return_freed_memory
from .devices import native_bf16
from .folders import check_replaceable, written_whole
from .messages import error_line

__all__ = [
    "check_replaceable", "error_line", "native_bf16", "retain_freed_memory", "return_freed_memory", "written_whole",
]  # fmt: skip
