"""`export.py`: write a trained model for others: safetensors for minigpt, or a folder for
Hugging Face transformers (GPT-2's layout, or our architecture as custom code)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from minigpt.checkpoints import load_model, save_huggingface, save_safetensors
from minigpt.common import UsageError, another_folder_with

from .command import USER_ERRORS, options_parser, parse_options, report

EXPORT_FORMATS = ("safetensors", "huggingface")


@dataclass(frozen=True)
class ExportOptions:
    """What to export, where, and in which layout."""

    checkpoint: str
    """A run folder (its best checkpoint), a .ckpt or .safetensors file, or a Hugging Face folder."""
    out: str
    """safetensors: the .safetensors file to write; huggingface: the folder to write."""
    format: str = "safetensors"
    """safetensors: one file that minigpt's tools read, the description in its metadata;
    huggingface: a folder transformers.AutoModelForCausalLM.from_pretrained loads (config.json,
    model.safetensors, tokenizer files): GPT-2's layout, with no custom code, when GPT-2 computes
    the model; else our architecture as custom code, which transformers runs only when told
    to (trust_remote_code)."""
    force: bool = False
    """Replace --out if it exists."""

    def __post_init__(self) -> None:
        if self.format not in EXPORT_FORMATS:
            raise UsageError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {self.format!r}")
        if self.format == "safetensors" and Path(self.out).suffix != ".safetensors":
            raise UsageError(f"--out must end in .safetensors, got {self.out} (or pass --format huggingface)")
        if self.format == "huggingface" and Path(self.out).suffix in (".safetensors", ".ckpt"):
            raise UsageError(f"--format huggingface writes a folder; --out {self.out} names a file")


def export_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, load the model, write it. Returns the exit code."""
    parser = options_parser(
        "export.py", "Export a trained model for minigpt or for transformers.", ExportOptions
    )
    try:
        (opts,) = parse_options(parser, args, ExportOptions)
        out = Path(opts.out)
        if out.exists() and not opts.force:
            raise UsageError(f"{out} already exists; pass --force to replace it")
        if out.exists() and opts.format == "safetensors" and not out.is_file():
            raise UsageError(f"{out} is a folder; --out must name a .safetensors file")
        model, tokenizer = load_model(opts.checkpoint)
        with another_folder_with("--out"):
            if opts.format == "huggingface":
                note = save_huggingface(model, tokenizer, out, replace=opts.force)
            else:
                save_safetensors(model, tokenizer, out)
                note = None
    except USER_ERRORS as err:
        return report(err)
    print(f"wrote {out} ({model.num_parameters(non_embedding=False):,} parameters)")
    if note:
        print(note)
    return 0
