"""SIGINT and SIGTERM as an exception the commands catch: under `stopping_on_signals`, the first signal raises
`TranslationInterrupted` inside an `interruptible` block (translating, loading), or at the start of the next one, so
that no output is cut and no count lost; a second signal ends the process at once."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class TranslationInterrupted(BaseException):
    """Stops a translation where it is, as KeyboardInterrupt does (a BaseException: no `except Exception` on the way
    swallows it); `stopping_on_signals` raises it on SIGINT or SIGTERM (`signum`). Out of a translator's iterator
    (raised inside it, or thrown into it with `iterator.throw(stop)`), `done` holds the final outputs of the lines
    that are finished from line `first` on (None: from the first line not yielded), in input order, and `later` the
    finished lines past the first unfinished one, `{line number from 1: output}` (a chunk's batches run in length
    order). A reader writes those of `done` past the lines it wrote itself, wherever the signal fell."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.done, self.later, self.first = signum, [], {}, None


class _Signals:
    """What `stopping_on_signals` installs: the first SIGINT or SIGTERM is held (`signum`) until the program is in an
    `interruptible` block, where it raises `TranslationInterrupted` at once; a second one ends the process at once,
    by that signal (as if it had not been caught)."""

    def __init__(self):
        self.signum: int | None = None
        self.raised, self.open = False, 0

    def handle(self, signum, frame):
        if self.signum is not None:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        self.signum = signum
        if self.open:
            self.stop()

    def stop(self):
        self.raised = True
        raise TranslationInterrupted(self.signum)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        if self.signum is not None and not self.raised:
            self.stop()
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        opened, self.open = self.open, 0
        try:
            yield
        finally:
            self.open = opened
        if self.open and self.signum is not None and not self.raised:  # inside an interruptible block: at once
            self.stop()


SIGNALS = (signal.SIGINT, signal.SIGTERM)
_signals: _Signals | None = None  # the handler of the `stopping_on_signals` block that runs


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """While the block runs, the first SIGINT or SIGTERM raises `TranslationInterrupted` (128 + its `signum` is the
    shell's exit status for it: 130, 143): at once within an `interruptible` block (translating, loading), else at
    the start of the next one or at the end of this block, so that no output is cut and no count lost. A second
    signal ends the process at once. A signal ignored when the block starts (`nohup`, a background job) stays
    ignored; the previous handlers come back after the block. Main thread only: elsewhere (a notebook's worker
    thread) nothing changes."""
    global _signals
    if threading.current_thread() is not threading.main_thread() or _signals is not None:
        yield
        return
    handler = _Signals()
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    caught = [signum for signum, old in previous.items() if old is not signal.SIG_IGN]
    _signals = handler
    for signum in caught:
        signal.signal(signum, handler.handle)
    try:
        yield
        if handler.signum is not None and not handler.raised:  # held to the end
            handler.stop()
    finally:
        for signum in caught:
            signal.signal(signum, previous[signum])
        _signals = None


def interruptible() -> contextlib.AbstractContextManager:
    """Within `stopping_on_signals`, a block that a signal stops at once: one that loses nothing when stopped
    anywhere (translating: `TranslationInterrupted.done` keeps what is done). Elsewhere it does nothing."""
    return _signals.interruptible() if _signals is not None else contextlib.nullcontext()


def held() -> contextlib.AbstractContextManager:
    """Within `stopping_on_signals`, a block that a signal never cuts, even inside an `interruptible` one (a line
    written and counted): a signal that comes during it raises at its end. Elsewhere it does nothing."""
    return _signals.held() if _signals is not None else contextlib.nullcontext()


__all__ = ["SIGNALS", "TranslationInterrupted", "held", "interruptible", "stopping_on_signals"]
