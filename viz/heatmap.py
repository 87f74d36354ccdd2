"""Attention heatmaps drawn straight into pixels: a panel per head, tokens on both axes, one PNG.

The dashboard draws these after every validation, beside the training loop, so they must cost
little CPU. The image is a numpy array of palette indices: the cells index the colour map's table,
each label is rendered once (Pillow, with matplotlib's DejaVu Sans, which has the glyphs of
`visible_token`) and stamped where it goes, and a palette PNG, a byte a pixel and no row filters,
encodes several times faster than RGB. matplotlib's figure of the same picture
(`attention.layer_figure`) builds an artist per tick label and lays them out with a solver; it stays
the reference, and draws what needs more (weights written in the cells). Sizes are in points, as
matplotlib's are; `dpi` turns them into pixels.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.colors import Colormap, Normalize
    from PIL import Image, ImageFont

COLORMAP = "viridis"
"""Weight 0 is dark here, so it never looks like a masked (white) cell."""
BAR_TICKS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
"""The weights the colour bar names."""
TITLE_PT, AXIS_PT = 12.0, 10.0
"""Font sizes of the titles and of the axes' names; tick labels follow `tick_points`."""
MARGIN, PAD, TICK, GAP, BAR = 8.0, 4.0, 3.5, 22.0, 12.0
"""Around the image, between a text and what it names, a tick mark's length, between panels, the
colour bar's width."""
SHADES = 224
"""Palette entries 0..SHADES-1 run through the colour map; the rest are greys for the text's
edges, from black (SHADES) to white (255). Steps of 1/224 in the map are not told apart by eye."""
BLACK, WHITE = SHADES, 255


def colour_scale() -> tuple[Colormap, Normalize]:
    """The one scale of every panel: viridis through a square root on 0..1, masked cells white.

    Fixed, so colours compare across heads and layers; the square root spreads the small weights
    a long context is made of."""
    from matplotlib import colormaps
    from matplotlib.colors import PowerNorm

    return colormaps[COLORMAP].with_extremes(bad="white"), PowerNorm(0.5, vmin=0.0, vmax=1.0)


def crop(labels: Sequence[str], title: str, max_tokens: int) -> tuple[slice, str]:
    """The last `max_tokens` positions, to draw, and the title, which says so when some are left out."""
    shown = min(len(labels), max_tokens)
    if shown < len(labels):
        # Rows of the last tokens still put weight on the cropped ones, so their cells no longer
        # sum to 1: say so where the reader looks.
        title = f"{title}\nlast {shown} of {len(labels)} tokens; weight on earlier ones not drawn".strip()
    return slice(len(labels) - shown, None), title


def tick_points(tokens: int) -> float:
    """Tick labels' font size: 10 pt up to 40 tokens, 6 pt from 67 on."""
    return max(6.0, min(10.0, 400 / tokens))


@dataclass(frozen=True)
class Text:
    """A text and where its ink goes: the mask's top-left corner."""

    text: str
    x: int
    y: int
    mask: np.ndarray
    """Ink (H, W) from 0 to 255, turned as the text is."""


@dataclass(frozen=True)
class Layout:
    """Where everything of a grid of heatmaps goes, in pixels (x right, y down)."""

    size: tuple[int, int]
    """(width, height) of the image."""
    cell: int
    """The side of a cell; the panels are squares of T cells."""
    origins: list[tuple[int, int]]
    """The top-left corner of each panel's cells, in panel order."""
    bar: tuple[int, int, int, int]
    """The colour bar: left, top, right, bottom (exclusive)."""
    bar_ticks: list[int]
    """The rows of the colour bar at BAR_TICKS."""
    tick: int
    """A tick mark's length."""
    texts: list[Text]
    """Every title and label."""

    def centre(self, panel: int, row: int, col: int) -> tuple[int, int]:
        """The pixel (x, y) in the middle of a cell: `row` is the query, `col` the key."""
        x, y = self.origins[panel]
        return x + col * self.cell + self.cell // 2, y + row * self.cell + self.cell // 2


