"""Attention maps: valid PNGs that show the model's own weights, and the documents' worked example."""

from __future__ import annotations

import io
import struct
import time
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from PIL import Image
from torch.testing import assert_close

from minigpt.cli.visualize import visualize_main
from minigpt.common import UsageError
from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig, MultiHeadAttention
from minigpt.training.callbacks.dashboard import AttentionMaps
from minigpt.viz.attention import (
    SEED_INPUTS,
    SEED_WORDS,
    attention_of,
    attention_pngs,
    draw_attention,
    figure_to_png,
    layer_figure,
    seed_example,
    seed_example_figure,
    select_layers,
    visible_token,
)
from minigpt.viz.heatmap import Layout, colour_scale, crop, heatmap_png, layout

from ..checkpoints.helpers import model as model  # noqa: F401  (the fixture)
from ..checkpoints.helpers import write_checkpoint
from ..model.helpers import EXPECTED, INPUTS

CHARS = "".join(sorted(set("\n !,.:;?abcdefghijklmnopqrstuvwxyz")))
TOKENIZER = CharTokenizer(CHARS)
PROMPT = "to be,\nor not"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header, after checking its signature and first chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    assert data.endswith(b"IEND\xaeB`\x82")
    return struct.unpack(">II", data[16:24])


def heads(fig: Figure) -> list[Axes]:
    """The heatmap panels of a figure, in head order (the colour bar has no image)."""
    return [ax for ax in fig.axes if ax.images]


def tiny_model() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=len(CHARS), context_length=32, n_layer=2, n_head=3, n_embd=24)
    return GPT(config).eval()


def softmaxed(heads: int, tokens: int, seed: int = 0) -> torch.Tensor:
    """Causal attention weights (heads, T, T) of random scores."""
    torch.manual_seed(seed)
    scores = torch.randn(heads, tokens, tokens) * 2
    return scores.masked_fill(torch.ones(tokens, tokens, dtype=torch.bool).triu(1), -torch.inf).softmax(-1)


def pixels(png: bytes) -> np.ndarray:
    """(H, W, 3) colours in 0..1."""
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")) / 255


def expected_colour(weight: float) -> np.ndarray:
    cmap, norm = colour_scale()
    return np.array(cmap(norm(weight))[:3])


def cell_colours(png: bytes, plan: Layout, panel: int, size: int) -> np.ndarray:
    """(T, T, 3) the colour in the middle of each cell of a panel."""
    image = pixels(png)
    return np.array([[image[plan.centre(panel, i, j)[::-1]] for j in range(size)] for i in range(size)])


@pytest.mark.parametrize("dpi", [50, 100])
def test_pngs_are_valid_images_of_their_layouts_size(dpi: int) -> None:
    png = heatmap_png([("", torch.eye(5).numpy())], list("abcde"), "t", dpi=dpi)
    width, height = png_size(png)
    assert (width, height) == layout([""], list("abcde"), "t", dpi=dpi).size
    assert matplotlib.image.imread(io.BytesIO(png)).shape[:2] == (height, width)
    seed = seed_example_figure()  # matplotlib's, for the worked example
    assert png_size(figure_to_png(seed, dpi=dpi)) == tuple(round(v * dpi) for v in seed.get_size_inches())


