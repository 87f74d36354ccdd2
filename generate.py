"""Sample from a trained model: `python generate.py --checkpoint runs/small --prompt "ROMEO:"`.

Tokens stream to stdout as they are produced; `--help` lists every option.
"""

from __future__ import annotations

from minigpt.cli.generate import generate_main


def main(args: list[str] | None = None) -> int:
    return generate_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