def heatmap_png(
    panels: Sequence[tuple[str, np.ndarray]], labels: Sequence[str], title: str, *, dpi: float = 100
) -> bytes:
    """Square weights (T, T), rows the queries, as heatmaps side by side under `title`, each panel
    titled by its name, `labels` on both axes; the PNG. Cells above the diagonal are drawn white."""
    buffer = io.BytesIO()
    draw(panels, labels, title, dpi=dpi).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def draw(
    panels: Sequence[tuple[str, np.ndarray]], labels: Sequence[str], title: str, *, dpi: float = 100
) -> Image.Image:
    """What `heatmap_png` encodes, a palette image laid out by `layout`."""
    from PIL import Image

    plan = layout([name for name, _ in panels], labels, title, dpi=dpi)
    width, height = plan.size
    canvas = np.full((height, width), WHITE, dtype=np.uint8)
    ink = np.zeros((height, width), dtype=np.uint8)  # black over white: the lines and the text
    side = plan.cell * len(labels)
    for (x, y), (_, weights) in zip(plan.origins, panels, strict=True):
        canvas[y : y + side, x : x + side] = np.kron(
            _shades(weights), np.ones((plan.cell, plan.cell), np.uint8)
        )
        _frame(ink, x, y, side, side)
        mids = np.arange(len(labels)) * plan.cell + plan.cell // 2  # a tick at each cell's middle
        ink[y + mids, x - plan.tick : x] = 255
        ink[y + side : y + side + plan.tick, x + mids] = 255
    left, top, right, bottom = plan.bar
    # The bar runs evenly through the colour map, so its ticks sit where the norm puts them.
    canvas[top:bottom, left:right] = (
        np.linspace(SHADES - 1, 0, bottom - top).round().astype(np.uint8)[:, None]
    )
    _frame(ink, left, top, right - left, bottom - top)
    for y in plan.bar_ticks:
        ink[y, right : right + plan.tick] = 255
    for text in plan.texts:
        h, w = text.mask.shape
        area = ink[text.y : text.y + h, text.x : text.x + w]
        np.maximum(area, text.mask[: area.shape[0], : area.shape[1]], out=area)
    grey = WHITE - (ink.astype(np.uint16) * (WHITE - BLACK) + 127) // 255
    image = Image.fromarray(np.where(ink > 0, grey, canvas).astype(np.uint8), mode="P")
    image.putpalette(_palette())
    return image


