"""The demo web app (Gradio) of a Hub Space: source text in, translation out, beam size and length options, and
the encoder-decoder attention of the translation as a heatmap. `app.py` at the top of the repository starts it.

Offline by construction: Gradio's analytics and Hugging Face telemetry are switched off before Gradio is imported,
and the theme uses the browser's own fonts (Gradio's default theme fetches web fonts).

Least privilege: it listens on 127.0.0.1 unless told otherwise (the `host` argument, else GRADIO_SERVER_NAME, which
a Space sets to 0.0.0.0); its work is bounded (one translation at a time, at most `DEMO_QUEUE_SIZE` waiting, a
request body of at most `DEMO_MAX_REQUEST_BYTES`, a text of at most `DEMO_MAX_CHARACTERS`), and it serves no file:
it has no file input or output (the heatmap travels inside the answer as a PNG in base64), so Gradio's file, upload
and proxy routes are refused outright rather than left to Gradio's allow-list and its environment variables.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from collections.abc import Iterator

from vaswani_mt.model.constraints_vaswani import phrase_forms
from vaswani_mt.model.pipeline_vaswani import unusual_pieces


def _import_gradio_quietly():
    """gradio, imported with its analytics and telemetry off unless the environment says otherwise: it reads these
    variables when first imported, so the demo sets them then (and importing this module changes nothing)."""
    quiet = {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}
    for name, value in quiet.items():
        os.environ.setdefault(name, value)
    import gradio

    return gradio


# The demo's longest source, in tokens: the training pairs were at most 256 tokens long (`--max_source_length`),
# and a CPU Space stays responsive. Longer text is cut, and the page says so.
DEMO_MAX_SOURCE_TOKENS = 256
# The longest text the demo reads, in characters, cut before tokenizing: 256 tokens are rarely over 2,000
# characters, and a pasted book costs no more than a paragraph. The text box stops typing there too.
DEMO_MAX_CHARACTERS = 5_000
# One translation at a time: torch already spreads one over a CPU Space's two cores, so a second at once would
# only share them. Up to DEMO_QUEUE_SIZE more wait; beyond that Gradio's queue refuses at once (HTTP 503, "Queue is
# full") instead of letting waits grow without bound.
DEMO_WORKERS = 1
DEMO_QUEUE_SIZE = 16
# The largest request body, refused before it is read: a 100,000-character line of any script written as JSON
# escapes (12 bytes a character outside the BMP) fits, a multi-megabyte upload does not.
DEMO_MAX_REQUEST_BYTES = 2 * 1024 * 1024
# Sessions whose state Gradio keeps (its `state_session_capacity`, 10,000 by default): every API call is a session
# of its own, and each keeps a copy of the page's configuration, about 150 KB here, so the server grew by ~15 MiB
# per 100 requests until the 10,000th (`benchmarks/demo_load.py --waves`). The demo keeps no state between
# requests; a session evicted from this cache only has its copy made again.
DEMO_STATE_SESSIONS = 64
# The heatmap's longest side in pixels. Drawn at 0.35 inch a token, 256 source tokens by 300 target tokens make a
# 9,000 × 9,000-pixel picture: seconds to render and 300 MB of the server's memory, for a page column that shows it
# scaled down to 600 pixels anyway. Above this the picture keeps its layout at a lower resolution.
DEMO_MAX_FIGURE_PIXELS = 2_000
# Gradio's routes that read or write files (`/gradio_api/file=...`, the older `/gradio_api/file/...`, uploads, the
# URL proxy, recordings written to disk for ffmpeg, and media streams, which serve a file they write): the demo has
# no files, so none of them has anything of its own to serve. Its page, scripts and styles (`/`, `/assets/...`,
# `/static/...`) come from other routes, which serve Gradio's own build folder only.
_FILE_ROUTES = re.compile(r"/gradio_api/(file[=/]|proxy=|upload(_progress)?/?$|process_recording|stream/)")


def translate_for_demo(model, tokenizer, text: str, num_beams: int = 4, length_penalty: float = 0.6,
                       max_len_b: int = 50, layer: int = 0, max_source_tokens: int = DEMO_MAX_SOURCE_TOKENS,
                       max_characters: int = DEMO_MAX_CHARACTERS, terms: str = "",
                       markup: bool = False) -> tuple:  # fmt: skip
    """What the page shows for `text`: (translation, heatmap figure or None, notes in markdown), through the
    `Translator` with these `TranslationOptions` fields and hard word alignments.

    `max_len_b` is b of the maximum output length |X| + b (§6.1: 50), `length_penalty` the GNMT alpha, `layer`
    the decoder layer whose encoder-decoder attention is drawn (1-based; 0 = the last), averaged over its heads,
    with the word alignment's links outlined. A text over `max_characters` is cut there before it is tokenized, and
    the notes say so. `terms`: comma-separated terms the translation must contain (terminology constraints, each
    its target text or `source ||| target`; the notes say which it does). `markup`: inline XML tags and
    placeholders carried through by that alignment and the search's placed terms: the translator's markup stage
    itself (`take_out_markup`, then `put_back`).
    """
    from vaswani_mt.app.attention_plots import aligned_attentions, heatmap_figure, link_boxes
    from vaswani_mt.inference.controls import ControlReport
    from vaswani_mt.inference.markup import put_back, take_out_markup
    from vaswani_mt.inference.terms import term_sides
    from vaswani_mt.inference.translator import Translator

    notes = []
    if text and len(text) > max_characters:
        notes.append(f"text of {len(text):,} characters cut to the first {max_characters:,} (the demo's limit)")
        text = text[:max_characters]
    if not text or not text.strip():
        return "", None, "Nothing to translate: type a sentence."
    plan = take_out_markup([text])[0] if markup else None
    if plan is not None and plan.broken:
        notes.append(f"markup: broken ({plan.broken}): translated as plain text")
    if plan is not None:
        text = plan.text
    wanted = [term.strip() for term in (terms or "").split(",") if term.strip()]
    try:
        sides = [term_sides(term) for term in wanted]  # `source ||| target`: the tag around the source wraps it
        for _, term in sides:
            phrase_forms(tokenizer, term)
            notes += [f"must contain: {note}" for note in [unusual_pieces(tokenizer, term)] if note]
    except ValueError as error:
        notes.append(f"must contain: {error}; translated without the terms")
        wanted, sides = [], []
    if plan is not None:
        plan.terms, plan.sources = [term for _, term in sides], [source for source, _ in sides]
    if wanted and int(num_beams) < 2:
        notes.append("must contain: terms need a beam of 2 or more; searched with 4")
        num_beams = 4
    translator = Translator(model, tokenizer, num_beams=int(num_beams), length_penalty=float(length_penalty),
                            max_len_a=1, max_len_b=int(max_len_b), max_source_tokens=max_source_tokens,
                            alignments="hard", constraints="unordered" if wanted else None)  # fmt: skip
    report = ControlReport()  # which terms were met: the search's word, not a substring test on the text
    with _warnings_as_notes() as warned:
        aligned = translator.translate([text], terms=[wanted] if wanted else None, report=report)[0]
    if wanted:
        unmet = report.unmet.get(1, [])
        notes.append("must contain: " + ", ".join(
            f"{term} {'✗ not met (no room within the length limit)' if term in unmet else '✓ met'}" for _, term in sides
        ))  # fmt: skip
    attentions = aligned_attentions(tokenizer, aligned, warned)
    num_layers = attentions.cross.shape[0]
    index = int(layer) - 1 if 1 <= int(layer) <= num_layers else num_layers - 1
    figure = heatmap_figure(attentions, "cross", layer=index, boxes=link_boxes(aligned))
    figure.set_dpi(min(figure.get_dpi(), DEMO_MAX_FIGURE_PIXELS / max(figure.get_size_inches())))
    output = str(aligned)
    if plan is not None:
        output, problem = put_back(plan, aligned)
        if problem == "directives":
            notes.append("markup: the format directives could not all be placed: put at the end")
        elif problem is not None:  # one text's failure is that text's: the demo goes on
            notes.append(f"markup: not put back ({problem}): the source is shown")
    notes = "\n".join(f"- {note}" for note in [*notes, *attentions.notes])
    return output, figure, notes


@contextlib.contextmanager
def _warnings_as_notes() -> Iterator[list[str]]:
    """The warnings that vaswani_mt logs inside the block (a source cut, characters outside the vocabulary, a term
    that could not be met), without their "line 1: ", for the page's notes."""
    notes: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                notes.append(record.getMessage().removeprefix("line 1: "))

    handler, root = Collect(), logging.getLogger("vaswani_mt")
    root.addHandler(handler)
    try:
        yield notes
    finally:
        root.removeHandler(handler)


