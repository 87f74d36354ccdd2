"""Attention maps: valid PNGs that show the model's own weights, and the documents' worked example."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from torch.testing import assert_close

from minigpt.cli.visualize import visualize_main
from minigpt.common import UsageError
from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig, MultiHeadAttention
from minigpt.viz import attention as attention_module
from minigpt.viz.attention import (
    COLORMAP,
    SEED_INPUTS,
    SEED_WORDS,
    attention_figures,
    figure_to_png,
    fix_layout,
    head_figure,
    layer_figure,
    seed_example,
    seed_example_figure,
    select_layers,
    visible_token,
)

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


@pytest.mark.parametrize("dpi", [50, 100])
def test_pngs_are_valid_images_of_the_figures_size(dpi: int) -> None:
    fig = head_figure(torch.eye(5), list("abcde"))
    png = figure_to_png(fig, dpi=dpi)
    width, height = png_size(png)
    assert (width, height) == tuple(round(v * dpi) for v in fig.get_size_inches())
    assert matplotlib.image.imread(io.BytesIO(png)).shape == (height, width, 4)


def test_heatmaps_hold_the_models_attention_weights() -> None:
    model = tiny_model()
    figures = attention_figures(model, TOKENIZER, PROMPT, per_head=True)
    assert list(figures) == [f"layer{i}{s}" for i in (0, 1) for s in ("", "_head0", "_head1", "_head2")]
    weights = model.attention_weights(torch.tensor([TOKENIZER.encode(PROMPT)]))
    upper = np.triu(np.ones((len(PROMPT), len(PROMPT)), dtype=bool), k=1)
    for layer in (0, 1):
        panels = heads(figures[f"layer{layer}"])
        assert [ax.get_title() for ax in panels] == ["head 0", "head 1", "head 2"]
        for h in range(3):
            for ax in (panels[h], heads(figures[f"layer{layer}_head{h}"])[0]):
                data = ax.images[0].get_array()
                assert np.array_equal(np.ma.getmaskarray(data), upper)  # masked: drawn blank
                drawn = torch.from_numpy(data.filled(0.0)).float()
                assert_close(drawn, weights[layer][0, h], rtol=0, atol=1e-7)
                assert_close(drawn.sum(-1), torch.ones(len(PROMPT)))


def test_figures_that_borrow_the_first_ones_layout_draw_the_same_pixels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_model()
    lent = attention_figures(model, TOKENIZER, PROMPT, per_head=True)
    solvers = [fig.get_layout_engine() for fig in lent.values()]
    assert not any(isinstance(engine, ConstrainedLayoutEngine) for engine in solvers)  # none runs it again
    monkeypatch.setattr(attention_module, "fix_layout", lambda fig: None)  # each lays itself out
    own = attention_figures(model, TOKENIZER, PROMPT, per_head=True)
    assert own.keys() == lent.keys() and len(lent) == 2 + 2 * 3
    for name in lent:
        assert figure_to_png(lent[name]) == figure_to_png(own[name]), name


def test_a_figure_lends_its_layout_only_to_one_of_its_size_and_panels() -> None:
    weights = torch.eye(4).expand(3, 4, 4)
    like = fix_layout(layer_figure(weights, list("abcd"), title="one"))
    assert figure_to_png(layer_figure(weights, list("abcd"), title="two", layout_of=like))
    with pytest.raises(ValueError, match="same size and panels"):
        layer_figure(weights[:2], list("abcd"), title="two", layout_of=like)


def test_both_axes_show_each_token_with_whitespace_made_visible() -> None:
    fig = attention_figures(tiny_model(), TOKENIZER, PROMPT, layers=[0])["layer0"]
    expected = ["t", "o", "␣", "b", "e", ",", "⏎", "o", "r", "␣", "n", "o", "t"]
    for ax in heads(fig):
        assert [t.get_text() for t in ax.get_xticklabels()] == expected
        assert [t.get_text() for t in ax.get_yticklabels()] == expected
    assert (
        visible_token(" the\t") == "␣the⇥" and visible_token("\x00") == "\\x00" and visible_token("") == "∅"
    )


def test_masked_cells_are_blank_while_a_zero_weight_is_coloured() -> None:
    # Weight 1 on the diagonal, 0 below it: below and above differ only in being masked.
    fig = head_figure(torch.eye(4), list("abcd"))
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255
    (ax,) = heads(fig)

    def colour(row: int, col: int) -> np.ndarray:
        x, y = ax.transData.transform((col, row))
        return pixels[pixels.shape[0] - int(round(y)), int(round(x))]

    assert_close(colour(0, 3), np.ones(3), atol=0.01, rtol=0)  # above the diagonal: white
    zero = np.array(to_rgb(matplotlib.colormaps[COLORMAP](0.0)))
    assert_close(colour(3, 0), zero, atol=0.02, rtol=0)
    assert np.abs(colour(3, 0) - 1).max() > 0.5


def test_a_long_context_shows_its_last_tokens_and_says_so() -> None:
    torch.manual_seed(0)
    scores = torch.randn(2, 80, 80).masked_fill(torch.ones(80, 80, dtype=torch.bool).triu(1), -torch.inf)
    weights = scores.softmax(-1)
    labels = [f"t{i}" for i in range(80)]
    fig = layer_figure(weights, labels, title="long", max_tokens=64)
    for h, ax in enumerate(heads(fig)):
        assert_close(torch.from_numpy(ax.images[0].get_array().filled(0.0)).float(), weights[h, 16:, 16:])
        assert [t.get_text() for t in ax.get_yticklabels()] == labels[16:]
    assert "last 64 of 80 tokens" in fig.get_suptitle()


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
