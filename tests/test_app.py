"""The demo app for real: `python app.py MODEL` on localhost, driven by headless Chromium through Playwright
(Debian's chromium; .ci/run installs it, and this test is skipped only where it is absent)."""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from vaswani_mt.demo import translate_for_demo
from vaswani_mt.evaluation import load_for_inference

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def test_demo_answers_blank_and_over_long_input_with_a_message(fitted_folder):
    model, tokenizer = load_for_inference(str(fitted_folder), attn_implementation="eager")
    assert translate_for_demo(model, tokenizer, "   ") == ("", None, "Nothing to translate: type a sentence.")
    text = " ".join(["The girl ate an apple."] * 20)
    translation, figure, notes = translate_for_demo(model, tokenizer, text, num_beams=1, max_source_tokens=32)
    assert translation and figure is not None and "cut to the first 32" in notes


def test_search_controls_start_from_the_models_own_generation_config(fitted_folder, tmp_path):
    pytest.importorskip("gradio")
    from transformers import GenerationConfig

    from vaswani_mt.demo import build_demo

    folder = tmp_path / "alpha"
    shutil.copytree(fitted_folder, folder)
    config = GenerationConfig.from_pretrained(folder)
    config.length_penalty, config.num_beams, config.max_len_b = 1.2, 5, 30  # as the main job saves its alpha 1.2
    config.save_pretrained(folder)
    demo = build_demo(str(folder))
    sliders = {block.label: block.value for block in demo.blocks.values() if type(block).__name__ == "Slider"}
    assert sliders["Length penalty α (GNMT)"] == 1.2  # not the paper's 0.6
    assert sliders["Beam size"] == 5 and sliders["Maximum length: input length + b, b ="] == 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_served(url: str, process: subprocess.Popen, seconds: float = 120) -> None:
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

    port = _free_port()
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