def build_demo(model_id: str, max_source_tokens: int = DEMO_MAX_SOURCE_TOKENS, *,
               max_characters: int = DEMO_MAX_CHARACTERS, workers: int = DEMO_WORKERS,
               queue_size: int = DEMO_QUEUE_SIZE, compute_type: str = "float32"):  # fmt: skip
    """The Gradio Blocks app for the vaswani_mt model in `model_id` (folder or Hub id), loaded with eager attention
    and `compute_type` (`load_for_inference`), behind a queue of `queue_size` requests that `workers` translations at
    a time drain."""
    gr = _import_gradio_quietly()

    from vaswani_mt.inference.loading import load_for_inference
    from vaswani_mt.system import return_freed_memory

    # ModelFolderError, or ValueError for a compute type this machine cannot run well: one line
    model, tokenizer = load_for_inference(model_id, attn_implementation="eager", compute_type=compute_type)
    layers = model.config.num_decoder_layers
    search = model.generation_config  # the controls start from the model's own search (its saved alpha, say)
    beams = int(getattr(search, "num_beams", None) or 4)
    alpha = float(getattr(search, "length_penalty", None) or 0.0)
    extra_tokens = int(getattr(search, "max_len_b", None) or 50)
    card = f"Model: `{model_id}` ({model.config.num_encoder_layers}+{layers} layers, d_model {model.config.d_model})"

    def run(text, num_beams, length_penalty, max_len_b, layer, terms="", markup=False):
        # The sliders bound their values, but not against NaN (JSON from the API may carry one): refused here with
        # a message, as Gradio refuses a value out of range, rather than failing inside the search.
        options = {"Beam size": num_beams, "α": length_penalty, "b": max_len_b, "Layer": layer}
        for name, value in options.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise gr.Error(f"{name} must be a number, not {value!r}")
        return_freed_memory()  # what the last answer's picture (drawn by Gradio after `run`) left behind
        try:
            return translate_for_demo(
                model,
                tokenizer,
                text,
                num_beams,
                length_penalty,
                max_len_b,
                layer,
                max_source_tokens,
                max_characters,
                terms if isinstance(terms, str) else "",
                markup is True,
            )
        finally:
            return_freed_memory()

    with gr.Blocks(title="vaswani_mt: Attention Is All You Need") as demo:
        gr.Markdown(
            "# Attention Is All You Need: translation demo\n"
            f"{card}. Search: beam search with the GNMT length penalty (§6.1). Inputs longer than "
            f"{max_characters:,} characters or {max_source_tokens} tokens are cut. Translations run "
            f"{workers} at a time; when {queue_size} are waiting, the page asks you to try again."
        )
        with gr.Row():
            with gr.Column():
                source = gr.Textbox(label="Source text", lines=3, max_length=max_characters, elem_id="source")
                must = gr.Textbox(label="Must contain (comma-separated terms)", max_length=max_characters,
                                  elem_id="terms")  # fmt: skip
                markup = gr.Checkbox(label="Keep XML tags and placeholders ({0}, %s) by word alignment", value=False,
                                     elem_id="markup")  # fmt: skip
                with gr.Accordion("Search options", open=True):
                    num_beams = gr.Slider(1, 8, value=min(beams, 8), step=1, label="Beam size", elem_id="num_beams")
                    alpha = gr.Slider(0.0, 2.0, value=min(alpha, 2.0), step=0.1, label="Length penalty α (GNMT)",
                                      elem_id="length_penalty")  # fmt: skip
                    extra = gr.Slider(1, 200, value=min(max(extra_tokens, 1), 200), step=1,
                                      label="Maximum length: input length + b, b =", elem_id="max_len_b")  # fmt: skip
                    layer = gr.Slider(1, layers, value=layers, step=1, label="Decoder layer of the heatmap",
                                      elem_id="layer")  # fmt: skip
                button = gr.Button("Translate", variant="primary", elem_id="translate")
            with gr.Column():
                translation = gr.Textbox(label="Translation", lines=3, interactive=False, elem_id="translation")
                notes = gr.Markdown(elem_id="notes")
                heatmap = gr.Plot(show_label=False, elem_id="heatmap")
        # One event for the button and Enter, so that both share the one concurrency limit (two events would get
        # a limit each); its API name is /translate.
        inputs, outputs = [source, num_beams, alpha, extra, layer, must, markup], [translation, heatmap, notes]
        gr.on([button.click, source.submit], run, inputs, outputs, api_name="translate")
    # api_open=False: off a Space, Gradio opens /gradio_api/run/translate, a route that skips the queue and with it
    # both bounds; closed, it answers 404 and every request goes through the queue.
    return demo.queue(max_size=queue_size, default_concurrency_limit=workers, api_open=False)


