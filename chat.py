"""Talk with a trained model in the terminal: `python chat.py --checkpoint runs/sft`.

Each answer streams as it is decoded; `/help` lists the commands, `--help` every option.
"""

from __future__ import annotations

from minigpt.cli.chat import chat_main


def main(args: list[str] | None = None) -> int:
    return chat_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
