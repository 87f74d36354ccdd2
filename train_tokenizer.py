"""Learn a tokenizer and inspect it: `python train_tokenizer.py --source shakespeare --vocab_size 4096`.

Prints the vocabulary size, bytes per token on the validation text, the longest tokens and a
sample split into tokens; `--save tokenizer.json` keeps it. `--help` lists every option.
"""

from __future__ import annotations

from minigpt.cli.train_tokenizer import train_tokenizer_main


def main(args: list[str] | None = None) -> int:
    return train_tokenizer_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
