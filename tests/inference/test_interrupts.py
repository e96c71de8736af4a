"""SIGINT and SIGTERM under `streams.stopping_on_signals` (issue 45): a translation stops with the lines translated so
far kept in order (`TranslationInterrupted.done`: those before the first line not translated yet, whatever the
length order of the batches), `translate_stream` writes them, and a signal that comes while output is written waits
for the write's end. The commands, as real processes: tests/cli/test_command_interrupts.py."""

import io
import signal
import subprocess
import sys

import pytest
from conftest import ENGLISH

from vaswani_mt.inference.streams import count_lines, translate_stream
from vaswani_mt.inference.translate import TranslationInterrupted, translate, translate_nbest
from vaswani_mt.inference.translator import Translator
from vaswani_mt.system.signals import interruptible, stopping_on_signals

pytestmark = pytest.mark.usefixtures("one_thread", "live_sigint")  # passes under nohup too (conftest)

# The six sentences longest first: batches, which run longest first, then run in input order.
LONGEST_FIRST = sorted(ENGLISH, key=len, reverse=True)
GREEDY = {"num_beams": 1, "max_new_tokens": 12}


def signal_at_batch(monkeypatch, model, batch: int, signum: int = signal.SIGINT) -> None:
    """`model.generate` sends this process `signum` when it starts batch number `batch` (from 1)."""
    generate, calls = model.generate, []

    def generate_and_signal(*args, **kwargs):
        calls.append(1)
        if len(calls) == batch:
            signal.raise_signal(signum)
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", generate_and_signal)


@pytest.mark.parametrize(("lines", "kept"), [(LONGEST_FIRST, 2), (LONGEST_FIRST[::-1], 0)])
def test_an_interrupted_translation_keeps_the_lines_before_the_first_one_not_translated(fitted, monkeypatch, lines,
                                                                                       kept):  # fmt: skip
    model, tokenizer = fitted
    expected = translate(model, tokenizer, lines, batch_size=2, **GREEDY)
    signal_at_batch(monkeypatch, model, batch=2, signum=signal.SIGTERM)  # 2 of the 6 lines translated
    with pytest.raises(TranslationInterrupted) as stop, stopping_on_signals(), interruptible():
        translate(model, tokenizer, lines, batch_size=2, **GREEDY)
    # Shortest first, the batch done holds the last two lines: the first line is not translated, nothing is kept.
    assert stop.value.signum == signal.SIGTERM and stop.value.done == expected[:kept]


def test_an_interrupted_nbest_translation_keeps_whole_lists(fitted, monkeypatch):
    model, tokenizer = fitted
    expected = translate_nbest(model, tokenizer, LONGEST_FIRST, 1, batch_size=2, **GREEDY)
    signal_at_batch(monkeypatch, model, batch=3)
    with pytest.raises(TranslationInterrupted) as stop, stopping_on_signals(), interruptible():
        translate_nbest(model, tokenizer, LONGEST_FIRST, 1, batch_size=2, **GREEDY)
    assert stop.value.done == expected[:4]


def test_an_interrupted_stream_writes_every_whole_chunk_and_the_start_of_the_one_in_progress(fitted, monkeypatch):
    model, tokenizer = fitted
    lines = LONGEST_FIRST * 3
    source = ("\n".join(lines) + "\n").encode()
    whole = io.BytesIO()
    translate_stream(
        Translator(model, tokenizer, batch_size=2, chunk_size=6, generate_kwargs=GREEDY), io.BytesIO(source), whole
    )
    # Chunks of 6 lines in batches of 2: the 5th batch is the 2nd of the 2nd chunk, so 6 + 2 lines are done.
    signal_at_batch(monkeypatch, model, batch=5)
    sink = io.BytesIO()
    with pytest.raises(TranslationInterrupted) as stop, stopping_on_signals():
        translate_stream(
            Translator(model, tokenizer, batch_size=2, chunk_size=6, generate_kwargs=GREEDY), io.BytesIO(source), sink
        )
    assert stop.value.written == 8 and stop.value.signum == signal.SIGINT
    assert sink.getvalue().decode().splitlines() == whole.getvalue().decode().splitlines()[:8]


def test_a_signal_outside_an_interruptible_block_waits_for_the_next_one_or_the_end(monkeypatch):
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(TranslationInterrupted) as stop, stopping_on_signals():
        signal.raise_signal(signal.SIGTERM)  # held: nothing here may be cut (output being written)
        reached = True
        with interruptible():
            pytest.fail("an interruptible block started after a signal")
    assert reached and stop.value.signum == signal.SIGTERM and stop.value.done == []
    with pytest.raises(TranslationInterrupted), stopping_on_signals():
        signal.raise_signal(signal.SIGINT)
        reached_end = True  # the end of the block raises it
    assert reached_end
    assert {signum: signal.getsignal(signum) for signum in before} == before  # the handlers are put back


