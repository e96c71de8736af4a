"""The decoder step compiled for inference (`TranslationOptions.compile_step`, translate.py's --compile_step): the
search's step, the whole decoder stack over the rows still searched, torch.compile'd (inductor) with dynamic shapes
from the third step (beam_search_vaswani.py), so that finished sentences still leave the batch.

- "on": one graph for every row count and length, with inductor's `freezing`: the weights become constants of the
  graph, folded and each linear layer's weight reordered once for oneDNN (as the eager `_project` does). inductor's
  caches are kept in the user's cache folder (`compile_cache_dir`): torch 2.13 caches no frozen graph (its reordered
  weights do not pickle, "mkldnn tensors unpickleable"), so each run lowers it again, but its C++ kernels come from
  the cache (compile 15 s against 23 s). `freezing` is a setting of inductor's (private) config, which dynamo must
  also see while it traces: patched for the search only, behind a feature check (`FREEZING`); without it the step
  is compiled with the weights as the graph's inputs. That form alone ran at 0.98-1.01x the eager step, whose
  weights are prepacked too, and was removed (RESULTS.md's removed table).
- translate.py's "auto" (its default): `AUTO_COMPILE_STEP` where the input has at least `COMPILE_FROM_LINES` lines
  (the compile paid back), else eager (RESULTS.md, 2026-11-29, the compiled step with frozen weights and a kept cache).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

# The input, in lines, from which compiling the step pays on a translate.py run: its compile (23 s in a first run,
# 15 s with the kernels cached) over the time saved a sentence (1.26 ms: eager 71.2 sentences/s, compiled 78.2, the
# median of its rounds), 2 threads, the main job's model (RESULTS.md, 2026-11-29, the compiled step): 18,000 pays in
# a first run too.
COMPILE_FROM_LINES = 18000
AUTO_COMPILE_STEP = "on"  # what "auto" compiles there


def _settings(module: str, name: str):
    """The config module `module` of torch where it has the boolean setting `name` and a way to set it for a while
    (`patch`), else None: the feature check of a private setting."""
    import importlib

    try:
        config = importlib.import_module(module)
    except ImportError:
        return None
    settable = isinstance(getattr(config, name, None), bool) and callable(getattr(config, "patch", None))
    return config if settable else None


FREEZING = _settings("torch._inductor.config", "freezing") is not None


def compile_cache_dir() -> Path:
    """Where inductor keeps what it compiled across runs: TORCHINDUCTOR_CACHE_DIR where the user set it, else
    vaswani_mt/inductor in the user's cache folder (XDG_CACHE_HOME, or ~/.cache), not inductor's default in /tmp,
    which a reboot empties."""
    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if given and given != _inductor_default():
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vaswani_mt" / "inductor"


def _inductor_default() -> str | None:
    """The folder inductor picks for itself (and writes into TORCHINDUCTOR_CACHE_DIR once it has), or None."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return None
    return default_cache_dir()


def keep_compile_cache() -> Path:
    """TORCHINDUCTOR_CACHE_DIR set to `compile_cache_dir()` for this process, before anything compiles; returned."""
    folder = compile_cache_dir()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    return folder


def compile_kwargs(compile_step: str | None) -> dict:
    """The `generate()` keywords of `compile_step`: a transformers `CompileConfig` of dynamic shapes (torch.compile's
    default mode; inductor's `freezing` in its options, which also keys the compiled step apart)."""
    if compile_step is None:
        return {}
    from transformers import CompileConfig

    options = {"freezing": True} if FREEZING else None
    return {"compile_config": CompileConfig(dynamic=True, fullgraph=False, mode=None, options=options)}


@contextlib.contextmanager
def compiling(compile_step: str | None) -> Iterator[None]:
    """The context a search with `compile_step` runs in, set while dynamo traces the step: every size a symbol of
    its own (duck sizing off: it gave 64 rows, 16 sentences of 4 beams, the head size's symbol, which the cache's
    `cat` then fixed at 64, so a second graph followed); inductor's `freezing` on. Each where this torch
    has the setting; nothing for eager."""
    with contextlib.ExitStack() as stack:
        shapes = _settings("torch.fx.experimental._config", "use_duck_shape") if compile_step else None
        if shapes is not None:
            stack.enter_context(shapes.patch(use_duck_shape=False))
        if compile_step and FREEZING:
            stack.enter_context(_settings("torch._inductor.config", "freezing").patch(freezing=True))
        yield


def auto_compile_step(lines: int | None, own_model: bool = True) -> str | None:
    """translate.py's --compile_step auto: `AUTO_COMPILE_STEP` for an input of at least `COMPILE_FROM_LINES` `lines`
    (None: not known, a stream) translated by one vaswani_mt model (`own_model`) on the CPU (where it was measured),
    else None (eager)."""
    import torch

    if torch.cuda.is_available():
        return None
    return AUTO_COMPILE_STEP if own_model and lines is not None and lines >= COMPILE_FROM_LINES else None


__all__ = ["AUTO_COMPILE_STEP", "COMPILE_FROM_LINES", "FREEZING", "auto_compile_step", "compile_cache_dir",
           "compile_kwargs", "compiling", "keep_compile_cache"]  # fmt: skip
