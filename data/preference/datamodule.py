"""PreferenceDataModule: preference pairs for DPO, a chosen and a rejected conversation each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L
import numpy as np
from torch.utils.data import DataLoader

from ..chat.conversations import check_reading
from ..chat.datamodule import held_out
from ..chat.template import ChatEncoder
from ..config import CountsBatches
from ..datamodule import loader_options
from ..errors import DataError
from ..loader import EpochShuffle, ResumableLoader
from ..tokenizer import ChatTokenizer, tokenizer_from_spec, with_chat_tokens
from ..windows import ValWindowSampler
from .examples import TOO_LONG, PairWindows, PreferenceExamples, encode_pairs
from .pairs import read_pairs


@dataclass(frozen=True)
class PreferenceDataConfig:
    """Where preference pairs come from, and how they are held out and batched."""

    source: str
    """A .jsonl/.json/.parquet file or folder of preference rows (prompt, chosen, rejected) or
    play questions, or a hub dataset of them."""
    split: str = "train"
    """Split of a hub dataset."""
    subset: str | None = None
    """Named configuration of a hub dataset."""
    streaming: bool = False
    """Stream a hub dataset instead of downloading it whole first."""
    too_long: str = "truncate"
    """A pair longer than the context: "truncate" keeps its start and counts it (one that keeps
    none of an answer's ids is dropped, and counted too); "refuse" stops with an error naming its row."""
    max_pairs: int | None = None
    """Use this many of the source's pairs at most, drawn by the seed (the same in every run);
    null: all. The reference scores every pair used once before the first step, so a run that
    sees a fraction of a large source saves that time here."""
    val_fraction: float = 0.05
    """Share of the pairs held out for validation (at least one), the same ones in every run."""
    batch_size: int = 8
    """Pairs per batch on each device (each two conversations)."""
    num_workers: int = 0
    """DataLoader worker processes (0 reads in the training process)."""
    seed: int = 1337
    """Seed for the held-out pairs and the order of each epoch's."""
    tokenizer_path: str | None = None
    """Path to GPT-2's r50k_base.tiktoken ranks file, for machines that cannot download it."""

    def __post_init__(self) -> None:
        check_reading(self, "preference data", TOO_LONG)
        if self.max_pairs is not None and self.max_pairs < 2:
            raise DataError(f"max_pairs must be at least 2 (one held out) or null, got {self.max_pairs}")


class PreferenceDataModule(CountsBatches, L.LightningDataModule):
    """Batches of ``(x, y, index)``: ``x`` and ``y`` ``(B, 2, T)`` int64, the chosen and the
    rejected conversation of each pair with targets on the answer's ids alone, and ``index``
    ``(B,)`` the pairs' places in their split (:class:`~.examples.PairWindows`).

    As chat data, the pairs are read with the tokenizer of the weights being tuned plus the chat
    markers: train.py hands its spec to :meth:`use_tokenizer` from ``model.init_from``. ``setup``
    reads and encodes every pair; ``pairs.val_fraction`` of them are held out, the same in every
    run. The training loader shuffles the rest anew each epoch and resumes mid-epoch exactly.
    """

    def __init__(self, pairs: PreferenceDataConfig, context_length: int = 128) -> None:
        """
        Args:
            pairs: Where the pairs come from, and how they are held out and batched.
            context_length: ``T``, ids per window (the model's context length).
        """
        super().__init__()
        if context_length < 1:
            raise DataError(f"context_length must be at least 1, got {context_length}")
        self.config = pairs
        """The settings, under the name the other data modules' have (the batch size is read from all)."""
        self.context_length = context_length
        self._base_spec: dict[str, Any] | None = None
        self._tokenizer: ChatTokenizer | None = None
        self._splits: dict[str, PreferenceExamples] = {}

    def use_tokenizer(self, spec: dict[str, Any]) -> None:
        """Read the pairs with the tokenizer ``spec`` describes (the weights'), plus the markers."""
        self._base_spec = spec

    def setup(self, stage: str | None = None) -> None:
        if self._splits:
            return
        if self._base_spec is None:
            raise DataError(
                "preference data is read with the tokenizer of the weights it tunes: set --model.init_from"
            )
        config = self.config
        tokenizer = with_chat_tokens(tokenizer_from_spec(self._base_spec, config.tokenizer_path))
        pairs = list(read_pairs(config.source, config.split, config.subset, config.streaming))
        if config.max_pairs is not None and len(pairs) > config.max_pairs:
            drawn = np.random.default_rng(config.seed).choice(len(pairs), config.max_pairs, replace=False)
            pairs = [pairs[i] for i in np.sort(drawn)]
        examples = encode_pairs(pairs, ChatEncoder(tokenizer), self.context_length, config.too_long)
        if len(examples) < 2:
            raise DataError(f"preference data needs at least 2 pairs (one held out), got {len(examples)}")
        val = held_out(len(examples), config.val_fraction, config.seed)
        train = np.setdiff1d(np.arange(len(examples)), val)
        self._splits = {"train": examples.select(train), "val": examples.select(val)}
        self._tokenizer = tokenizer

    @property
    def tokenizer(self) -> ChatTokenizer:
        """The weights' tokenizer with the chat markers (after :meth:`setup`)."""
        if self._tokenizer is None:
            raise RuntimeError("PreferenceDataModule.setup() must run before tokenizer is used")
        return self._tokenizer

    def windows(self, split: str) -> PairWindows:
        """The pairs of ``"train"`` or ``"val"`` as windows (after :meth:`setup`)."""
        if split not in self._splits:
            raise RuntimeError("PreferenceDataModule.setup() must run before its data is used")
        return PairWindows(self._splits[split], self.context_length, self.tokenizer.end_id)

    def train_tokens(self) -> int:
        """Ids the training pairs hold, both conversations of each."""
        train = self._splits["train"]
        return len(train.chosen.ids) + len(train.rejected.ids)

    batch_rows = ("pairs", 2)
    """A row of a batch: a pair, its chosen and its rejected window (`micro_batch`)."""

    def summary(self) -> str:
        """What the data is, for the run's summary."""
        train, val = self._splits["train"], self._splits["val"]
        return (
            f"{self.config.source}, {self.tokenizer.name} tokens and chat markers: {len(train):,} "
            f"preference pairs for training, {len(val):,} for validation"
        )

    def train_dataloader(self) -> ResumableLoader:
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        windows = self.windows("train")
        if len(windows) < num_replicas * self.config.batch_size:
            raise DataError(
                f"{len(windows)} training pairs cannot fill a batch of {self.config.batch_size} on "
                f"{num_replicas} process(es): lower data.pairs.batch_size"
            )
        sampler = EpochShuffle(windows, self.config.seed, num_replicas, rank)
        return ResumableLoader(windows, sampler=sampler, drop_last=True, **self._loader_options())

    def val_dataloader(self) -> DataLoader:
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        windows = self.windows("val")
        if len(windows) < num_replicas:  # a rank with nothing to score would hang the others
            raise DataError(
                f"{len(windows)} validation pairs for {num_replicas} processes: raise "
                "data.pairs.val_fraction or use fewer processes"
            )
        sampler = ValWindowSampler(windows, range(len(windows)), num_replicas, rank)
        return DataLoader(windows, sampler=sampler, drop_last=False, **self._loader_options())

    def _loader_options(self) -> dict[str, Any]:
        return loader_options(self.config.batch_size, self.config.num_workers, self.config.seed)
