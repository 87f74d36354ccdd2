"""Data of the task files in this folder, read from beside them whatever the working directory (an
lm-eval `custom_dataset`: called with the task's metadata, returns its splits)."""

from __future__ import annotations

from pathlib import Path

import datasets


def sonnets(**_: object) -> datasets.DatasetDict:
    return datasets.load_dataset("json", data_files={"test": str(Path(__file__).with_name("sonnets.jsonl"))})


def play_speakers(seed: int = 1337, **_: object) -> datasets.DatasetDict:
    """The questions on the held-out plays (test) and on the others' held-out speeches
    (validation, for few-shot examples), made from the cached corpus as the files are."""
    from minigpt.data.play_questions import corpus_splits

    splits = corpus_splits(seed)
    return datasets.DatasetDict(
        {name: datasets.Dataset.from_list(splits[name]) for name in ("validation", "test")}
    )