def test_heatmaps_hold_the_models_attention_weights() -> None:
    model = tiny_model()
    pngs = attention_pngs(model, TOKENIZER, PROMPT, per_head=True)
    assert list(pngs) == [f"layer{i}{s}" for i in (0, 1) for s in ("", "_head0", "_head1", "_head2")]
    weights = model.attention_weights(torch.tensor([TOKENIZER.encode(PROMPT)]))
    labels = [visible_token(c) for c in PROMPT]
    t = len(PROMPT)
    upper = np.triu(np.ones((t, t), dtype=bool), k=1)
    for layer in (0, 1):
        heads = weights[layer][0].numpy()
        title = f'layer {layer}: attention over "{visible_token(PROMPT)}"'
        panels = [(f"head {h}", heads[h]) for h in range(3)]
        assert pngs[f"layer{layer}"] == heatmap_png(panels, labels, title)
        plan = layout(["head 0", "head 1", "head 2"], labels, title)
        for h in range(3):
            drawn = cell_colours(pngs[f"layer{layer}"], plan, h, t)
            assert (drawn[upper] == 1).all()  # masked: white
            want = np.array([[expected_colour(w) for w in row] for row in heads[h]])
            assert_close(drawn[~upper], want[~upper], atol=0.02, rtol=0)
            assert pngs[f"layer{layer}_head{h}"] == heatmap_png(
                [("", heads[h])], labels, f"layer {layer}, head {h}"
            )


def test_a_cells_colour_follows_the_one_scale_and_masked_cells_are_white() -> None:
    # Weight 1 on the diagonal, 0 below it: below and above differ only in being masked.
    png = heatmap_png([("", np.eye(4))], list("abcd"), "")
    colours = cell_colours(png, layout([""], list("abcd"), ""), 0, 4)
    assert (colours[0, 3] == 1).all() and (colours[np.triu_indices(4, 1)] == 1).all()
    assert_close(colours[3, 0], expected_colour(0.0), atol=0.01, rtol=0)
    assert np.abs(colours[3, 0] - 1).max() > 0.5  # a zero weight is dark, never white
    # Any weight, in any panel, takes the same colour: viridis through PowerNorm(0.5) on 0..1.
    steps = [0.0, 0.003, 0.01, 0.04, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0]
    grid = np.zeros((len(steps), len(steps)))
    grid[np.arange(len(steps)), np.arange(len(steps))] = steps
    panels = [("a", grid), ("b", grid[::-1, ::-1].copy())]  # the same weights elsewhere
    labels = list("abcdefghijkl")
    png = heatmap_png(panels, labels, "scale")
    plan = layout(["a", "b"], labels, "scale")
    for p, (_, weights) in enumerate(panels):
        drawn = cell_colours(png, plan, p, len(steps))
        for i in range(len(steps)):
            for j in range(i + 1):
                assert_close(drawn[i, j], expected_colour(weights[i, j]), atol=0.02, rtol=0)


def test_both_axes_show_each_token_with_whitespace_made_visible() -> None:
    weights, labels = attention_of(tiny_model(), TOKENIZER, PROMPT, layers=[0])
    expected = ["t", "o", "␣", "b", "e", ",", "⏎", "o", "r", "␣", "n", "o", "t"]
    assert labels == expected
    plan = layout(["head 0", "head 1", "head 2"], labels, "title")
    side = plan.cell * len(labels)
    for x, y in plan.origins:
        beside = [
            t
            for t in plan.texts
            if x - plan.cell < t.x + t.mask.shape[1] <= x
            and y <= t.y < y + side
            and t.mask.shape[0] <= plan.cell
        ]
        below = [
            t
            for t in plan.texts
            if x <= t.x < x + side and y + side < t.y < y + side + plan.cell and t.mask.shape[1] <= plan.cell
        ]
        assert [t.text for t in sorted(beside, key=lambda t: t.y)] == expected
        assert [t.text for t in sorted(below, key=lambda t: t.x)] == expected
        assert all(t.mask.max() > 127 for t in beside + below)  # each has ink
    assert (
        visible_token(" the\t") == "␣the⇥" and visible_token("\x00") == "\\x00" and visible_token("") == "∅"
    )