class _RefuseFilesAndLargeBodies:
    """ASGI middleware in front of Gradio: refuses (403) its file, upload and proxy routes, and any request whose
    body is over `max_body_bytes` (413) or of unstated length (411), before Gradio reads a byte of it."""

    def __init__(self, app, max_body_bytes: int = DEMO_MAX_REQUEST_BYTES):
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope, receive, send):
        refusal = _refusal(scope, self.max_body_bytes) if scope["type"] == "http" else None
        if refusal is None:
            return await self.app(scope, receive, send)
        from starlette.responses import PlainTextResponse

        await PlainTextResponse(refusal[1], status_code=refusal[0])(scope, receive, send)


def _refusal(scope: dict, max_body_bytes: int) -> tuple[int, str] | None:
    """(status, message) for a request the demo refuses, or None. `scope["path"]` is percent-decoded, as the router
    that would match it sees it."""
    path = scope["path"]
    if _FILE_ROUTES.search(path):
        return 403, f"the demo serves no files: {path!r}"
    headers = dict(scope["headers"])
    length = headers.get(b"content-length")
    if length is None:
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            return 411, f"a request body of unstated length ({scope['method']} {path!r}): send Content-Length"
        return None
    if not length.isdigit():
        return 400, f"Content-Length {length.decode('latin-1')!r} is not a number of bytes"
    if int(length) > max_body_bytes:
        return 413, f"a request body of {int(length):,} bytes is over the demo's limit of {max_body_bytes:,} bytes"
    return None


