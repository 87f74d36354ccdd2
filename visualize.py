"""Draw a trained model's attention as PNGs: `python visualize.py --checkpoint runs/small --prompt "ROMEO:"`.

`--seed_example` draws the design documents' worked example instead; `--help` lists every option.
"""

from __future__ import annotations

from minigpt.cli.visualize import visualize_main


def main(args: list[str] | None = None) -> int:
    return visualize_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
