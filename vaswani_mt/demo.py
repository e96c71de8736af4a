"""The demo web app (Gradio) of a Hub Space: source text in, translation out, beam size and length options, and
the encoder-decoder attention of the translation as a heatmap. `app.py` at the top of the repository starts it.

Offline by construction: Gradio's analytics and Hugging Face telemetry are switched off before Gradio is imported,
and the theme uses the browser's own fonts (Gradio's default theme fetches web fonts).
"""

from __future__ import annotations

import os

# Before gradio is imported: it reads these at import time.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

# The demo's longest source, in tokens: the training pairs were at most 256 tokens long (`--max_source_length`),
# and a CPU Space stays responsive. Longer text is cut, and the page says so.
DEMO_MAX_SOURCE_TOKENS = 256


def translate_for_demo(model, tokenizer, text: str, num_beams: int = 4, alpha: float = 0.6, extra_tokens: int = 50,
                       layer: int = 0, max_source_tokens: int = DEMO_MAX_SOURCE_TOKENS) -> tuple:  # fmt: skip
    """What the page shows for `text`: (translation, heatmap figure or None, notes in markdown).

    `extra_tokens` is b of the maximum output length |X| + b (§6.1: 50), `alpha` the GNMT length penalty, `layer`
    the decoder layer whose encoder-decoder attention is drawn (1-based; 0 = the last), averaged over its heads.
    """
    from .attention_plots import heatmap_figure, translate_with_attention

    if not text or not text.strip():
        return "", None, "Nothing to translate: type a sentence."
    attentions = translate_with_attention(
        model, tokenizer, text, max_source_tokens=max_source_tokens, num_beams=int(num_beams),
        length_penalty=float(alpha), max_len_a=1, max_len_b=int(extra_tokens),
    )  # fmt: skip
    num_layers = attentions.cross.shape[0]
    index = int(layer) - 1 if 1 <= int(layer) <= num_layers else num_layers - 1
    figure = heatmap_figure(attentions, "cross", layer=index)
    notes = "\n".join(f"- {note}" for note in attentions.notes)
    return attentions.translation, figure, notes


def build_demo(model_id: str, max_source_tokens: int = DEMO_MAX_SOURCE_TOKENS):
    """The Gradio Blocks app for the vaswani_mt model in `model_id` (folder or Hub id), loaded with eager attention."""
    import gradio as gr

    from .evaluation import load_for_inference

    model, tokenizer = load_for_inference(model_id, attn_implementation="eager")
    layers = model.config.num_decoder_layers
    search = model.generation_config  # the controls start from the model's own search (its saved alpha, say)
    beams = int(getattr(search, "num_beams", None) or 4)
    alpha = float(getattr(search, "length_penalty", None) or 0.0)
    extra_tokens = int(getattr(search, "max_len_b", None) or 50)
    card = f"Model: `{model_id}` ({model.config.num_encoder_layers}+{layers} layers, d_model {model.config.d_model})"

    def run(text, num_beams, alpha, extra_tokens, layer):
        return translate_for_demo(model, tokenizer, text, num_beams, alpha, extra_tokens, layer, max_source_tokens)

    with gr.Blocks(title="vaswani_mt: Attention Is All You Need") as demo:
        gr.Markdown(
            "# Attention Is All You Need: translation demo\n"
            f"{card}. Search: beam search with the GNMT length penalty (§6.1). Inputs longer than "
            f"{max_source_tokens} tokens are cut."
        )
        with gr.Row():
            with gr.Column():
                source = gr.Textbox(label="Source text", lines=3, elem_id="source")
                with gr.Accordion("Search options", open=True):
                    num_beams = gr.Slider(1, 8, value=min(beams, 8), step=1, label="Beam size", elem_id="num_beams")
                    alpha = gr.Slider(0.0, 2.0, value=min(alpha, 2.0), step=0.1, label="Length penalty α (GNMT)",
                                      elem_id="alpha")  # fmt: skip
                    extra = gr.Slider(1, 200, value=min(max(extra_tokens, 1), 200), step=1,
                                      label="Maximum length: input length + b, b =")  # fmt: skip
                    layer = gr.Slider(1, layers, value=layers, step=1, label="Decoder layer of the heatmap")
                button = gr.Button("Translate", variant="primary", elem_id="translate")
            with gr.Column():
                translation = gr.Textbox(label="Translation", lines=3, interactive=False, elem_id="translation")
                notes = gr.Markdown(elem_id="notes")
                heatmap = gr.Plot(show_label=False, elem_id="heatmap")
        inputs = [source, num_beams, alpha, extra, layer]
        button.click(run, inputs, [translation, heatmap, notes])
        source.submit(run, inputs, [translation, heatmap, notes])
    return demo


def launch(model_id: str, host: str = "127.0.0.1", port: int | None = None, **kwargs):
    """Starts the app (blocking). Gradio reads GRADIO_SERVER_NAME / GRADIO_SERVER_PORT when these are not given."""
    import gradio as gr

    demo = build_demo(model_id)
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", host),
        server_port=port or int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        theme=gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["monospace"]),
        **kwargs,
    )


__all__ = ["DEMO_MAX_SOURCE_TOKENS", "build_demo", "launch", "translate_for_demo"]
