"""Conversations as training windows, loss on the assistant: one per window, or several packed.

Each conversation is encoded once (:class:`~.chat.ChatEncoder`) into ids and the mask of the ids
the model learns to write. A window is ``(x, y)`` as :mod:`.windows` cuts them, ``y[t]`` the id
after ``x[t]``, but holds whole conversations, each from its first id, padded at the end; every
target that is not an assistant's id is :data:`IGNORE_INDEX`, which cross-entropy leaves out.

:class:`ConversationWindows` puts one conversation in each window. Padding after it changes
nothing before it: attention is causal. :class:`PackedConversationWindows` (``pack: true``) puts
as many as fit back to back, by greedy first-fit over the conversations in an order the seed
draws (:func:`first_fit`), once: the windows are the same in every run with the same seed, so a
resumed run reads the same batches. A packed window is ``(x, y, segments, positions)``: each
input's conversation within the window (0, 1, ...; the padding one more, attending to itself)
and its place in that conversation, from 0. Given them, ``GPT.forward`` attends within each
conversation only and places each token by its own position, so every conversation's logits
are those it would have alone; the loss is the mean over the batch's assistant tokens either way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import check_batching
from ..errors import DataError
from .instructions import Conversation, read_conversations
from .template import ChatEncoder

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""Target of a position the loss leaves out: cross-entropy's default ``ignore_index``, which
``minigpt.training.loss.next_token_loss`` keeps."""
TOO_LONG = ("truncate", "refuse")
"""What to do with a conversation longer than a window: cut it to the window, or stop with a DataError."""


@dataclass(frozen=True)
class ChatDataConfig:
    """Where instruction or chat data comes from, and what to do with conversations that do not fit."""

    source: str
    """A .jsonl/.json/.parquet file or folder of instruction rows (instruction, input, output) or
    chats (messages), or a hub dataset of them."""
    split: str = "train"
    """Split of a hub dataset."""
    subset: str | None = None
    """Named configuration of a hub dataset."""
    streaming: bool = False
    """Stream a hub dataset instead of downloading it whole first."""
    too_long: str = "truncate"
    """A conversation longer than the context: "truncate" keeps its start and counts it (one that
    keeps none of the assistant's ids is dropped, and counted too); "refuse" stops with an error
    naming its row."""
    val_fraction: float = 0.05
    """Share of the conversations held out for validation (at least one), the same ones in every
    run with the same seed."""
    batch_size: int = 8
    """Windows per batch on each device: a conversation each, or as many as fit with `pack`."""
    pack: bool = True
    """Pack several whole conversations into each window, each attending only to itself, rather
    than one per window, padded. At a context that holds several, fewer windows cover the
    epoch (docs/training.md, "Fine-tuning on conversations")."""
    num_workers: int = 0
    """DataLoader worker processes (0 reads in the training process)."""
    seed: int = 1337
    """Seed for the held-out conversations and the order of each epoch's."""
    tokenizer_path: str | None = None
    """Path to GPT-2's r50k_base.tiktoken ranks file, for machines that cannot download it."""

    def __post_init__(self) -> None:
        check_reading(self, "chat data")


def check_reading(config: Any, what: str, too_long: tuple[str, ...] = TOO_LONG) -> None:
    """The settings chat data and the data that reads conversations like it share (`source`,
    `too_long`, `val_fraction`, `batch_size`, `num_workers`), each refused in one line."""
    if not config.source:
        raise DataError(f"{what} source must not be empty")
    if config.too_long not in too_long:
        raise DataError(f"too_long must be one of {', '.join(too_long)}, got {config.too_long!r}")
    check_batching(config)


