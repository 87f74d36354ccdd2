"""`visualize.py`: draw a trained model's attention weights over a prompt as PNG heatmaps."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from minigpt.checkpoints import load_model
from minigpt.common import UsageError, WriteError, safe_write
from minigpt.viz.attention import MAX_TOKENS, attention_pngs, figure_to_png, seed_example_figure

from .command import USER_ERRORS, options_parser, parse_options, report


@dataclass(frozen=True)
class VisualizeOptions:
    """Whose attention to draw, over which text, and where the pictures go."""

    checkpoint: str | None = None
    """A run folder (its best checkpoint), a .ckpt or exported .safetensors file, or a GPT-2
    folder in the Hugging Face layout (config.json + weights; a hub name such as gpt2 is fetched)."""
    prompt: str | None = None
    """The text whose attention to draw; a prompt longer than the context keeps its end."""
    out: str | None = None
    """Folder for the PNGs, made if missing: layer{i}.png, layer{i}_head{h}.png, seed_example.png.
    Default: attention/ in the run folder when --checkpoint is one (where report.py looks for
    them), else attention/ in the working directory."""
    layers: str = "all"
    """Which layers to draw: all, or indices separated by commas, such as 0,2 (-1 is the last)."""
    per_head: bool = False
    """Also write one image per head of each layer drawn."""
    max_tokens: int = MAX_TOKENS
    """Draw at most the last this many tokens on each axis (the model still reads the whole prompt)."""
    seed_example: bool = False
    """Draw the design documents' worked example instead ("Your journey starts with one step"
    through MultiHeadAttention(3, 2, 6, 0.0, num_heads=2) under seed 123); needs no checkpoint."""
    force: bool = False
    """Replace PNGs of the same names already in --out."""
    dpi: int = 100
    """Pixels per inch of the PNGs."""
    device: str = "auto"
    """cpu, cuda, cuda:1, ... (auto: cuda when available)."""
    tokenizer_path: str | None = None
    """GPT-2's r50k_base.tiktoken ranks file, on machines that cannot fetch it."""

    def __post_init__(self) -> None:
        if self.seed_example and (self.checkpoint is not None or self.prompt is not None):
            raise UsageError(
                "--seed_example draws the documents' example; it takes no --checkpoint or --prompt"
            )
        if not self.seed_example and self.checkpoint is None:
            raise UsageError(
                "pass --checkpoint (a run folder, .ckpt, .safetensors or GPT-2 folder), or --seed_example"
            )
        if not self.seed_example and not self.prompt:
            raise UsageError("the prompt is empty: pass the text whose attention to draw with --prompt")
        if self.max_tokens < 1:
            raise UsageError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.dpi < 1:
            raise UsageError(f"dpi must be >= 1, got {self.dpi}")
        self.layer_indices()  # a malformed list fails here, before the model loads

    def layer_indices(self) -> list[int] | None:
        """The layers named by --layers; None for all."""
        if self.layers.strip() == "all":
            return None
        try:
            return [int(part) for part in self.layers.split(",")]
        except ValueError:
            raise UsageError(
                f"layers must be all or indices separated by commas, such as 0,2 or -1; got {self.layers!r}"
            ) from None


def visualize_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, draw the attention maps, write them as PNGs. Returns the exit code."""
    parser = options_parser(
        "visualize.py",
        "Draw a trained minigpt model's attention weights over a prompt as PNG heatmaps.",
        VisualizeOptions,
    )
    try:
        (opts,) = parse_options(parser, args, VisualizeOptions)
        if opts.seed_example:
            pngs = {"seed_example": figure_to_png(seed_example_figure(), dpi=opts.dpi)}
        else:
            pngs = model_pngs(opts)
        out = Path(opts.out) if opts.out is not None else default_out(opts.checkpoint)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out must be a folder; {out} is a file")
        paths = {name: out / f"{name}.png" for name in pngs}
        taken = [path for path in paths.values() if path.exists()]
        if taken and not opts.force:
            # The folder may hold a user's own files of these names: never replace them unasked.
            raise UsageError(
                f"{taken[0]} already exists; pass --force to replace it, or --out another folder"
            )
    except USER_ERRORS as err:
        return report(err)
    try:
        for name, path in paths.items():
            with safe_write(path, option="--out") as tmp:
                tmp.write_bytes(pngs[name])
            print(path)
    except (WriteError, OSError) as err:  # OSError: another, such as an --out under a file
        return report(err)
    return 0


def default_out(checkpoint: str | None) -> Path:
    """Where the PNGs go without --out: beside the run's other files when there is a run folder
    (not inside a model folder such as a GPT-2 download: attention/ in the working directory)."""
    if checkpoint is not None and (Path(checkpoint) / "checkpoints").is_dir():
        return Path(checkpoint) / "attention"
    return Path("attention")


def model_pngs(opts: VisualizeOptions) -> dict[str, bytes]:
    """The attention maps of `opts.prompt` under the model `opts.checkpoint` names, as PNGs by file name."""
    assert opts.checkpoint is not None and opts.prompt is not None  # checked in __post_init__
    device = ("cuda" if torch.cuda.is_available() else "cpu") if opts.device == "auto" else opts.device
    model, tokenizer = load_model(opts.checkpoint, device=device, tokenizer_path=opts.tokenizer_path)
    tokens, context = len(tokenizer.encode(opts.prompt)), model.config.context_length
    if tokens > context:
        print(
            f"warning: the prompt has {tokens} tokens; only its last {context} fit the context",
            file=sys.stderr,
        )
    return attention_pngs(
        model,
        tokenizer,
        opts.prompt,
        layers=opts.layer_indices(),
        per_head=opts.per_head,
        max_tokens=opts.max_tokens,
        dpi=opts.dpi,
    )
