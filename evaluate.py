"""Evaluate a trained model: `python evaluate.py --checkpoint runs/small` (bits per byte on its
validation text), `--tasks hellaswag,arc_easy` (lm-evaluation-harness); `--help` lists every option.
"""

from __future__ import annotations

from minigpt.cli.evaluate import evaluate_main


def main(args: list[str] | None = None) -> int:
    return evaluate_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
