"""Keeping freed memory inside the process, so that a training step does not page-fault its large buffers.

glibc's `malloc` serves every large block with a fresh `mmap`, returned at `free`, so a training step maps and
zero-fills the same large temporaries (the loss's logits chunk, the activations) again at every step.
`retain_freed_memory()` makes malloc reuse them, a faster step (benchmarks/RESULTS.md, the allocator) at the cost of
keeping the peak heap: the fix of preloading jemalloc or tcmalloc, without a library or an environment variable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

logger = logging.getLogger(__name__)

# mallopt(3) parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# Free memory at the top of the heap is given back only above this (mallopt takes an int).
TRIM_THRESHOLD_BYTES = 2**31 - 1

_applied = False


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    # musl and other C libraries have their own malloc; only glibc's takes these parameters.
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def return_freed_memory() -> bool:
    """Gives the memory that glibc's malloc holds free back to the system (`malloc_trim(0)`); returns whether it could.

    For a server, not a training process: each Gradio worker thread has a malloc arena of its own that keeps the
    freed tensors of a long translation, so a served model's memory grows without it (benchmarks/RESULTS.md,
    reliability). Nothing where malloc is not glibc's."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


def retain_freed_memory() -> bool:
    """Makes glibc's malloc keep freed memory for reuse (no `mmap` per large block, no heap trimming).

    Returns whether it applies: True on Linux with glibc (also when an earlier call applied it), False elsewhere,
    where nothing is changed. Process-wide, and meant for a process that trains: call it before the first step.
    """
    global _applied
    if _applied:
        return True
    libc = _glibc()
    if libc is None:
        logger.info("retain_freed_memory: not glibc on Linux, malloc left as it is")
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not ok:
        logger.warning("retain_freed_memory: glibc refused mallopt; large blocks keep being mapped per allocation")
        return False
    _applied = True
    logger.info("retain_freed_memory: malloc keeps freed memory (no mmap per large block, no heap trimming)")
    return True
