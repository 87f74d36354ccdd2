"""`export.py`: write a trained model's weights as safetensors, with its shape and tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from minigpt.checkpoints import load_model, save_safetensors
from minigpt.common import UsageError

from .common import USER_ERRORS, options_parser, parse_options, report


@dataclass(frozen=True)
class ExportOptions:
    """What to export, and where."""

    checkpoint: str
    """A run folder (its best checkpoint) or a .ckpt file."""
    out: str
    """The .safetensors file to write."""
    force: bool = False
    """Replace --out if it exists."""

    def __post_init__(self) -> None:
        if Path(self.out).suffix != ".safetensors":
            raise UsageError(f"--out must end in .safetensors, got {self.out}")


def export_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, load the model, write it. Returns the exit code."""
    parser = options_parser("export.py", "Export a trained model's weights to safetensors.", ExportOptions)
    try:
        (opts,) = parse_options(parser, args, ExportOptions)
        out = Path(opts.out)
        if out.exists() and not opts.force:
            raise UsageError(f"{out} already exists; pass --force to replace it")
        model, tokenizer = load_model(opts.checkpoint)
        save_safetensors(model, tokenizer, out)
    except USER_ERRORS as err:
        return report(err)
    print(f"wrote {out} ({model.num_parameters(non_embedding=False):,} parameters)")
    return 0