@pytest.mark.parametrize(
    "labels",
    [
        [visible_token(c) for c in AttentionMaps().prompt],  # characters: upright, one a column
        ["ROM", "EO", ":", "⏎", "What", "␣light", "␣through", "␣y", "onder", "␣window", "␣breaks", "?"],
        [f"␣tok{i}" for i in range(64)],  # long labels in a long context: turned upright
    ],
    ids=["characters", "words", "long"],
)
def test_labels_neither_overlap_nor_leave_the_image(labels: list[str]) -> None:
    names = [f"head {h}" for h in range(4)]
    plan = layout(names, labels, "layer 0: a title\nand a second line")
    width, height = plan.size
    inked = np.zeros((height, width), dtype=int)
    side = plan.cell * len(labels)
    for x, y in plan.origins:
        inked[y - 1 : y + side + 1, x - 1 : x + side + 1] += 1  # the cells and their frame
    for text in plan.texts:
        h, w = text.mask.shape
        assert 0 <= text.x and text.x + w <= width and 0 <= text.y and text.y + h <= height, text.text
        inked[text.y : text.y + h, text.x : text.x + w] += text.mask > 64
    assert inked.max() == 1
    assert {"head 0", "head 3", "attention weight", "0.0", "1.0", "and a second line"} <= {
        t.text for t in plan.texts
    }


def test_a_long_context_shows_its_last_tokens_and_says_so() -> None:
    weights = softmaxed(2, 80).numpy()
    labels = [f"t{i}" for i in range(80)]
    keep, title = crop(labels, "long", 64)
    assert labels[keep] == labels[16:]
    assert title == "long\nlast 64 of 80 tokens; weight on earlier ones not drawn"
    assert crop(labels, "short", 80) == (slice(0, None), "short")
    png = draw_attention({0: weights}, labels, "p", max_tokens=64)["layer0"]
    title = 'layer 0: attention over "p"\nlast 64 of 80 tokens; weight on earlier ones not drawn'
    assert png == heatmap_png([(f"head {h}", w[16:, 16:]) for h, w in enumerate(weights)], labels[16:], title)
    plan = layout(["head 0", "head 1"], labels[16:], title)
    assert "last 64 of 80 tokens; weight on earlier ones not drawn" in [t.text for t in plan.texts]
    drawn = cell_colours(png, plan, 1, 64)
    assert_close(drawn[63, 0], expected_colour(weights[1, 79, 16]), atol=0.02, rtol=0)
    reference = layer_figure(weights, labels, title="long", max_tokens=64)  # matplotlib's: the same crop
    assert reference.get_suptitle() == crop(labels, "long", 64)[1]
    for h, ax in enumerate(heads(reference)):
        assert_close(ax.images[0].get_array().filled(0.0), weights[h, 16:, 16:].astype(np.float64))
        assert [t.get_text() for t in ax.get_yticklabels()] == labels[16:]


def test_the_maps_at_the_baby_shape_cost_a_fraction_of_a_cpu_second() -> None:
    # 4 layers of 4 heads over the default prompt, one token a character: what a run at nanoGPT's
    # "baby" shape draws after each validation. matplotlib's figures took ~6 CPU-seconds.
    prompt = AttentionMaps().prompt
    labels = [visible_token(c) for c in prompt]
    weights = {layer: softmaxed(4, len(labels), seed=layer).numpy() for layer in range(4)}
    start = time.process_time()
    pngs = draw_attention(weights, labels, prompt)
    seconds = time.process_time() - start
    assert list(pngs) == ["layer0", "layer1", "layer2", "layer3"]
    assert all(png_size(png)[0] > 1000 for png in pngs.values())
    assert seconds < 1.5, f"{seconds:.2f} CPU-seconds for 4 layers"


def test_layers_are_chosen_by_index_counting_from_either_end() -> None:
    assert select_layers(3, None) == [0, 1, 2]
    assert select_layers(3, [2, -1, 0]) == [2, 0]
    for bad in ([3], [-4]):
        with pytest.raises(UsageError, match="does not exist: the model has 3 layers"):
            select_layers(3, bad)
    with pytest.raises(UsageError, match="no layers chosen"):
        select_layers(3, [])


