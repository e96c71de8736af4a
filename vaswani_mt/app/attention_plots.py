"""Attention pictures like the paper's appendix figures: encoder self-attention, decoder self-attention and
encoder-decoder attention, per layer and head, from the model's `output_attentions`.

The sentence is translated first, then goes through the model once more with teacher forcing and
`output_attentions=True` (eager attention; the model is switched to it otherwise). Rows of a decoder picture are the
target tokens being predicted; columns are the tokens attended to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from vaswani_mt.model.pipeline_vaswani import default_max_source_tokens, encode_source

KINDS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention (masked)",
    "cross": "encoder-decoder attention",
}


@dataclass
class Attentions:
    """One translated sentence and its attention weights, each of shape (layers, heads, queries, keys)."""

    source_tokens: list[str]
    target_tokens: list[str]  # the predicted tokens (ending in </s> when the search finished)
    decoder_input_tokens: list[str]  # what the decoder read: <s> and the predicted tokens but the last
    translation: str
    encoder: torch.Tensor
    decoder: torch.Tensor
    cross: torch.Tensor
    notes: list[str]
    source_ids: list[int] = field(default_factory=list)  # ending in </s>
    output_ids: list[int] = field(default_factory=list)  # the translation's tokens, without <s>, </s> or padding

    def weights(self, kind: str) -> torch.Tensor:
        return getattr(self, kind)

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of a picture of `kind`."""
        if kind == "encoder":
            return self.source_tokens, self.source_tokens
        if kind == "decoder":
            return self.target_tokens, self.decoder_input_tokens
        return self.target_tokens, self.source_tokens


@torch.no_grad()
def translate_with_attention(
    model, tokenizer, text: str, max_source_tokens: int | None = None, **generate_kwargs
) -> Attentions:
    """Translates `text` (a `Translator` with `generate_kwargs`, hard word alignments) and returns the attention
    weights of every head of that translation, from a teacher-forced pass (batch of one)."""
    from vaswani_mt.inference.translator import Translator

    if not text.strip():
        raise ValueError("nothing to translate: the text is empty")
    if model.config._attn_implementation != "eager":
        model.set_attn_implementation("eager")
    notes: list[str] = []
    ids = encode_source(tokenizer, text, max_source_tokens or default_max_source_tokens(model, tokenizer), notes)
    aligned = Translator(model, tokenizer, max_source_tokens=max_source_tokens, alignments="hard",
                         generate_kwargs=generate_kwargs).translate([text])[0]  # fmt: skip
    outputs = [*aligned.target_ids, tokenizer.eos_token_id]  # the tokens predicted
    source = torch.tensor([ids], device=model.device)
    decoder_input = torch.tensor([[model.config.decoder_start_token_id, *outputs[:-1]]], device=model.device)
    out = model(input_ids=source, attention_mask=torch.ones_like(source), decoder_input_ids=decoder_input,
                output_attentions=True, use_cache=False)  # fmt: skip
    tokens = tokenizer.convert_ids_to_tokens
    return Attentions(
        source_tokens=tokens(ids), target_tokens=tokens(outputs),
        decoder_input_tokens=tokens(decoder_input[0].tolist()),
        translation=str(aligned), encoder=torch.stack(out.encoder_attentions)[:, 0].float().cpu(),
        decoder=torch.stack(out.decoder_attentions)[:, 0].float().cpu(),
        cross=torch.stack(out.cross_attentions)[:, 0].float().cpu(), notes=notes, source_ids=list(ids),
        output_ids=list(aligned.target_ids),
    )  # fmt: skip


def aligned_attentions(tokenizer, aligned, notes: list[str]) -> Attentions:
    """The encoder-decoder attention an `AlignedTranslation` keeps (each layer's mean of the heads, as one head) as
    `Attentions` for `heatmap_figure`, with `notes`; no self-attention."""
    tokens = tokenizer.convert_ids_to_tokens
    outputs = [*aligned.target_ids, tokenizer.eos_token_id]
    empty = torch.zeros(0)
    cross = (
        aligned.attention[:, None] if aligned.attention is not None else torch.zeros(1, 1, 1, len(aligned.source_ids))
    )
    return Attentions(tokens(aligned.source_ids), tokens(outputs), [], str(aligned), empty, empty, cross, notes,
                      list(aligned.source_ids), list(aligned.target_ids))  # fmt: skip