def test_a_second_signal_ends_the_process_at_once():
    code = (
        "import os, signal\n"
        "from vaswani_mt.system.signals import stopping_on_signals\n"
        "with stopping_on_signals():\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # held: not in an interruptible block\n"
        "    print('after the first', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    print('after the second', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == -signal.SIGINT, done.stderr[-2000:]
    assert done.stdout == "after the first\n" and "Traceback" not in done.stderr


@pytest.mark.parametrize(("data", "lines"), [(b"", 0), (b"a", 1), (b"a\n", 1), (b"a\r\n\nb", 3), (b"\n" * 5, 5)])
def test_count_lines_counts_what_read_text_lines_reads(tmp_path, data, lines):
    (tmp_path / "f").write_bytes(data)
    assert count_lines(tmp_path / "f") == lines


def test_handlers_are_left_alone_outside_the_main_thread_and_for_ignored_signals():
    import threading

    seen = {}

    def worker():
        with stopping_on_signals():
            seen["handler"] = signal.getsignal(signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["handler"] is before
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with stopping_on_signals():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # nohup's choice stays
            assert signal.getsignal(signal.SIGINT) is not before
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_signal_tests_pass_in_a_process_started_with_sigint_ignored():
    """As under nohup or `cmd &`, which start a process with SIGINT ignored: the tests that send it (in this process
    and to a child) make it live first (conftest's `live_sigint`)."""
    chosen = "outside_an_interruptible_block or second_signal_ends"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", __file__, "-k",
                           chosen], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:]


class _Signalling:
    """A file that sends this process SIGINT as its write number `at` (from 1) starts, before any byte is written."""

    def __init__(self, file, at: int):
        self.file, self.at, self.writes = file, at, 0

    def write(self, data):
        self.writes += 1
        if self.writes == self.at:
            signal.raise_signal(signal.SIGINT)
        return self.file.write(data)

    def flush(self):
        self.file.flush()

    def close(self):
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _SignalAfterYield:
    """The translator's iterator, with SIGINT sent just after its yield number `at` (from 1): the reader has not
    stored that line yet, and the iterator waits at its yield."""

    def __init__(self, inner, at: int):
        self.inner, self.at, self.count = inner, at, 0

    def __iter__(self):
        return self

    def __next__(self):
        output = next(self.inner)
        self.count += 1
        if self.count == self.at:
            signal.raise_signal(signal.SIGINT)
        return output

    def throw(self, error):
        return self.inner.throw(error)

    @property
    def gi_frame(self):
        return self.inner.gi_frame


NBEST = {"batch_size": 2, "chunk_size": 6, "nbest": 1, "generate_kwargs": GREEDY}  # IDs show a shifted line


def _whole(translator, source: bytes) -> list[str]:
    whole = io.BytesIO()
    translate_stream(translator, io.BytesIO(source), whole)
    return whole.getvalue().decode().splitlines(keepends=True)


@pytest.mark.parametrize("at", [1, 3, 8])
def test_a_signal_inside_a_write_within_an_interruptible_block_waits_for_the_line(fitted, at):
    model, tokenizer = fitted
    translator = Translator(model, tokenizer, **NBEST)
    source = "".join(f"{line}\n" for line in LONGEST_FIRST * 2).encode()
    whole = _whole(translator, source)
    sink = _Signalling(io.BytesIO(), at)
    with pytest.raises(TranslationInterrupted) as stop, stopping_on_signals(), interruptible():  # translate_shards'
        translate_stream(translator, io.BytesIO(source), sink)
    written = stop.value.written
    assert written >= at and sink.file.getvalue().decode().splitlines(keepends=True) == whole[:written]


@pytest.mark.parametrize("at", [1, 4, 6])
def test_a_signal_just_after_a_yield_loses_no_line(fitted, monkeypatch, at):
    model, tokenizer = fitted
    translator = Translator(model, tokenizer, **NBEST)
    source = "".join(f"{line}\n" for line in LONGEST_FIRST * 2).encode()
    whole = _whole(translator, source)
    iterate = Translator.translate_iterable
    monkeypatch.setattr(Translator, "translate_iterable", lambda *a, **k: _SignalAfterYield(iterate(*a, **k), at))
    sink = io.BytesIO()
    with pytest.raises(TranslationInterrupted) as stop, stopping_on_signals():
        translate_stream(translator, io.BytesIO(source), sink)
    assert stop.value.written == 6  # the chunk the yield was in is done: all of it written
    assert sink.getvalue().decode().splitlines(keepends=True) == whole[:6]


def test_a_part_stopped_inside_a_write_in_an_interruptible_block_resumes_to_the_whole_bytes(fitted, tmp_path,
                                                                                           monkeypatch):  # fmt: skip
    """What translate_shards does with each of its shards (`translate_part`), stopped inside a write, then rerun."""
    from argparse import Namespace

    from vaswani_mt.cli.translate import Part, translate_part
    from vaswani_mt.inference.controls import ControlReport
    from vaswani_mt.system.outputs import ResumableOutput

    model, tokenizer = fitted
    translator = Translator(model, tokenizer, **NBEST)
    source = tmp_path / "in.en"
    source.write_text("".join(f"{line}\n" for line in LONGEST_FIRST * 3))
    args = Namespace(first_line=1, input=str(source), target_prefix_file=None)

    def run(name: str) -> None:
        translate_part(args, translator, ResumableOutput(tmp_path / name, {"run": 1}), ControlReport(), Part(), False)

    run("whole.de")
    opened = ResumableOutput.open
    with monkeypatch.context() as patch:
        patch.setattr(ResumableOutput, "open", lambda self: _Signalling(opened(self), 8))  # in the 2nd chunk
        with pytest.raises(TranslationInterrupted), stopping_on_signals(), interruptible():
            run("out.de")
    assert not (tmp_path / "out.de").exists()
    run("out.de")
    assert (tmp_path / "out.de").read_bytes() == (tmp_path / "whole.de").read_bytes()
