"""Preference pairs as training windows: the chosen and the rejected conversation, each scored on
its answer's tokens alone.

Each pair is encoded twice through the chat template (:class:`~minigpt.data.chat.ChatEncoder`):
the prompt followed by the chosen answer, and by the rejected one. A window is ``(x, y, index)``:
``x`` and ``y`` ``(2, T)``, row 0 the chosen conversation and row 1 the rejected, ``y[t]`` the id
after ``x[t]`` where that id is the answer's (its text and the end marker) and ``IGNORE_INDEX``
everywhere else (the prompt, earlier turns, padding); ``index`` is the pair's place in its split,
where the reference's log-probabilities of it are kept (``minigpt.training.dpo``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from ..chat.conversations import IGNORE_INDEX, ChatExamples
from ..chat.template import ChatEncoder
from ..errors import DataError
from .pairs import Pair

logger = logging.getLogger(__name__)

TOO_LONG = ("truncate", "refuse")
"""What to do with a pair longer than a window: cut both conversations to it, or stop with a DataError."""


def last_turn(learned: np.ndarray) -> np.ndarray:
    """``learned`` (N,) bool with only its last run of True kept: the last assistant turn."""
    out = np.zeros_like(learned)
    end = len(learned)
    while end and not learned[end - 1]:
        end -= 1
    start = end
    while start and learned[start - 1]:
        start -= 1
    out[start:end] = True
    return out


@dataclass(frozen=True)
class PreferenceExamples:
    """Encoded pairs: pair ``i`` is conversation ``i`` of ``chosen`` and of ``rejected``, whose
    ``learned`` masks hold the answer's ids alone."""

    chosen: ChatExamples
    rejected: ChatExamples

    def __len__(self) -> int:
        return len(self.chosen)

    def select(self, indices: Iterable[int]) -> PreferenceExamples:
        """The pairs ``indices``, in that order."""
        indices = list(indices)
        return PreferenceExamples(self.chosen.select(indices), self.rejected.select(indices))


def encode_pairs(
    pairs: Iterable[Pair], encoder: ChatEncoder, context_length: int, too_long: str = "truncate"
) -> PreferenceExamples:
    """Every pair encoded, each conversation at most ``context_length + 1`` ids.

    Raises:
        DataError: A pair cannot be encoded, or (``too_long="refuse"``) does not fit; the message
            names its row. Or no pair is left.
    """
    if too_long not in TOO_LONG:
        raise DataError(f"too_long must be one of {', '.join(TOO_LONG)}, got {too_long!r}")
    limit = context_length + 1
    sides: tuple[list, list] = ([], [])
    truncated = dropped = 0
    for pair in pairs:
        encoded = []
        for answer in (pair.chosen, pair.rejected):
            try:
                ids, learned = encoder.encode([*pair.prompt, {"role": "assistant", "content": answer}])
            except DataError as error:
                raise DataError(f"{pair.where}: {error}") from None
            encoded.append((ids, last_turn(learned)))
        if any(len(ids) > limit for ids, _ in encoded):
            longest = max(len(ids) for ids, _ in encoded)
            if too_long == "refuse":
                raise DataError(
                    f"{pair.where} is {longest} tokens, more than a window of {context_length} (+1 target) "
                    "holds; shorten it, raise the context length or set too_long: truncate"
                )
            truncated += 1
            encoded = [(ids[:limit], learned[:limit]) for ids, learned in encoded]
            if not all(learned[1:].any() for _, learned in encoded):  # an answer lost all its ids
                dropped += 1
                continue
        for side, example in zip(sides, encoded, strict=True):
            side.append(example)
    if truncated:
        logger.warning(
            "%d pair(s) longer than the context of %d were truncated; %d kept none of an answer's "
            "tokens and were dropped",
            truncated,
            context_length,
            dropped,
        )
    if not sides[0]:
        raise DataError("no preference pair is left to train on")
    return PreferenceExamples(*(_examples(side, truncated, dropped) for side in sides))


def _examples(encoded: list[tuple[np.ndarray, np.ndarray]], truncated: int, dropped: int) -> ChatExamples:
    lengths = [len(ids) for ids, _ in encoded]
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    ids = np.concatenate([ids for ids, _ in encoded])
    learned = np.concatenate([learned for _, learned in encoded])
    return ChatExamples(ids, learned, offsets, truncated, dropped)


class PairWindows(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """Window ``i`` is pair ``i``: ``(x, y, i)``, ``x`` and ``y`` ``(2, T)`` int64 (see the module),
    padded with ``pad_id`` in ``x`` (no target depends on it) and ``IGNORE_INDEX`` in ``y``."""

    def __init__(self, examples: PreferenceExamples, context_length: int, pad_id: int) -> None:
        self.examples = examples
        self.context_length = context_length
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        x = torch.full((2, self.context_length), self.pad_id, dtype=torch.int64)
        y = torch.full((2, self.context_length), IGNORE_INDEX, dtype=torch.int64)
        for row, side in enumerate((self.examples.chosen, self.examples.rejected)):
            ids, learned = side.conversation(index)
            ids_t = torch.from_numpy(ids.astype(np.int64))
            n = len(ids) - 1  # inputs with a target
            x[row, :n], y[row, :n] = ids_t[:-1], ids_t[1:]
            y[row, :n][~torch.from_numpy(learned[1:])] = IGNORE_INDEX
        return x, y, index