def server_name(host: str | None = None) -> str:
    """The address the demo listens on: `host` when given, else GRADIO_SERVER_NAME (a Space sets 0.0.0.0), else
    127.0.0.1, reachable from this machine only."""
    return host or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"


def launch(model_id: str, host: str | None = None, port: int | None = None, *, workers: int = DEMO_WORKERS,
           queue_size: int = DEMO_QUEUE_SIZE, max_body_bytes: int = DEMO_MAX_REQUEST_BYTES,
           compute_type: str = "float32", **kwargs):  # fmt: skip
    """Starts the app and returns its Blocks; blocks until the server stops unless `prevent_thread_lock=True` is
    among `kwargs` (the rest go to Gradio's `launch`). The address is `server_name(host)`, the port `port`, else
    GRADIO_SERVER_PORT, else 7860. A model folder that cannot be served raises `ModelFolderError` (one line) before
    anything listens. No public share link unless `share=True` is given (GRADIO_SHARE alone does not open one)."""
    gr = _import_gradio_quietly()
    from starlette.middleware import Middleware

    demo = build_demo(model_id, workers=workers, queue_size=queue_size, compute_type=compute_type)
    demo.launch(
        server_name=server_name(host),
        server_port=port or int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        theme=gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["monospace"]),
        app_kwargs={"middleware": [Middleware(_RefuseFilesAndLargeBodies, max_body_bytes=max_body_bytes)]},
        # Nothing the demo does not need: no traffic dashboard, MCP server, Node renderer or Hub-backed run history.
        enable_monitoring=False, mcp_server=False, ssr_mode=False, run_history=False,
        state_session_capacity=DEMO_STATE_SESSIONS,
        # show_error: a request Gradio refuses before the translation runs (too few values, a word for a number)
        # gets Gradio's one-line reason instead of a bare "error"; the demo's own failures are messages already.
        **{"share": False, "show_error": True, **kwargs},
    )  # fmt: skip
    return demo


__all__ = [
    "DEMO_MAX_CHARACTERS", "DEMO_MAX_FIGURE_PIXELS", "DEMO_MAX_REQUEST_BYTES", "DEMO_MAX_SOURCE_TOKENS",
    "DEMO_QUEUE_SIZE", "DEMO_STATE_SESSIONS", "DEMO_WORKERS", "build_demo", "launch", "server_name",
    "translate_for_demo",
]  # fmt: skip