def test_the_seed_example_is_the_documents_worked_example_and_its_picture() -> None:
    assert torch.equal(torch.tensor(SEED_INPUTS), INPUTS)
    rng = torch.get_rng_state()
    context, weights = seed_example()
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's random state is untouched
    for row in context:
        assert_close(row, EXPECTED, atol=5e-5, rtol=0)
    # These weights are the ones behind the printed vectors: weights @ values, projected, gives them.
    torch.manual_seed(123)
    mha = MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)
    with torch.no_grad():
        values = mha.W_value(INPUTS).view(6, 2, 1).transpose(0, 1)  # (nh, T, hs)
        assert_close(
            mha.out_proj((weights[0] @ values).transpose(0, 1).reshape(6, 2)), EXPECTED, atol=5e-5, rtol=0
        )

    panels = heads(seed_example_figure())
    assert len(panels) == 2
    for h, ax in enumerate(panels):
        assert_close(torch.from_numpy(ax.images[0].get_array().filled(0.0)).float(), weights[0, h])
        assert [t.get_text() for t in ax.get_xticklabels()] == list(SEED_WORDS)
        assert [t.get_text() for t in ax.get_yticklabels()] == list(SEED_WORDS)
        written = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
        expected = {(i, j): f"{weights[0, h, i, j]:.3f}" for i in range(6) for j in range(i + 1)}
        assert written == expected  # every weight below the diagonal, nothing above it


def test_visualize_writes_a_grid_per_layer_and_an_image_per_head(
    model: GPT, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    write_checkpoint(run / "checkpoints" / "best.ckpt", model)
    assert visualize_main(["--checkpoint", str(run), "--prompt", "to be or not", "--per_head"]) == 0
    names = ["layer0.png", "layer0_head0.png", "layer0_head1.png"]
    assert capsys.readouterr().out.split() == [str(run / "attention" / n) for n in names]
    for name in names:  # beside the run's other files, where the run report looks
        assert png_size((run / "attention" / name).read_bytes())[0] > 100


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint", "missing.ckpt", "--prompt", "to be"], "checkpoint not found"),
        (["--prompt", "to be"], "pass --checkpoint"),
        (["--checkpoint", "{ckpt}"], "the prompt is empty"),
        (["--checkpoint", "{ckpt}", "--prompt", ""], "the prompt is empty"),
        (["--checkpoint", "{ckpt}", "--prompt", "ROMEO"], "'R' (U+0052)"),
        (["--checkpoint", "{ckpt}", "--prompt", "to be", "--layers", "1"], "layer 1 does not exist"),
        (["--checkpoint", "{ckpt}", "--prompt", "to be", "--layers", "0,x"], "layers must be all or"),
        (["--checkpoint", "{ckpt}", "--prompt", "to be", "--max_tokens", "0"], "max_tokens must be >= 1"),
        (["--seed_example", "--checkpoint", "{ckpt}"], "takes no --checkpoint"),
    ],
)
def test_visualize_reports_user_errors_in_one_line(
    model: GPT, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    ckpt = str(write_checkpoint(tmp_path / "m.ckpt", model))
    out = tmp_path / "out"
    assert visualize_main([a.format(ckpt=ckpt) for a in args] + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


def test_visualize_never_replaces_files_unless_forced(model: GPT, tmp_path: Path, capsys) -> None:
    ckpt = str(write_checkpoint(tmp_path / "m.ckpt", model))
    mine = tmp_path / "layer0.png"
    mine.write_bytes(b"not ours")
    args = ["--checkpoint", ckpt, "--prompt", "to be", "--out", str(tmp_path)]
    assert visualize_main(args) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert mine.read_bytes() == b"not ours"
    assert visualize_main([*args, "--force"]) == 0
    png_size(mine.read_bytes())


def test_the_seed_example_needs_no_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert visualize_main(["--seed_example", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "seed_example.png")]
    png_size((tmp_path / "seed_example.png").read_bytes())


def test_every_visualize_option_is_documented_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        visualize_main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in (
        "--checkpoint",
        "--prompt",
        "--out",
        "--layers",
        "--per_head",
        "--seed_example",
        "--force",
    ):
        assert option in text, option
    assert "where report.py looks" in text and "needs no checkpoint" in text
