"""`play_questions.py`: write the instruction files made from the plays, "who speaks these lines?"
and "which line comes next?", split by play (train and validation from 32 plays, test from the 6
held out), for fine-tuning with sft.yaml and scoring with the `play_speakers` and `play_next_line`
tasks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from minigpt.common import another_folder_with
from minigpt.data.questions.make import KINDS, corpus_splits, write_splits
from minigpt.data.questions.plays import TEST_PLAYS

from .command import USER_ERRORS, options_parser, parse_options, report


@dataclass(frozen=True)
class PlayQuestionsOptions:
    """Where the files go, and the seed that draws the questions."""

    out: str = "data_cache/play_questions"
    """The folder for train.jsonl, validation.jsonl and test.jsonl."""
    seed: int = 1337
    """Draws the choices, the answers and the held-out questions (the test plays stay the same)."""
    force: bool = False
    """Replace the files if they exist."""


def play_questions_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, make the questions from the built-in corpus and write them."""
    parser = options_parser(
        "play_questions.py",
        "Write instruction files made from the plays: who speaks these lines, which line comes next? "
        "Split by play.",
        PlayQuestionsOptions,
    )
    try:
        (opts,) = parse_options(parser, args, PlayQuestionsOptions)
        splits = corpus_splits(opts.seed)
        with another_folder_with("--out"):
            paths = write_splits(Path(opts.out), splits, opts.force)
    except USER_ERRORS as err:
        return report(err)
    for name, path in paths.items():
        plays = Counter(row["play"] for row in splits[name])
        kinds = Counter(row["kind"] for row in splits[name])
        each = ", ".join(f"{kinds[kind]:,} {kind}" for kind in KINDS)
        print(f"{path}: {len(splits[name]):,} questions on {len(plays)} plays ({each})")
    print(f"held out for test: {', '.join(TEST_PLAYS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(play_questions_main())
