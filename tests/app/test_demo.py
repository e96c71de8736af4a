"""The demo app for real: its translation function, its server on a free loopback port (started in this process:
its bounds, refusals and routes, over plain HTTP), and `python app.py MODEL` driven by headless Chromium through
Playwright (Debian's chromium; .ci/run installs it, and that test is skipped only where it is absent)."""

import http.client
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import SENTENCES, free_port, make_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vaswani_mt.app import demo as demo_module
from vaswani_mt.app.demo import DEMO_MAX_REQUEST_BYTES, DEMO_STATE_SESSIONS, translate_for_demo
from vaswani_mt.inference.loading import load_for_inference

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
QUEUE_SIZE = 2  # the served demo's longest queue: small, so that the test fills it with three requests
SEARCH = [1, 0.6, 10, 1, "", False]  # greedy, alpha, b of |X| + b, the heatmap's layer, no term, no markup: cheap


def test_demo_answers_blank_and_over_long_input_with_a_message(fitted_folder):
    model, tokenizer = load_for_inference(str(fitted_folder), attn_implementation="eager")
    assert translate_for_demo(model, tokenizer, "   ") == ("", None, "Nothing to translate: type a sentence.")
    text = " ".join(["The girl ate an apple."] * 20)
    translation, figure, notes = translate_for_demo(model, tokenizer, text, num_beams=1, max_source_tokens=32)
    assert translation and "cut to the first 32" in notes
    assert len(figure.axes[0].get_xticklabels()) == 32  # the heatmap shows the 32 tokens translated


def test_the_demo_forces_the_terms_it_must_contain_and_says_which_it_met(fitted_folder):
    model, tokenizer = load_for_inference(str(fitted_folder), attn_implementation="eager")
    text = "The girl ate an apple."
    translation, _, notes = translate_for_demo(model, tokenizer, text, num_beams=1, max_len_b=12,
                                               terms="Buch, Kaffee")  # fmt: skip
    assert "Buch" in translation and "Kaffee" in translation
    assert "must contain: Buch ✓ met, Kaffee ✓ met" in notes and "searched with 4" in notes
    _, _, notes = translate_for_demo(model, tokenizer, text, terms="Bu漢ch")
    assert "outside the vocabulary: '漢'; translated without the terms" in notes
    _, _, notes = translate_for_demo(model, tokenizer, text, num_beams=2, max_len_b=8, terms="gegesen")
    assert "must contain: 'gegesen' splits into 4 short pieces" in notes


def test_the_demo_says_met_or_not_as_the_translators_report_does_not_as_a_substring_test(fitted_folder,
                                                                                        monkeypatch):  # fmt: skip
    from vaswani_mt.inference.translator import Translator

    model, tokenizer = load_for_inference(str(fitted_folder), attn_implementation="eager")
    translate = Translator.translate

    def reporting_unmet(self, lines, **kwargs):  # the search says it missed the term, which the text holds anyway
        outputs = translate(self, lines, **kwargs)
        kwargs["report"].unmet[1] = ["Buch"]
        return outputs

    monkeypatch.setattr(Translator, "translate", reporting_unmet)
    translation, _, notes = translate_for_demo(model, tokenizer, "The girl ate an apple.", max_len_b=12, terms="Buch")
    assert "Buch" in translation and "must contain: Buch ✗ not met" in notes


def test_search_controls_start_from_the_models_own_generation_config(fitted_folder, tmp_path):
    pytest.importorskip("gradio")
    from transformers import GenerationConfig

    from vaswani_mt.app.demo import build_demo

    folder = tmp_path / "alpha"
    shutil.copytree(fitted_folder, folder)
    config = GenerationConfig.from_pretrained(folder)
    config.length_penalty, config.num_beams, config.max_len_b = 1.2, 5, 30  # as the main job saves its alpha 1.2
    config.save_pretrained(folder)
    demo = build_demo(str(folder))
    sliders = {block.label: block.value for block in demo.blocks.values() if type(block).__name__ == "Slider"}
    assert sliders["Length penalty α (GNMT)"] == 1.2  # not the paper's 0.6
    assert sliders["Beam size"] == 5 and sliders["Maximum length: input length + b, b ="] == 30


