"""Batched and streamed translation (`vaswani_mt.inference.translate`): order kept and each sentence as it
translates alone, a stream in chunks equal to the whole list, and input lines read as text whatever their bytes.
Hostile text at every entry point: test_hostile_input.py."""

import io

import pytest
from conftest import ENGLISH, FAST, HOSTILE, make_model

from vaswani_mt.inference.streams import read_text_lines, translate_stream
from vaswani_mt.inference.translate import translate
from vaswani_mt.inference.translator import Translator

pytestmark = pytest.mark.usefixtures("one_thread")


def test_translate_keeps_order_and_matches_one_by_one(tokenizer):
    model = make_model(seed=2)
    sentences = ["The girl ate an apple.", "How are you?", "", "She reads a book in the café.", "   "]
    batched = translate(model, tokenizer, sentences, batch_size=2, max_new_tokens=6, num_beams=2)
    assert batched[2] == "" and batched[4] == ""
    for sentence, out in zip(sentences, batched, strict=True):
        if sentence.strip():
            assert translate(model, tokenizer, [sentence], max_new_tokens=6, num_beams=2) == [out]


def test_reading_lines_replaces_bad_bytes_and_cuts_endless_lines_with_warnings(caplog):
    data = b"\xef\xbb\xbfok\r\nbad \xff\xc3(\n" + b"x" * 5000 + "é".encode() * 10 + b"\nlast"
    with caplog.at_level("WARNING", logger="vaswani_mt.inference.translate"):
        lines = list(read_text_lines(io.BytesIO(data), "in.txt", max_line_bytes=1000))
    assert lines == ["ok", "bad \ufffd\ufffd(", "x" * 1000, "last"]
    assert "in.txt:2: bytes that are not UTF-8 (b'\\xff' at byte 5) read as U+FFFD" in caplog.text
    assert "in.txt:3: a line of more than 1000 bytes: only its first 1000 bytes are read" in caplog.text
    cut_inside_a_character = list(read_text_lines(io.BytesIO(b"a" + "é".encode() * 10), max_line_bytes=4))
    assert cut_inside_a_character == ["aé"]  # the half character at the cut is dropped, not turned into U+FFFD


def test_stream_translation_equals_translating_the_whole_list(fitted):
    """Chunks change which sentences share a batch, not what they translate to."""
    model, tokenizer = fitted
    lines = [ENGLISH[i % 6] if i % 4 else HOSTILE[i % len(HOSTILE)].replace("\n", " ") for i in range(30)]
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    sink = io.BytesIO()
    assert (
        translate_stream(
            Translator(model, tokenizer, batch_size=4, chunk_size=7, generate_kwargs=FAST), io.BytesIO(data), sink
        )
        == 30
    )
    whole = translate(model, tokenizer, [line.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
                                         for line in lines], batch_size=16, **FAST)  # fmt: skip
    assert sink.getvalue().decode("utf-8").split("\n") == [*whole, ""]


def test_the_command_shows_our_bar_alone_and_each_warning_on_a_line_of_its_own(fitted_folder):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "translate.py"
    text = "How are you?\n\nThe 漢 house.\n".encode() + b"bad \xff byte\n"  # a blank line, <unk>, bad bytes
    done = subprocess.run([sys.executable, str(script), "--model", str(fitted_folder), "--num_beams", "1"],
                          input=text, capture_output=True, timeout=300)  # fmt: skip
    stderr = done.stderr.decode()
    assert done.returncode == 0 and len(done.stdout.decode().split("\n")) == 5
    assert "Loading weights" not in stderr and "translating" in stderr  # ours stays, transformers' does not
    shown = [line.rsplit("\r", 1)[-1] for line in stderr.split("\n")]  # a terminal: "\r" starts the line again
    for warning in ("<stdin>:4: bytes that are not UTF-8", "1 empty or whitespace-only lines", "line 3: a character",
                    "line 4: a character"):  # fmt: skip
        assert [line for line in shown if warning in line] == [line for line in shown if line.startswith(warning)]
        assert any(line.startswith(warning) for line in shown), stderr
