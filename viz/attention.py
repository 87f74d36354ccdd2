"""Attention maps: heatmaps of a model's attention weights, tokens on both axes.

Everything draws on `matplotlib.figure.Figure` objects with the Agg canvas and never touches
pyplot, so nothing needs a display or leaves global state behind, and a training callback can
draw while the loop runs. Rows are queries (the position attending), columns keys (the position
attended to). The cells a causal model may not look at, above the diagonal, are masked and drawn
white, so they read as empty rather than as a weight of 0, which the colour map draws dark.
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

if TYPE_CHECKING:  # matplotlib (~0.3 s) is imported where a figure is drawn; the server only labels tokens
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage

MAX_TOKENS = 64
"""Most tokens drawn per axis; a longer context shows its last MAX_TOKENS positions."""
COLORMAP = "viridis"
"""Weight 0 is dark here, so it never looks like a masked (white) cell."""
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


def head_figure(
    weights: np.ndarray | torch.Tensor,
    labels: Sequence[str],
    *,
    title: str = "",
    annotate: bool = False,
    max_tokens: int = MAX_TOKENS,
    layout_of: Figure | None = None,
) -> Figure:
    """One head's weights (T, T) as a heatmap; `annotate` writes each weight in its cell.
    `layout_of`: see `layer_figure`."""
    return _grid([("", weights)], labels, title, annotate, max_tokens, layout_of)


def layer_figure(
    weights: np.ndarray | torch.Tensor,
    labels: Sequence[str],
    *,
    title: str = "",
    annotate: bool = False,
    max_tokens: int = MAX_TOKENS,
    layout_of: Figure | None = None,
) -> Figure:
    """One layer's weights (n_head, T, T) as a grid with a panel per head, titled "head h".

    `layout_of`, a figure drawn by this function for as many heads, the same labels and a title of
    as many lines, lends its layout: the panels take its places instead of running the layout
    solver again. The solver measures every tick label and costs as much as drawing the figure."""
    panels = [(f"head {h}", w) for h, w in enumerate(weights)]
    return _grid(panels, labels, title, annotate, max_tokens, layout_of)


def fix_layout(fig: Figure) -> Figure:
    """Lay `fig` out once, now, and keep those places: drawing it no longer runs the layout solver,
    and the figure can lend its layout (`layer_figure`'s `layout_of`)."""
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)
        fig.set_layout_engine("none")
    return fig


def _grid(
    panels: list[tuple[str, np.ndarray | torch.Tensor]],
    labels: Sequence[str],
    title: str,
    annotate: bool,
    max_tokens: int,
    layout_of: Figure | None = None,
) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    t = len(labels)
    shown = min(t, max_tokens)
    if shown < t:
        # Rows of the last tokens still put weight on the cropped ones, so their cells no longer
        # sum to 1: say so where the reader looks.
        title = f"{title}\nlast {shown} of {t} tokens; weight on earlier ones not drawn".strip()
    cols = math.ceil(math.sqrt(len(panels)))
    rows = math.ceil(len(panels) / cols)
    # Inches per panel: about 13 pt a cell at 64 tokens; written weights need wider cells.
    panel = max(5.0 if annotate else 3.5, 0.18 * shown)
    size = (cols * panel + 1.5, rows * panel + 1.0)
    fig = Figure(figsize=size, layout="constrained" if layout_of is None else None)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (name, weights) in zip(axes, panels, strict=False):
        image = _draw_head(ax, causal_masked(weights)[-shown:, -shown:], labels[-shown:], annotate)
        ax.set_title(name)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.colorbar(image, ax=list(axes[: len(panels)]), shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title)
    if layout_of is not None:
        _take_layout(fig, layout_of)
    return fig


def _take_layout(fig: Figure, like: Figure) -> None:
    """Put `fig`'s axes (the panels, then the colour bar) and title where `like` has them."""
    if tuple(fig.get_size_inches()) != tuple(like.get_size_inches()) or len(fig.axes) != len(like.axes):
        raise ValueError("layout_of must be a figure of the same size and panels")
    for ax, model in zip(fig.axes, like.axes, strict=True):
        ax.set_position(model.get_position(original=False), which="both")
    if fig._suptitle is not None and like._suptitle is not None:  # constrained layout moves it too
        fig._suptitle.set_position(like._suptitle.get_position())


def _draw_head(ax: Axes, weights: np.ma.MaskedArray, labels: Sequence[str], annotate: bool) -> AxesImage:
    """Draw (T, T) masked weights on `ax`; the image, for the colour bar."""
    from matplotlib import colormaps
    from matplotlib.colors import PowerNorm

    t = len(labels)
    font = max(6.0, min(10.0, 400 / t))  # 10 pt up to 40 tokens, 6 pt from 67 on
    cmap = colormaps[COLORMAP].with_extremes(bad="white")
    # One fixed scale for every panel, so colours compare across heads and layers; the square
    # root spreads the small weights a long context is made of.
    image = ax.imshow(weights, cmap=cmap, norm=PowerNorm(0.5, vmin=0.0, vmax=1.0), interpolation="nearest")
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


def attention_figures(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    *,
    layers: Sequence[int] | None = None,
    per_head: bool = False,
    max_tokens: int = MAX_TOKENS,
) -> dict[str, Figure]:
    """The attention maps of `prompt`: "layer{i}" grids, and "layer{i}_head{h}" with `per_head`.

    A prompt longer than the model's context is cropped to its last `context_length` tokens, as
    the model would see it. Raises UsageError for an empty prompt or a layer the model lacks, and
    the tokenizer's DataError for text it cannot encode.
    """
    weights, labels = attention_of(model, tokenizer, prompt, layers=layers)
    return draw_attention(weights, labels, prompt, per_head=per_head, max_tokens=max_tokens)


def attention_of(
    model: GPT, tokenizer: Tokenizer, prompt: str, *, layers: Sequence[int] | None = None
) -> tuple[dict[int, np.ndarray], list[str]]:
    """What `attention_figures` draws, computed and not drawn: the weights (n_head, T, T) of the
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
) -> dict[str, Figure]:
    """`attention_figures` from what `attention_of` computed. Needs no model and no torch, so it
    can run in another process."""
    figures = {}
    # Every layer's grid has the same panels, labels and title lines, and so does every head's
    # figure: the first of each is laid out and lends its places to the others.
    grid = single = None
    for layer, heads in weights.items():  # heads: (n_head, T, T)
        title = (
            f'layer {layer}: attention over "{visible_token(prompt[:40])}{"…" if len(prompt) > 40 else ""}"'
        )
        figure = layer_figure(heads, labels, title=title, max_tokens=max_tokens, layout_of=grid)
        grid = grid or fix_layout(figure)
        figures[f"layer{layer}"] = figure
        for h in range(heads.shape[0]) if per_head else ():
            title = f"layer {layer}, head {h}"
            figure = head_figure(heads[h], labels, title=title, max_tokens=max_tokens, layout_of=single)
            single = single or fix_layout(figure)
            figures[f"layer{layer}_head{h}"] = figure
    return figures


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
