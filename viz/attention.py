"""Attention maps: heatmaps of a model's attention weights, tokens on both axes.

Rows are queries (the position attending), columns keys (the position attended to). The cells a
causal model may not look at, above the diagonal, are masked and drawn white, so they read as
empty rather than as a weight of 0, which the colour map draws dark. The maps are drawn by
`heatmap.py` straight into pixels; the matplotlib figure here is its reference and draws the
seed example, whose weights are written in the cells (with the Agg canvas, never pyplot, so
nothing needs a display or leaves global state behind).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from minigpt.common import UsageError
from minigpt.data import Tokenizer
from minigpt.model import GPT, MultiHeadAttention

from .heatmap import colour_scale, crop, heatmap_png, tick_points

if TYPE_CHECKING:  # matplotlib (~0.3 s) is imported where a figure is drawn; the server only labels tokens
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage

MAX_TOKENS = 64
"""Most tokens drawn per axis; a longer context shows its last MAX_TOKENS positions."""
VISIBLE = {"\n": "⏎", "\r": "␍", "\t": "⇥", " ": "␣"}
"""Characters a tick label would show as nothing, and what it shows instead."""

SEED_WORDS = ("Your", "journey", "starts", "with", "one", "step")
SEED_INPUTS = (
    (0.43, 0.15, 0.89),
    (0.55, 0.87, 0.66),
    (0.57, 0.85, 0.64),
    (0.22, 0.58, 0.33),
    (0.77, 0.25, 0.10),
    (0.05, 0.80, 0.55),
)
"""The design documents' 3-d embeddings of SEED_WORDS, one row per word."""


def visible_token(text: str) -> str:
    """`text` with whitespace and control characters made visible ("\\n" -> "⏎", " " -> "␣")."""
    if text == "":
        return "∅"
    return "".join(VISIBLE.get(c, c if c.isprintable() else f"\\x{ord(c):02x}") for c in text)


