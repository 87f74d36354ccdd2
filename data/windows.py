"""Fixed-length windows over a token file, and the sampler that picks the training windows.

The window at start position ``s`` is ``(x, y)``: two int64 tensors of shape ``(T,)`` cut from the
``T + 1`` tokens from ``s`` on, with ``y[t] = x[t + 1]`` (the next token is the target).

Samplers hand the dataset start positions, never positions in a table: a worker process then needs
nothing but the file to serve any window, whatever the epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler


class TokenWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Every window of ``context_length + 1`` tokens of a ``.bin`` token file, keyed by start position."""

    def __init__(self, path: Path, dtype: str, num_tokens: int, context_length: int) -> None:
        """
        Args:
            path: Token file written by :func:`minigpt.data.prepare.prepare`.
            dtype: Its numpy dtype name (``"uint16"`` or ``"uint32"``).
            num_tokens: Tokens in the file.
            context_length: ``T``, tokens per input sequence.
        """
        self.path = path
        self.dtype = dtype
        self.num_tokens = num_tokens
        self.context_length = context_length
        self._tokens: np.memmap | None = None

    def __len__(self) -> int:
        """Number of start positions, ``0 .. num_tokens - T - 1``."""
        return max(self.num_tokens - self.context_length, 0)

    def __getitem__(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= start < len(self):
            raise IndexError(f"window start {start} is outside 0..{len(self) - 1}")
        if self._tokens is None:
            # Opened lazily in each process; reads touch only the pages of this window.
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        window = torch.from_numpy(self._tokens[start : start + self.context_length + 1].astype(np.int64))
        return window[:-1], window[1:]

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes get the path, not a pickled copy of the whole memory map.
        return {**self.__dict__, "_tokens": None}


def train_offsets(num_tokens: int, context_length: int, seed: int, epoch: int) -> np.ndarray:
    """Start positions of one epoch's training windows, ``(num_tokens // T,)`` int64.

    Uniformly random, so one pass sees about as many tokens as the split holds, and a function of
    ``(seed, epoch)`` alone.
    """
    rng = np.random.default_rng([seed, epoch])
    return rng.integers(0, num_tokens - context_length, size=num_tokens // context_length)


def val_offsets(num_tokens: int, context_length: int) -> range:
    """Back-to-back start positions from the start of the split: every target token is scored
    exactly once, identically in every run."""
    return range(0, (num_tokens - 1) // context_length * context_length, context_length)


class TrainWindowSampler(DistributedSampler):
    """One rank's share of an epoch's random training windows, as start positions.

    A :class:`~torch.utils.data.DistributedSampler`, so Lightning neither wraps nor replaces it
    under DDP; the rank and the number of ranks are given, never read from ``torch.distributed``.
    Rank ``r`` of ``R`` takes windows ``r, r + R, r + 2R, ...`` of :func:`train_offsets`; the tail
    that does not divide evenly is dropped, so every rank has the same number of batches.

    :meth:`set_epoch` (Lightning calls it before every epoch) selects the epoch's windows; only the
    running epoch's share is held in memory, and only while it is being iterated.
    """

    def __init__(self, windows: TokenWindows, seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        """
        Args:
            windows: The training split.
            seed: With the epoch, determines every window.
            num_replicas: Number of ranks sharing the epoch.
            rank: This rank, ``0 <= rank < num_replicas``.
        """
        super().__init__(windows, num_replicas, rank, shuffle=False, seed=seed, drop_last=True)
        self.windows = windows
        self.num_samples = windows.num_tokens // windows.context_length // num_replicas
        self.total_size = self.num_samples * num_replicas
        self._start = 0

    def start_at(self, position: int) -> None:
        """Make the next iteration (only) begin at this rank's ``position``-th window of the epoch."""
        self._start = position

    def offsets(self) -> np.ndarray:
        """This rank's start positions for the current epoch, ``(num_samples,)`` int64."""
        offsets = train_offsets(self.windows.num_tokens, self.windows.context_length, self.seed, self.epoch)
        return offsets[self.rank : self.total_size : self.num_replicas].copy()  # frees the other ranks' part

    def __iter__(self) -> Iterator[int]:
        start, self._start = self._start, 0
        for offset in self.offsets()[start:]:
            yield int(offset)
