"""The batches of `QuestionsDataModule`: the questions' prompts for training, and the held-out
questions' choices for validation, each after its prompt."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from ..chat.conversations import IGNORE_INDEX


class Prompts(Dataset[tuple[torch.Tensor, int]]):
    """Each question's prompt ids (P,) int64, and its index among the questions."""

    def __init__(self, prompts: list[list[int]]) -> None:
        self.prompts = prompts

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.tensor(self.prompts[index]), index


def pad_prompts(items: list[tuple[torch.Tensor, int]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """A batch of prompts: their ids (Q, P) padded on the right, their lengths (Q,), their indices (Q,)."""
    lengths = torch.tensor([len(ids) for ids, _ in items])
    ids = torch.full((len(items), int(lengths.max())), pad_id, dtype=torch.long)
    for row, (prompt, _) in enumerate(items):
        ids[row, : len(prompt)] = prompt
    return ids, lengths, torch.tensor([index for _, index in items])


@dataclass(frozen=True)
class HeldOut:
    """A held-out question as validation scores it."""

    sequences: list[list[int]]
    """The prompt's ids followed by each choice's."""
    lengths: list[int]
    """Each choice's ids."""
    chars: list[int]
    """Each choice's characters, by which lm-eval's acc_norm divides its log-likelihood."""
    label: int
    """The right choice."""
    kind: int
    """Its kind's index (`QuestionsDataModule.kinds`)."""


class Choices(Dataset[HeldOut]):
    """The held-out questions."""

    def __init__(self, questions: list[HeldOut]) -> None:
        self.questions = questions

    def __len__(self) -> int:
        return len(self.questions)

    def __getitem__(self, index: int) -> HeldOut:
        return self.questions[index]


def choice_batch(items: list[HeldOut], pad_id: int) -> tuple[torch.Tensor, ...]:
    """`(x, y, counts, chars, labels, kinds)`: x (N, T) each question's prompt followed by one of
    its choices, padded on the right; y (N, T) the next ids where they are the choice's,
    IGNORE_INDEX elsewhere; counts (Q,) each question's choices (N in all); chars (N,) each
    choice's characters; labels and kinds (Q,)."""
    sequences = [(ids, n) for item in items for ids, n in zip(item.sequences, item.lengths, strict=True)]
    width = max(len(ids) for ids, _ in sequences) - 1
    x = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    y = torch.full((len(sequences), width), IGNORE_INDEX, dtype=torch.long)
    for row, (ids, n) in enumerate(sequences):
        x[row, : len(ids) - 1] = torch.tensor(ids[:-1])
        y[row, len(ids) - 1 - n : len(ids) - 1] = torch.tensor(ids[-n:])
    counts = torch.tensor([len(item.lengths) for item in items])
    chars = torch.tensor([n for item in items for n in item.chars], dtype=torch.float32)
    return x, y, counts, chars, torch.tensor([i.label for i in items]), torch.tensor([i.kind for i in items])