# Any code point (controls, unassigned, private use), lone surrogates (which no other strategy here draws), and the
# characters that once broke a demo: NUL, bidi overrides, zero-width joiners, a dollar (matplotlib's mathtext).
CHARACTERS = st.one_of(
    st.characters(codec=None, exclude_categories=()), st.characters(categories=["Cs"]),
    st.sampled_from(["\x00", "\u202e", "\u200d", "$", "😀", "\n", "\r", "\ufeff"]),
)  # fmt: skip


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(text=st.text(CHARACTERS, max_size=80))
def test_demo_gives_a_translation_or_a_note_for_any_text(demo_model, text):
    translation, figure, notes = translate_for_demo(*demo_model, text, num_beams=1, max_len_b=5)
    assert isinstance(translation, str) and isinstance(notes, str)
    if text.strip():
        figure.savefig(io.BytesIO(), format="png", dpi=10)  # as Gradio draws it (the text layout is the same)
    else:
        assert figure is None and notes == "Nothing to translate: type a sentence."


def test_demo_cuts_text_over_its_character_limit_and_says_so(demo_model):
    text = "The girl ate an apple. " * 10
    _, _, notes = translate_for_demo(*demo_model, text, num_beams=1, max_len_b=5, max_characters=50)
    assert f"text of {len(text):,} characters cut to the first 50" in notes


def test_demo_outlines_the_word_alignment_and_keeps_tags_and_placeholders(demo_model):
    from vaswani_mt.inference.markup import tags, well_formed
    from vaswani_mt.inference.translate import translate

    model, tokenizer = demo_model
    text = "The girl ate an apple."
    translation, figure, _ = translate_for_demo(model, tokenizer, text, num_beams=4, length_penalty=0.6, max_len_b=10)
    aligned = translate(model, tokenizer, [text], num_beams=4, length_penalty=0.6, max_len_b=10, alignments="hard")[0]
    assert translation == aligned
    boxes = [patch for patch in figure.axes[0].patches if patch.get_edgecolor()[:3] == (1.0, 0.0, 0.0)]
    assert len(boxes) == len(aligned.links) > 0  # one red outline a link
    line = "The <b>girl</b> ate {0} apples.<br/>"
    marked, _, _ = translate_for_demo(model, tokenizer, line, num_beams=4, max_len_b=10, markup=True)
    assert well_formed(marked) and sorted(tags(marked)) == sorted(tags(line)) and marked.count("{0}") == 1
    _, _, notes = translate_for_demo(model, tokenizer, "The <b>girl ate.", num_beams=1, markup=True)
    assert "markup: broken (<b> is not closed): translated as plain text" in notes


def test_demo_outlines_the_links_translate_gives_for_a_model_with_a_supervised_head(demo_model):
    from vaswani_mt.app.attention_plots import link_boxes
    from vaswani_mt.inference.translate import translate

    model, tokenizer = demo_model
    text = "The girl ate an apple."
    model.config.alignment_head = [1, 2]
    try:
        _, figure, _ = translate_for_demo(model, tokenizer, text, num_beams=4, length_penalty=0.6, max_len_b=10)
        aligned = translate(model, tokenizer, [text], num_beams=4, length_penalty=0.6, max_len_b=10, alignments="hard")
    finally:
        model.config.alignment_head = None
    boxes = [patch for patch in figure.axes[0].patches if patch.get_edgecolor()[:3] == (1.0, 0.0, 0.0)]
    assert aligned[0].supervised is not None  # the head is kept; the page outlines the links translate() gives
    expected = sorted((column - 0.5, row - 0.5) for column, row, _, _ in link_boxes(aligned[0]))
    assert sorted((box.get_x(), box.get_y()) for box in boxes) == expected


def test_heatmap_draws_tokens_that_hold_dollar_signs_as_they_are():
    # A token with two "$" is matplotlib mathtext: "$\\frac{$" cannot be drawn, and the page would get an error.
    from vaswani_mt.data.tokenization import train_tokenizer

    tokenizer = train_tokenizer(["$\\frac{$ costs $x$"] * 20 + [en for en, _ in SENTENCES], 120, min_frequency=1)
    assert "▁$\\frac{$" in tokenizer.get_vocab()
    model = make_model(vocab_size=120)
    _, figure, _ = translate_for_demo(model, tokenizer, "$\\frac{$ costs $x$", num_beams=1, max_len_b=3)
    figure.savefig(io.BytesIO(), format="png")
    labels = [label.get_text() for label in figure.axes[0].get_xticklabels()]
    assert "▁$\\frac{$" in [label.replace("\\$", "$") for label in labels]


