"""LightningDataModule that serves conversations for supervised fine-tuning, one per window or packed."""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
from torch.utils.data import DataLoader

from ..config import WINDOWS, CountsBatches
from ..datamodule import loader_options
from ..errors import DataError
from ..loader import EpochShuffle, ResumableLoader
from ..tokenizer import ChatTokenizer, tokenizer_from_spec, with_chat_tokens
from ..windows import ValWindowSampler
from .conversations import (
    ChatDataConfig,
    ChatExamples,
    ConversationWindows,
    PackedConversationWindows,
    load_chat_examples,
)
from .template import ChatEncoder


def held_out(count: int, fraction: float, seed: int) -> np.ndarray:
    """The conversations validation scores, ``(max(1, round(count * fraction)),)`` int64, sorted:
    a function of the count, the fraction and the seed alone."""
    if count < 2:
        raise DataError(f"chat data needs at least 2 conversations (one held out), got {count}")
    keep = min(max(1, round(count * fraction)), count - 1)
    return np.sort(np.random.default_rng(seed).permutation(count)[:keep])


class ChatDataModule(CountsBatches, L.LightningDataModule):
    """Batches of ``(x, y)``, each ``(B, T)`` int64: one conversation per row, padded, with ``y``
    the next ids of ``x`` where the assistant writes them and ``-100`` (cross-entropy's ignore
    index) everywhere else (:class:`~.chat_data.ConversationWindows`). With ``pack``, rows hold
    several conversations and batches are ``(x, y, segments, positions)``, the last two what
    ``GPT.forward`` takes to keep them apart (:class:`~.chat_data.PackedConversationWindows`).

    The conversations are read with the tokenizer of the weights being fine-tuned, plus the chat
    markers (:class:`~.tokenizer.ChatTokenizer`): train.py hands its spec to
    :meth:`use_tokenizer` from ``model.init_from``. ``setup`` reads and encodes every
    conversation; ``config.val_fraction`` of them, drawn by ``config.seed``, are held out for
    validation, the same in every run. The training loader shuffles the rest anew each epoch
    and resumes mid-epoch exactly (:class:`~.loader.ResumableLoader`).
    """

    # Not `config` as TextDataModule's: a config that picks this module over the default one
    # would carry the text settings over to a parameter of the same name.
    def __init__(self, conversations: ChatDataConfig, context_length: int = 128) -> None:
        """
        Args:
            conversations: Where the conversations come from, and how they are held out and batched.
            context_length: ``T``, ids per window (the model's context length).
        """
        super().__init__()
        if context_length < 1:
            raise DataError(f"context_length must be at least 1, got {context_length}")
        self.config = conversations
        """The settings, under the name TextDataModule's have (the batch size is read from both)."""
        self.context_length = context_length
        self._base_spec: dict[str, Any] | None = None
        self._tokenizer: ChatTokenizer | None = None
        self._train: ChatExamples | None = None
        self._val: ChatExamples | None = None
        self._packed: dict[str, PackedConversationWindows] = {}

    def use_tokenizer(self, spec: dict[str, Any]) -> None:
        """Read the conversations with the tokenizer ``spec`` describes (the weights'), plus the markers."""
        self._base_spec = spec

    def setup(self, stage: str | None = None) -> None:
        if self._train is not None:
            return
        if self._base_spec is None:
            raise DataError(
                "chat data is read with the tokenizer of the weights it fine-tunes: set --model.init_from"
            )
        tokenizer = with_chat_tokens(tokenizer_from_spec(self._base_spec, self.config.tokenizer_path))
        examples = load_chat_examples(self.config, ChatEncoder(tokenizer), self.context_length)
        val = held_out(len(examples), self.config.val_fraction, self.config.seed)
        train = np.setdiff1d(np.arange(len(examples)), val)
        self._train, self._val = examples.select(train), examples.select(val)
        self._tokenizer = tokenizer

    @property
    def tokenizer(self) -> ChatTokenizer:
        """The weights' tokenizer with the chat markers (after :meth:`setup`)."""
        if self._tokenizer is None:
            raise RuntimeError("ChatDataModule.setup() must run before tokenizer is used")
        return self._tokenizer

    def examples(self, split: str) -> ChatExamples:
        """The encoded conversations of ``"train"`` or ``"val"`` (after :meth:`setup`)."""
        examples = {"train": self._train, "val": self._val}[split]
        if examples is None:
            raise RuntimeError("ChatDataModule.setup() must run before its data is used")
        return examples

    def train_tokens(self) -> int:
        """Ids the training conversations hold."""
        return len(self.examples("train").ids)

    batch_rows = WINDOWS
    """What a row of a batch is (`micro_batch`): a window, padding included."""

    def summary(self) -> str:
        """What the data is, for the run's summary."""
        train, val = self.examples("train"), self.examples("val")
        learned = int(train.learned.sum())
        packed = f", packed into {len(self._windows('train')):,} windows" if self.config.pack else ""
        return (
            f"{self.config.source}, {self.tokenizer.name} tokens and chat markers: {len(train):,} "
            f"conversations ({learned:,} of {len(train.ids):,} tokens the assistant's){packed} for "
            f"training, {len(val):,} for validation"
        )

    def train_dataloader(self) -> ResumableLoader:
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        windows = self._windows("train")
        if len(windows) < num_replicas * self.config.batch_size:
            what = "window(s) of packed conversations" if self.config.pack else "conversation(s)"
            raise DataError(
                f"{len(windows)} training {what} cannot fill a batch of {self.config.batch_size} "
                f"on {num_replicas} process(es): lower data.conversations.batch_size"
            )
        sampler = EpochShuffle(windows, self.config.seed, num_replicas, rank)
        return ResumableLoader(windows, sampler=sampler, drop_last=True, **self._loader_options())

    def val_dataloader(self) -> DataLoader:
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        windows = self._windows("val")
        if len(windows) < num_replicas:
            # A rank with nothing to score would skip the validation forward in which DDP
            # broadcasts the model's buffers, and the others would wait for it forever.
            what = "window(s) of packed conversations" if self.config.pack else "conversation(s)"
            raise DataError(
                f"{len(windows)} validation {what} for {num_replicas} processes: raise "
                "data.conversations.val_fraction or use fewer processes"
            )
        sampler = ValWindowSampler(windows, range(len(windows)), num_replicas, rank)
        return DataLoader(windows, sampler=sampler, drop_last=False, **self._loader_options())

    def _windows(self, split: str) -> ConversationWindows | PackedConversationWindows:
        # Any input id serves as padding: no target depends on what follows a conversation.
        examples, pad_id = self.examples(split), self.tokenizer.end_id
        if not self.config.pack:
            return ConversationWindows(examples, self.context_length, pad_id)
        if split not in self._packed:  # packed once: the same windows in every epoch
            self._packed[split] = PackedConversationWindows(
                examples, self.context_length, pad_id, self.config.seed
            )
        return self._packed[split]

    def _loader_options(self) -> dict[str, Any]:
        return loader_options(self.config.batch_size, self.config.num_workers, self.config.seed)
