"""Data of the task files in this folder, read from beside them whatever the working directory (an
lm-eval `custom_dataset`: called with the task's metadata, returns its splits)."""

from __future__ import annotations

from pathlib import Path

import datasets


def sonnets(**_: object) -> datasets.DatasetDict:
    return datasets.load_dataset("json", data_files={"test": str(Path(__file__).with_name("sonnets.jsonl"))})


def play_speakers(seed: int = 1337, **_: object) -> datasets.DatasetDict:
    """Who speaks these lines: the questions on the held-out plays (test) and on the others'
    held-out speeches (validation, for few-shot examples), made from the cached corpus as the
    files are."""
    return _play_questions("speaker", seed)


def play_next_line(seed: int = 1337, **_: object) -> datasets.DatasetDict:
    """Which line comes next: the questions on the held-out plays (test) and on the others'
    held-out speeches (validation), made from the cached corpus as the files are."""
    return _play_questions("next_line", seed)


def _play_questions(kind: str, seed: int) -> datasets.DatasetDict:
    from minigpt.data.questions.make import corpus_splits

    splits = corpus_splits(seed)
    return datasets.DatasetDict(
        {
            name: datasets.Dataset.from_list([row for row in splits[name] if row["kind"] == kind])
            for name in ("validation", "test")
        }
    )
