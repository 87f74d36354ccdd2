"""Train a GPT: `python train.py --config small.yaml [--section.key value ...]`.

Every setting is in the YAML files under configs/ and can be overridden after `--config`;
`python train.py --config small.yaml --print_config` shows them all.
"""

from __future__ import annotations

from minigpt.cli.train import train_main


def main(args: list[str] | None = None) -> int:
    return train_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