@dataclass(frozen=True)
class ChatExamples:
    """Encoded conversations, back to back: conversation ``i`` is ``offsets[i]:offsets[i + 1]``."""

    ids: np.ndarray
    """``(N,)`` uint32: every conversation's ids."""
    learned: np.ndarray
    """``(N,)`` bool: whether the model learns to write each id (the assistant's)."""
    offsets: np.ndarray
    """``(n + 1,)`` int64: where each conversation starts, and the end."""
    truncated: int = 0
    """Conversations cut to the window."""
    dropped: int = 0
    """Conversations left out: cut to the window, none of the assistant's ids were left."""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def conversation(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The ids and the learned mask of conversation ``index``."""
        span = slice(int(self.offsets[index]), int(self.offsets[index + 1]))
        return self.ids[span], self.learned[span]

    def select(self, indices: Iterable[int]) -> ChatExamples:
        """The conversations ``indices``, in that order (the counts of truncated and dropped ones
        stay those of the whole set)."""
        parts = [self.conversation(int(i)) for i in indices]
        lengths = [len(ids) for ids, _ in parts]
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        ids = np.concatenate([ids for ids, _ in parts]) if parts else self.ids[:0]
        learned = np.concatenate([mask for _, mask in parts]) if parts else self.learned[:0]
        return ChatExamples(ids, learned, offsets, self.truncated, self.dropped)


def encode_conversations(
    conversations: Iterable[Conversation],
    encoder: ChatEncoder,
    context_length: int,
    too_long: str = "truncate",
) -> ChatExamples:
    """Every conversation encoded, each fitting a window of ``context_length`` inputs (at most
    ``context_length + 1`` ids, for the targets of the last input).

    Raises:
        DataError: A conversation cannot be encoded, or (``too_long="refuse"``) does not fit; the
            message names its row. Or no conversation is left.
    """
    if too_long not in TOO_LONG:
        raise DataError(f"too_long must be one of {', '.join(TOO_LONG)}, got {too_long!r}")
    limit = context_length + 1
    ids, learned, lengths, truncated, dropped = [], [], [], 0, 0
    for conversation in conversations:
        try:
            tokens, mask = encoder.encode(conversation.messages)
        except DataError as error:
            raise DataError(f"{conversation.where}: {error}") from None
        if len(tokens) > limit:
            if too_long == "refuse":
                raise DataError(
                    f"{conversation.where} is {len(tokens)} tokens, more than a window of {context_length}"
                    " (+1 target) holds; shorten it, raise the context length or set too_long: truncate"
                )
            truncated += 1
            tokens, mask = tokens[:limit], mask[:limit]
            if not mask[1:].any():  # the first id is never a target
                dropped += 1
                continue
        ids.append(tokens)
        learned.append(mask)
        lengths.append(len(tokens))
    if truncated:
        logger.warning(
            "%d conversation(s) longer than the context of %d were truncated; %d kept none of the"
            " assistant's tokens and were dropped",
            truncated,
            context_length,
            dropped,
        )
    if not ids:
        raise DataError("no conversation is left to train on")
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    return ChatExamples(np.concatenate(ids), np.concatenate(learned), offsets, truncated, dropped)


def load_chat_examples(config: ChatDataConfig, encoder: ChatEncoder, context_length: int) -> ChatExamples:
    """The conversations of ``config.source``, encoded for windows of ``context_length`` inputs.

    Raises:
        DataError: The source cannot be read, a row is wrong, or (refusing) a conversation is too long.
    """
    conversations = read_conversations(config.source, config.split, config.subset, config.streaming)
    return encode_conversations(conversations, encoder, context_length, config.too_long)


class ConversationWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Window ``i`` is conversation ``i``: ``(x, y)``, each ``(T,)`` int64, padded after it with
    ``pad_id`` in ``x`` and :data:`IGNORE_INDEX` in ``y``, which also stands in every target that
    is not the assistant's."""

    def __init__(self, examples: ChatExamples, context_length: int, pad_id: int) -> None:
        """
        Args:
            examples: Conversations of at most ``context_length + 1`` ids (:func:`encode_conversations`).
            context_length: ``T``, inputs per window.
            pad_id: Input id after the conversation (any id: no target depends on it).
        """
        longest = int(np.diff(examples.offsets).max(initial=0))
        if longest > context_length + 1:
            raise ValueError(f"a conversation of {longest} ids does not fit a window of {context_length}")
        self.examples = examples
        self.context_length = context_length
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, learned = self.examples.conversation(index)
        ids = torch.from_numpy(ids.astype(np.int64))
        x = torch.full((self.context_length,), self.pad_id, dtype=torch.int64)
        y = torch.full((self.context_length,), IGNORE_INDEX, dtype=torch.int64)
        n = len(ids) - 1  # inputs with a target
        x[:n], y[:n] = ids[:-1], ids[1:]
        y[:n][~torch.from_numpy(learned[1:])] = IGNORE_INDEX
        return x, y


def first_fit(lengths: np.ndarray, capacity: int, order: np.ndarray) -> list[list[int]]:
    """Greedy first-fit: the items ``order`` names, in that order, each put in the first window
    that has ``lengths[item]`` of its ``capacity`` left, a new one when none has. Returns the
    windows in the order they were opened, each the items it holds in the order they came.
    Every length must be at most ``capacity``."""
    room = np.full(len(order) + 1, capacity, dtype=np.int64)  # never more windows than items
    windows: list[list[int]] = []
    for item in order.tolist():
        # The first window with room; one not yet opened always has it.
        window = int(np.argmax(room[: len(windows) + 1] >= lengths[item]))
        if window == len(windows):
            windows.append([])
        windows[window].append(item)
        room[window] -= lengths[item]
    return windows


class PackedConversationWindows(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]):
    """Window ``i`` holds whole conversations back to back, as many as :func:`first_fit` put
    there: ``(x, y, segments, positions)``, each ``(T,)`` int64. ``x`` and ``y`` are each
    conversation's inputs and targets as :class:`ConversationWindows` has them, one after the
    other, then padding (``pad_id``, :data:`IGNORE_INDEX`); ``segments`` numbers the
    conversations 0, 1, ... and the padding after them one more; ``positions`` counts from 0 in
    each."""

    def __init__(self, examples: ChatExamples, context_length: int, pad_id: int, seed: int) -> None:
        """
        Args:
            examples: Conversations of at most ``context_length + 1`` ids (:func:`encode_conversations`).
            context_length: ``T``, inputs per window.
            pad_id: Input id after the conversations (any id: no target depends on it).
            seed: Draws the order in which conversations are packed.
        """
        inputs = np.diff(examples.offsets) - 1  # inputs with a target, what a conversation takes
        if int(inputs.max(initial=0)) > context_length:
            raise ValueError(
                f"a conversation of {int(inputs.max()) + 1} ids does not fit a window of {context_length}"
            )
        self.examples = examples
        self.context_length = context_length
        self.pad_id = pad_id
        order = np.random.default_rng(seed).permutation(len(examples))
        self.windows = first_fit(inputs, context_length, order)
        """The conversations each window holds, in order."""

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        t = self.context_length
        x = np.full(t, self.pad_id, dtype=np.int64)
        y = np.full(t, IGNORE_INDEX, dtype=np.int64)
        segments = np.empty(t, dtype=np.int64)
        positions = np.empty(t, dtype=np.int64)
        start = 0
        conversations = self.windows[index]
        for segment, conversation in enumerate(conversations):
            ids, learned = self.examples.conversation(conversation)
            ids = ids.astype(np.int64)
            end = start + len(ids) - 1
            x[start:end], y[start:end] = ids[:-1], np.where(learned[1:], ids[1:], IGNORE_INDEX)
            segments[start:end], positions[start:end] = segment, np.arange(end - start)
            start = end
        # The padding is a sequence of its own: each of its inputs sees itself, and no conversation sees it.
        segments[start:], positions[start:] = len(conversations), np.arange(t - start)
        return tuple(torch.from_numpy(array) for array in (x, y, segments, positions))