def token_labels(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """One readable label per token id, each token decoded alone.

    A byte-level BPE token holding part of a UTF-8 character decodes alone to "\ufffd"; the label
    shows that rather than guess the character.
    """
    return [visible_token(tokenizer.decode([i])) for i in ids]


def causal_masked(weights: np.ndarray | torch.Tensor) -> np.ma.MaskedArray:
    """Square weights (T, T) as float64 with the cells above the diagonal masked."""
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().float().cpu().numpy()
    data = np.asarray(weights, dtype=np.float64)
    return np.ma.masked_array(data, mask=np.triu(np.ones(data.shape, dtype=bool), k=1))


def layer_figure(
    weights: np.ndarray | torch.Tensor,
    labels: Sequence[str],
    *,
    title: str = "",
    annotate: bool = False,
    max_tokens: int = MAX_TOKENS,
) -> Figure:
    """One layer's weights (n_head, T, T) as a matplotlib figure with a panel per head, titled
    "head h"; `annotate` writes each weight in its cell.

    The picture `heatmap.heatmap_png` draws in a fraction of the time, which the maps use; this one
    is its reference and draws the seed example, whose weights are written in the cells."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keep, title = crop(labels, title, max_tokens)
    shown = len(labels[keep])
    cols = math.ceil(math.sqrt(len(weights)))
    rows = math.ceil(len(weights) / cols)
    # Inches per panel: about 13 pt a cell at 64 tokens; written weights need wider cells.
    panel = max(5.0 if annotate else 3.5, 0.18 * shown)
    fig = Figure(figsize=(cols * panel + 1.5, rows * panel + 1.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for h, (ax, head) in enumerate(zip(axes, weights, strict=False)):
        image = _draw_head(ax, causal_masked(head)[keep, keep], labels[keep], annotate)
        ax.set_title(f"head {h}")
    for ax in axes[len(weights) :]:
        ax.set_visible(False)
    fig.colorbar(image, ax=list(axes[: len(weights)]), shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title)
    return fig


def _draw_head(ax: Axes, weights: np.ma.MaskedArray, labels: Sequence[str], annotate: bool) -> AxesImage:
    """Draw (T, T) masked weights on `ax`; the image, for the colour bar."""
    t = len(labels)
    font = tick_points(t)
    cmap, norm = colour_scale()
    image = ax.imshow(weights, cmap=cmap, norm=norm, interpolation="nearest")
    # Characters fit a column as they are; longer tokens need upright labels in long contexts and
    # read better slanted in short ones.
    if max(map(len, labels)) <= 2:
        slant = {}
    else:
        slant = dict(rotation=90) if t > 12 else dict(rotation=45, ha="right", rotation_mode="anchor")
    ax.set_xticks(range(t), labels, fontsize=font, **slant)
    ax.set_yticks(range(t), labels, fontsize=font)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending from)")
    if annotate:
        for i, j in zip(*np.tril_indices(t), strict=True):
            w = float(weights[i, j])
            # Dark text on viridis' bright end, light text on its dark end.
            ax.text(j, i, f"{w:.3f}", ha="center", va="center", fontsize=font, color="k" if w > 0.6 else "w")
    return image


def figure_to_png(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes, `figsize * dpi` pixels (for files, wandb images, HTML reports)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def select_layers(n_layer: int, layers: Sequence[int] | None) -> list[int]:
    """Layer indices in [0, n_layer), from `layers` (None: all; negative counts from the end)."""
    if layers is None:
        return list(range(n_layer))
    if not layers:
        raise UsageError("no layers chosen: name at least one, or leave the option out for all")
    chosen: list[int] = []
    for layer in layers:
        if not -n_layer <= layer < n_layer:
            raise UsageError(
                f"layer {layer} does not exist: the model has {n_layer} layers"
                f" (0 to {n_layer - 1}; -1 is the last)"
            )
        if layer % n_layer not in chosen:
            chosen.append(layer % n_layer)
    return chosen


def attention_pngs(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    *,
    layers: Sequence[int] | None = None,
    per_head: bool = False,
    max_tokens: int = MAX_TOKENS,
    dpi: float = 100,
) -> dict[str, bytes]:
    """The attention maps of `prompt` as PNGs: "layer{i}" grids, and "layer{i}_head{h}" with `per_head`.

    A prompt longer than the model's context is cropped to its last `context_length` tokens, as
    the model would see it. Raises UsageError for an empty prompt or a layer the model lacks, and
    the tokenizer's DataError for text it cannot encode.
    """
    weights, labels = attention_of(model, tokenizer, prompt, layers=layers)
    return draw_attention(weights, labels, prompt, per_head=per_head, max_tokens=max_tokens, dpi=dpi)


def attention_of(
    model: GPT, tokenizer: Tokenizer, prompt: str, *, layers: Sequence[int] | None = None
) -> tuple[dict[int, np.ndarray], list[str]]:
    """What `attention_pngs` draws, computed and not drawn: the weights (n_head, T, T) of the
    chosen layers, by layer, in fp32 on the host, and one label per token."""
    if prompt == "":
        raise UsageError("the prompt is empty: pass the text whose attention to draw")
    chosen = select_layers(model.config.n_layer, layers)
    ids = tokenizer.encode(prompt)[-model.config.context_length :]
    idx = torch.tensor([ids], device=model.lm_head.weight.device)
    weights = model.attention_weights(idx)
    return {layer: weights[layer][0].float().cpu().numpy() for layer in chosen}, token_labels(tokenizer, ids)


def draw_attention(
    weights: dict[int, np.ndarray],
    labels: Sequence[str],
    prompt: str,
    *,
    per_head: bool = False,
    max_tokens: int = MAX_TOKENS,
    dpi: float = 100,
) -> dict[str, bytes]:
    """`attention_pngs` from what `attention_of` computed. Needs no model and no torch, so it can
    run in another process."""
    pngs = {}
    for layer, heads in weights.items():  # heads: (n_head, T, T)
        title = (
            f'layer {layer}: attention over "{visible_token(prompt[:40])}{"…" if len(prompt) > 40 else ""}"'
        )
        keep, title = crop(labels, title, max_tokens)
        shown = [w[keep, keep] for w in heads]
        pngs[f"layer{layer}"] = heatmap_png(
            [(f"head {h}", w) for h, w in enumerate(shown)], labels[keep], title, dpi=dpi
        )
        for h, w in enumerate(shown if per_head else ()):
            _, title = crop(labels, f"layer {layer}, head {h}", max_tokens)
            pngs[f"layer{layer}_head{h}"] = heatmap_png([("", w)], labels[keep], title, dpi=dpi)
    return pngs


def seed_example() -> tuple[torch.Tensor, torch.Tensor]:
    """The design documents' multi-head worked example, exactly as they run it.

    A batch of two copies of SEED_INPUTS through `MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)`
    built under `torch.manual_seed(123)`. Returns the context vectors (2, 6, 2), which the
    documents print, and the attention weights (2, 2, 6, 6) behind them. The caller's random
    state is left as it was.
    """
    inputs = torch.tensor(SEED_INPUTS)
    batch = torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(123)
        mha = MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)
        context, weights = mha(batch, return_weights=True)
    return context, weights


def seed_example_figure() -> Figure:
    """Both heads of `seed_example`, each weight written in its cell, the words on both axes."""
    _, weights = seed_example()
    title = f'MultiHeadAttention(3, 2, 6, 0.0, num_heads=2), torch.manual_seed(123)\n"{" ".join(SEED_WORDS)}"'
    return layer_figure(weights[0], list(SEED_WORDS), title=title, annotate=True)