def layout(names: Sequence[str], labels: Sequence[str], title: str, *, dpi: float = 100) -> Layout:
    """Where `draw` puts panels titled `names` (no title for ""), in a near-square grid, with
    `labels` on both axes, `title` above and the colour bar on the right."""
    scale = dpi / 72  # pixels per point
    t, tick_pt = len(labels), tick_points(len(labels))
    tick_font, axis_font, title_font = (_font(round(p * scale)) for p in (tick_pt, AXIS_PT, TITLE_PT))
    margin, pad, tick, gap, bar_w = (round(v * scale) for v in (MARGIN, PAD, TICK, GAP, BAR))
    cell = max(1, round(max(10.0, tick_pt + 2, 240 / t) * scale))  # a short context gets larger cells
    side, title_h = cell * t, sum(title_font.getmetrics())

    widest = max(math.ceil(tick_font.getlength(s)) for s in labels)
    # Labels that fit their column stand; longer ones are upright in long contexts, slanted in short.
    angle = 0 if widest <= cell - 2 else 90 if t > 12 else 45
    x_labels = [_text(s, tick_font, angle) for s in labels]
    y_labels = [_text(s, tick_font, 0) for s in labels]
    key, query = _text("key (attended to)", axis_font, 0), _text("query (attending from)", axis_font, 90)
    below = tick + pad + max(m.shape[0] for m in x_labels) + pad + key.shape[0]
    left = query.shape[1] + pad + widest + pad + tick
    if angle == 45:  # the labels slant away to the left of their column
        left = max(left, max(m.shape[1] for m in x_labels) - cell // 2)
    panel_w, panel_h = left + side + gap, title_h + pad + side + below + gap

    cols = math.ceil(math.sqrt(len(names)))
    rows = math.ceil(len(names) / cols)
    lines = [_text(s, title_font, 0) for s in title.split("\n")] if title else []
    top = margin + sum(m.shape[0] for m in lines) + pad
    origins = [
        (margin + (p % cols) * panel_w + left, top + (p // cols) * panel_h + title_h + pad)
        for p in range(len(names))
    ]
    _, norm = colour_scale()
    bar_labels = [_text(f"{v:.1f}", axis_font, 0) for v in BAR_TICKS]
    bar_name = _text("attention weight", axis_font, 90)
    span = origins[-1][1] + side - origins[0][1]
    # 0.6 of the panels' height, as matplotlib shrinks its bar, but room for the tick labels
    bar_x, bar_h = margin + cols * panel_w, round(min(span, max(0.6 * span, 200 * scale)))
    bar_y = origins[0][1] + (span - bar_h) // 2
    bar_ticks = [bar_y + bar_h - 1 - round(float(norm(v)) * (bar_h - 1)) for v in BAR_TICKS]
    bar_right = bar_x + bar_w + tick + pad + max(m.shape[1] for m in bar_labels) + pad
    width = max(
        bar_right + bar_name.shape[1] + margin, max((m.shape[1] for m in lines), default=0) + 2 * margin
    )

    texts, y = [], margin
    for s, m in zip(title.split("\n") if title else [], lines, strict=True):
        texts.append(Text(s, (width - m.shape[1]) // 2, y, m))
        y += m.shape[0]
    for (x, y), name in zip(origins, names, strict=True):
        if name:
            m = _text(name, title_font, 0)
            texts.append(Text(name, x + (side - m.shape[1]) // 2, y - pad - m.shape[0], m))
        for k, (s, xm, ym) in enumerate(zip(labels, x_labels, y_labels, strict=True)):
            mid = cell * k + cell // 2
            texts.append(Text(s, x - tick - pad - ym.shape[1], y + mid - ym.shape[0] // 2, ym))
            # A slanted label ends at its column; the others are centred on it.
            end = ym.shape[0] // 2 if angle == 45 else xm.shape[1] // 2
            texts.append(Text(s, x + mid + end - xm.shape[1], y + side + tick + pad, xm))
        texts.append(
            Text("key (attended to)", x + (side - key.shape[1]) // 2, y + side + below - key.shape[0], key)
        )
        texts.append(Text("query (attending from)", x - left, y + (side - query.shape[0]) // 2, query))
    for v, m, y in zip(BAR_TICKS, bar_labels, bar_ticks, strict=True):
        texts.append(Text(f"{v:.1f}", bar_x + bar_w + tick + pad, y - m.shape[0] // 2, m))
    texts.append(Text("attention weight", bar_right, bar_y + (bar_h - bar_name.shape[0]) // 2, bar_name))
    height = top + rows * panel_h + margin
    return Layout(
        (width, height), cell, origins, (bar_x, bar_y, bar_x + bar_w, bar_y + bar_h), bar_ticks, tick, texts
    )


def _shades(weights: np.ndarray) -> np.ndarray:
    """(T, T) palette indices of the weights through the colour scale, white above the diagonal."""
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, 1.0)
    shades = np.minimum(np.sqrt(w) * SHADES, SHADES - 1).astype(
        np.uint8
    )  # PowerNorm(0.5), as the map indexes
    shades[np.triu(np.ones(w.shape, dtype=bool), k=1)] = WHITE
    return shades


def _frame(ink: np.ndarray, x: int, y: int, w: int, h: int) -> None:
    """A one-pixel line around the w x h box at (x, y), just outside it."""
    ink[y - 1, x - 1 : x + w + 1] = ink[y + h, x - 1 : x + w + 1] = 255
    ink[y - 1 : y + h + 1, x - 1] = ink[y - 1 : y + h + 1, x + w] = 255


@functools.cache
def _palette() -> list[int]:
    """SHADES colours of the colour map, then greys from black to white, as Pillow's flat RGB list."""
    cmap, _ = colour_scale()
    colours = cmap(np.linspace(0.0, 1.0, SHADES), bytes=True)[:, :3]
    greys = np.linspace(0, 255, 256 - SHADES).round().astype(np.uint8)
    return np.concatenate([colours, np.repeat(greys[:, None], 3, axis=1)]).ravel().tolist()


@functools.cache
def _font(pixels: int) -> ImageFont.FreeTypeFont:
    """DejaVu Sans, matplotlib's own font, which has glyphs for ⏎ ␣ ⇥ and the rest."""
    import matplotlib
    from PIL import ImageFont

    return ImageFont.truetype(
        str(Path(matplotlib.get_data_path()) / "fonts/ttf/DejaVuSans.ttf"), max(pixels, 1)
    )


@functools.lru_cache(maxsize=4096)
def _text(text: str, font: ImageFont.FreeTypeFont, angle: int) -> np.ndarray:
    """`text`'s ink, one line high (so the labels of a row line up), turned `angle` degrees
    counter-clockwise; rendered once, then stamped wherever it goes."""
    from PIL import Image, ImageDraw

    ascent, descent = font.getmetrics()
    mask = Image.new("L", (max(1, math.ceil(font.getlength(text))), ascent + descent))
    ImageDraw.Draw(mask).text((0, 0), text, fill=255, font=font)
    if angle:
        mask = mask.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True)
    return np.asarray(mask)