def link_boxes(aligned) -> list[tuple[int, int, int, int]]:
    """(first column, first row, columns, rows) of the token cells each word link of `aligned` covers: the source
    word's tokens by the target word's tokens, in the heatmap's coordinates."""
    boxes = []
    for s, t in aligned.links:
        columns = [k for k, word in enumerate(aligned.source_index) if word == s]
        rows = [k for k, word in enumerate(aligned.target_index) if word == t]
        if columns and rows:
            boxes.append((min(columns), min(rows), max(columns) - min(columns) + 1, max(rows) - min(rows) + 1))
    return boxes


def _draw(ax, weights: torch.Tensor, rows: list[str], columns: list[str], title: str, fontsize: float) -> None:
    # matplotlib reads a label holding two "$" as mathtext: "$x$" would lose its dollars and "$\frac{$" would fail
    # to draw. Escaped, every token is drawn as it is.
    rows, columns = ([token.replace("$", r"\$") for token in tokens] for tokens in (rows, columns))
    ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(rows)), rows, fontsize=fontsize)
    ax.set_title(title, fontsize=fontsize + 2)


def heatmap_figure(attentions: Attentions, kind: str = "cross", layer: int = -1, head: int | None = None,
                   boxes: list[tuple[int, int, int, int]] = ()):  # fmt: skip
    """One matplotlib figure: the `kind` attention of one layer, one head or (head=None) the mean of its heads, with
    `boxes` (`link_boxes`: word alignment links) outlined. (A bare `Figure`, outside pyplot's registry, so that a
    server drawing many of them does not keep them.)"""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    weights = attentions.weights(kind)[layer]
    weights = weights.mean(0) if head is None else weights[head]
    rows, columns = attentions.labels(kind)
    figure = Figure(figsize=(max(4.0, 0.35 * len(columns) + 2), max(3.0, 0.3 * len(rows) + 1.5)))
    ax = figure.subplots()
    layer_number = layer % attentions.weights(kind).shape[0] + 1
    which = "mean of the heads" if head is None else f"head {head + 1}"
    _draw(ax, weights, rows, columns, f"{KINDS[kind]}, layer {layer_number}, {which}", 9)
    for column, row, width, height in boxes:
        ax.add_patch(Rectangle((column - 0.5, row - 0.5), width, height, fill=False, edgecolor="red", linewidth=1.5))
    if boxes:
        ax.set_xlabel("red: the word alignment (--alignments hard)", fontsize=9)
    figure.colorbar(ax.images[0], ax=ax, fraction=0.046, pad=0.04)
    figure.tight_layout()
    return figure


def plot_attentions(attentions: Attentions, output_dir: str | Path) -> list[Path]:
    """Writes one PNG per kind and layer, each a grid of that layer's heads (`encoder_layer1.png`,
    `decoder_layer1.png`, `cross_layer1.png`, ...). Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in KINDS:
        weights = attentions.weights(kind)
        rows, columns = attentions.labels(kind)
        num_layers, num_heads = weights.shape[:2]
        grid = min(num_heads, 4)
        lines = -(-num_heads // grid)
        size = max(3.0, 0.22 * max(len(rows), len(columns)) + 1.5)
        fontsize = 7 if max(len(rows), len(columns)) < 30 else 5
        for layer in range(num_layers):
            figure, axes = plt.subplots(lines, grid, figsize=(size * grid, size * lines), squeeze=False)
            for head in range(lines * grid):
                ax = axes[head // grid][head % grid]
                if head < num_heads:
                    _draw(ax, weights[layer, head], rows, columns, f"head {head + 1}", fontsize)
                else:
                    ax.axis("off")
            figure.suptitle(f"{KINDS[kind]}, layer {layer + 1} of {num_layers}")
            figure.tight_layout()
            path = output_dir / f"{kind}_layer{layer + 1}.png"
            figure.savefig(path, dpi=100)
            plt.close(figure)
            paths.append(path)
    return paths


def visualize(model: str, text: str, output_dir: str | Path, **generate_kwargs) -> tuple[Attentions, list[Path]]:
    """`scripts/visualize_attention.py`: loads the model (eager attention), translates `text`, writes the PNGs."""
    from vaswani_mt.inference.loading import load_for_inference

    loaded, tokenizer = load_for_inference(model, attn_implementation="eager")
    attentions = translate_with_attention(loaded, tokenizer, text, **generate_kwargs)
    return attentions, plot_attentions(attentions, output_dir)


__all__ = [
    "KINDS",
    "Attentions",
    "aligned_attentions",
    "heatmap_figure",
    "link_boxes",
    "plot_attentions",
    "translate_with_attention",
    "visualize",
]
