"""Export trained weights: `python export.py --checkpoint runs/small --out small.safetensors`.

The file holds the weights and, as metadata, the model shape and tokenizer, so `generate.py
--checkpoint small.safetensors` works from it alone.
"""

from __future__ import annotations

from minigpt.cli.export import export_main


def main(args: list[str] | None = None) -> int:
    return export_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
