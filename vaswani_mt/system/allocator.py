"""Keeping freed memory inside the process, so that a training step does not page-fault its large buffers.

glibc's `malloc` serves every block above its mmap threshold (at most 32 MiB) with a fresh `mmap` and gives it back
to the kernel at `free`; it also trims the top of its heap when more than a few MiB there are free. A training step
allocates the same large temporaries at every step (the loss's logits chunk: 1,680 target tokens x 8,000 types in
float32 are 54 MB, its bf16 copy, the feed-forward activations), so at every step the kernel maps those pages
again and zero-fills them on first touch: about 23,000 page faults per step at the CPU preset's shapes.
Without them, `benchmarks/speed_train.py`'s allocator mode (at commit aca84f8^; `benchmarks/RESULTS.md`, 2026-11-23,
the allocator) measured 1.11x
the steps per second under bf16 autocast and 1.05x in float32 (and 1.28x for MarianMTModel's step, whose loss
allocates more). `retain_freed_memory()` tells malloc to serve large blocks from its heap and not to trim it, so
freed blocks are reused with their pages already mapped (the same fix as preloading jemalloc or tcmalloc, which
PyTorch's CPU tuning guide recommends, but without a library to install or an environment variable to set before
Python starts).

The cost: the process keeps its peak heap (it is not returned to the kernel until the process ends), which for
training is what it holds at every step anyway. Nothing is computed differently.
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
    """Gives the memory that glibc's malloc holds free back to the system (`malloc_trim(0)`, a few milliseconds);
    returns whether it could. For a server, not a training process: Gradio runs each translation on one of its
    worker threads, each with a malloc arena of its own, and the freed tensors and pictures of a long translation
    stay mapped in them: measured, a served tiny model grew from 0.5 to 1.4 GB of RSS over 36 requests and stays
    near 0.55 GB with this. Nothing where malloc is not glibc's."""
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