def test_demo_listens_on_loopback_unless_told_otherwise(monkeypatch):
    from vaswani_mt.app.demo import server_name

    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    assert server_name() == "127.0.0.1"
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")  # what a Space sets
    assert server_name() == "0.0.0.0" and server_name("::1") == "::1"


def _load_app():
    """What app.py and `vaswani-mt-demo` run."""
    return importlib.import_module("vaswani_mt.cli.demo")


def test_app_passes_its_host_and_port_flags_to_the_demo(monkeypatch):
    app, calls = _load_app(), []
    monkeypatch.setattr(demo_module, "launch", lambda model, **kwargs: calls.append((model, kwargs)))  # main's
    app.main(["some/model"])
    app.main(["some/model", "--host", "0.0.0.0", "--port", "8000", "--compute_type", "int8"])
    assert calls == [("some/model", {"host": None, "port": None, "compute_type": "float32"}),
                     ("some/model", {"host": "0.0.0.0", "port": 8000, "compute_type": "int8"})]  # fmt: skip


def test_app_ends_with_one_line_naming_a_bad_model_folder(tmp_path, capsys):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{")
    with pytest.raises(SystemExit) as stop:
        _load_app().main([str(folder)])
    message = stop.value.code  # what sys.exit prints to stderr, exit status 1
    assert message.startswith(f"error: {folder}: config.json is not valid JSON") and "\n" not in message
    assert "Traceback" not in capsys.readouterr().err


@pytest.fixture(scope="module")
def served_app(fitted_folder):
    """The demo as `app.py` starts it (no host given, GRADIO_SERVER_NAME unset), in this process on a free port,
    with a queue of QUEUE_SIZE: (its Blocks, its port)."""
    pytest.importorskip("gradio")
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        env.delenv("GRADIO_SERVER_NAME", raising=False)
        env.setenv("HF_HUB_OFFLINE", "1")
        demo = demo_module.launch(str(fitted_folder), port=port, queue_size=QUEUE_SIZE, prevent_thread_lock=True,
                                  quiet=True)  # fmt: skip
    try:
        yield demo, port
    finally:
        demo.close()


@pytest.fixture(scope="module")
def served(served_app) -> int:
    """The served demo's port."""
    return served_app[1]


def _request(port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None, send_body=True):
    """(status, body) of one request, its path sent byte for byte (no client-side normalising of `..`)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for key, value in (headers or {}).items():
            connection.putheader(key, value)
        if send_body and "Transfer-Encoding" not in (headers or {}):
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body if send_body and body else None)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _submit(port: int, data: list) -> tuple[int, dict]:
    """POST /gradio_api/call/translate (the queue's HTTP door): (status, JSON answer)."""
    body = json.dumps({"data": data}).encode()  # ensure_ascii: lone surrogates travel as JSON escapes
    status, answer = _request(port, "POST", "/gradio_api/call/translate", body, {"Content-Type": "application/json"})
    return status, json.loads(answer)


def _result(port: int, event_id: str) -> tuple[str, object]:
    """The event's end: ("complete", [translation, plot, notes]) or ("error", {"error": message, ...})."""
    _, stream = _request(port, "GET", f"/gradio_api/call/translate/{event_id}")
    event = None
    for line in stream.decode().splitlines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: ") and event in ("complete", "error"):
            return event, json.loads(line.removeprefix("data: "))
    raise AssertionError(f"no end in the event stream: {stream[:500]!r}")


def _translate(port: int, data: list) -> tuple[str, object]:
    status, answer = _submit(port, data)
    assert status == 200, answer
    return _result(port, answer["event_id"])


def test_served_demo_listens_on_loopback_only(served):
    import psutil

    listening = [c for c in psutil.Process().net_connections("inet") if c.status == "LISTEN" and c.laddr.port == served]
    assert [c.laddr.ip for c in listening] == ["127.0.0.1"]


def test_served_demo_serves_no_file_whatever_the_path(served, fitted_folder, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret-content")
    targets = [str(secret), "/etc/passwd", str(fitted_folder / "config.json"), str(ROOT / "app.py")]
    up = "/.." * 12  # path traversal: from any folder up to the root, then down to the target
    prefixes = ["file=", "gradio_api/file=", "gradio_api/file", "gradio_api/file=" + up[1:], "gradio_api/file%3D",
                "/gradio_api/file=", "static" + up, "assets" + up, "svelte" + up,
                "gradio_api/custom_component/x/client" + up]  # fmt: skip
    odd = ["/gradio_api/file=%2Fetc%2Fpasswd", "/assets/..%2F..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd",
           "/gradio_api/file=file:///etc/passwd", f"/gradio_api/file=http://127.0.0.1:{served}/config",
           f"/gradio_api/proxy=http://127.0.0.1:{served}/config", "/gradio_api/file=~/.bashrc"]  # fmt: skip
    paths = [f"/{prefix}{target}" for target in targets for prefix in prefixes] + odd
    for path in paths:
        status, body = _request(served, "GET", path)
        assert status in (400, 403, 404), (path, status, body[:200])
        assert b"the-secret-content" not in body and b"root:" not in body and b"model_type" not in body, path
    # The file routes are refused outright (not left to Gradio's allow-list), with a message, and so are uploads.
    refusal = f"the demo serves no files: '/gradio_api/file={secret}'".encode()
    assert _request(served, "GET", f"/gradio_api/file={secret}") == (403, refusal)
    upload = b'--b\r\nContent-Disposition: form-data; name="files"; filename="a.txt"\r\n\r\nx\r\n--b--\r\n'
    for route in ["/gradio_api/upload", "/gradio_api/process_recording"]:
        status, _ = _request(served, "POST", route, upload, {"Content-Type": "multipart/form-data; boundary=b"})
        assert status == 403, route
    assert _request(served, "GET", "/")[0] == 200  # the page itself is served


def test_served_demo_refuses_large_and_unstated_length_bodies_before_reading_them(served):
    path, json_type = "/gradio_api/call/translate", {"Content-Type": "application/json"}
    size = DEMO_MAX_REQUEST_BYTES + 1
    status, body = _request(served, "POST", path, headers={**json_type, "Content-Length": str(size)}, send_body=False)
    assert status == 413 and f"a request body of {size:,} bytes is over the demo's limit".encode() in body
    status, body = _request(served, "POST", path, headers={**json_type, "Transfer-Encoding": "chunked"})
    assert status == 411 and b"send Content-Length" in body
    # The queue's direct route, which would skip both bounds, is closed.
    body = b'{"data": ["x", 1, 0.6, 10, 1, "", false]}'
    status, _ = _request(served, "POST", "/gradio_api/run/translate", body, json_type)
    assert status == 404


def test_served_demo_translates_hostile_text_or_says_why_not(served):
    cases = {
        "\x00\x01\x1b[31mred\x7f": "outside the vocabulary",
        "The girl \ud800 ate an apple.": "lone ones became U+FFFD",  # a lone surrogate, as a JSON escape
        "\u202eThe girl ate an apple.\u202c مرحبا שלום": "outside the vocabulary",
        "😀👩\u200d👩\u200d👧🇩🇪 The girl ate an apple.": "outside the vocabulary",
        "The girl ate an apple. " * 4_350: "text of 100,050 characters cut to the first 5,000",
        " \t\r\n\u3000": "Nothing to translate",
    }
    for text, note in cases.items():
        event, (translation, _, notes) = _translate(served, [text, *SEARCH])
        assert event == "complete" and isinstance(translation, str) and note in notes, (text[:40], notes)
    event, (translation, plot, _) = _translate(served, ["The girl ate an apple.", *SEARCH])
    assert translation == "Das Mädchen hat einen Apfel gegessen." and plot is not None


def test_served_demo_keeps_the_state_of_a_bounded_number_of_sessions(served_app):
    """Every API call is a Gradio session of its own, with a copy of the page's configuration that Gradio keeps (10,000
    sessions by default: a server that grew with every request until then). The demo keeps DEMO_STATE_SESSIONS."""
    demo, port = served_app
    assert demo.state_session_capacity == demo.state_holder.capacity == DEMO_STATE_SESSIONS
    before = len(demo.state_holder.session_data)
    for _ in range(2):
        assert _translate(port, ["The house is small.", *SEARCH])[0] == "complete"
    assert len(demo.state_holder.session_data) == before + 2  # a session a call
    demo.state_holder.capacity = before + 2  # the same bound, reached here
    try:
        for _ in range(4):
            assert _translate(port, ["The house is small.", *SEARCH])[0] == "complete"
        assert len(demo.state_holder.session_data) == before + 2  # the oldest go
    finally:
        demo.state_holder.capacity = DEMO_STATE_SESSIONS


def test_served_demo_refuses_impossible_values_with_a_message(served):
    for data, message in [
        (["x", 100, 0.6, 10, 1, "", False], "Value 100 is greater than maximum value 8."),
        (["x", 1, 0.6], "didn't receive enough input values"),
        (["x", "four", 0.6, 10, 1, "", False], "Could not preprocess input component at index 1"),
    ]:
        event, payload = _translate(served, data)
        assert event == "error" and message in payload["error"], (data, payload)
    body = b'{"data": ["x", NaN, 0.6, 10, 1, "", false]}'  # Python's JSON reader takes NaN; no slider bound refuses it
    _, answer = _request(served, "POST", "/gradio_api/call/translate", body, {"Content-Type": "application/json"})
    event, payload = _result(served, json.loads(answer)["event_id"])
    assert event == "error" and payload["error"] == "Beam size must be a number, not nan"


def test_served_demo_refuses_a_request_beyond_its_queue_with_a_message(served, monkeypatch):
    started, release = threading.Event(), threading.Event()

    def held(*args):  # a translation that lasts until the test lets it go
        started.set()
        release.wait(60)
        return f"held {args[2]}", None, ""

    monkeypatch.setattr(demo_module, "translate_for_demo", held)
    try:
        status, first = _submit(served, ["first", *SEARCH])
        assert status == 200 and started.wait(60)  # one translation at a time: it runs, the next ones wait
        waiting = [_submit(served, [f"waiting {i}", *SEARCH]) for i in range(QUEUE_SIZE)]
        assert [status for status, _ in waiting] == [200] * QUEUE_SIZE
        status, refused = _submit(served, ["one too many", *SEARCH])
    finally:
        release.set()
    assert status == 503 and refused["detail"].startswith(f"Queue is full. Max size is {QUEUE_SIZE}")
    answers = [_result(served, answer["event_id"]) for answer in [first] + [answer for _, answer in waiting]]
    assert [payload[0] for _, payload in answers] == ["held first"] + [f"held waiting {i}" for i in range(QUEUE_SIZE)]
    monkeypatch.undo()
    assert _translate(served, ["How are you today?", *SEARCH])[1][0] == "Wie geht es Ihnen heute?"  # served again


def _wait_until_served(url: str, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"app.py exited: {process.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"app.py did not answer at {url} within {seconds} s")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (.ci/run installs it)")
def test_app_in_headless_chromium_translates_a_typed_sentence_and_draws_the_attention(fitted_folder, tmp_path):
    from playwright import sync_api as playwright  # a dev dependency: missing, the test fails rather than skips

    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1", "HF_HUB_OFFLINE": "1"}
    env["VASWANI_MODEL"] = str(fitted_folder)
    app = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py")], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_until_served(url, app)
        with playwright.sync_playwright() as driver:
            browser = driver.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
                viewport={"width": 1280, "height": 900},
            )  # fmt: skip
            try:
                page = browser.new_page()
                page.goto(url, wait_until="domcontentloaded")
                page.locator("#source textarea").fill("The girl ate an apple.")
                page.locator("#translate").click()
                page.wait_for_function("() => document.querySelector('#translation textarea').value !== ''")
                page.wait_for_selector("#heatmap img", timeout=30_000)
                translation = page.locator("#translation textarea").input_value()
                page.screenshot(path=str(tmp_path / "app.png"), full_page=True)
            finally:
                browser.close()
    finally:
        app.terminate()
        app.wait(timeout=30)
    assert translation == "Das Mädchen hat einen Apfel gegessen."
    assert (tmp_path / "app.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
