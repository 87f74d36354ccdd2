"""Write the plays' instruction files: `python play_questions.py --out data_cache/play_questions`.

"Who speaks these lines?" and "Which line comes next?", four choices each, split by play:
train.jsonl and validation.jsonl ask about 32 plays, test.jsonl about the 6 held out. `--help`
lists every option.
"""

from __future__ import annotations

from minigpt.cli.play_questions import play_questions_main


def main(args: list[str] | None = None) -> int:
    return play_questions_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
