"""Map-style datasets of fixed-length windows over a token file.

Item ``i`` is ``(x, y)``: two int64 tensors of shape ``(T,)`` cut from ``T + 1`` consecutive tokens
starting at ``offsets[i]``, with ``y[t] = x[t + 1]`` (the next token is the target).

Being map-style with a fixed length is what lets Lightning's DistributedSampler hand every DDP rank
a disjoint share of the windows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


class TokenWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Windows of ``context_length + 1`` tokens at given offsets into a ``.bin`` token file."""

    def __init__(self, path: Path, dtype: str, context_length: int, offsets: np.ndarray) -> None:
        """
        Args:
            path: Token file written by :func:`minigpt.data.prepare.prepare`.
            dtype: Its numpy dtype name (``"uint16"`` or ``"uint32"``).
            context_length: ``T``, tokens per input sequence.
            offsets: ``(num_windows,)`` start positions, each ``<= num_tokens - T - 1``.
        """
        self.path = path
        self.dtype = dtype
        self.context_length = context_length
        self.offsets = offsets
        self._tokens: np.memmap | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tokens is None:
            # Opened lazily in each process; reads touch only the pages of this window.
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        start = int(self.offsets[index])
        window = torch.from_numpy(self._tokens[start : start + self.context_length + 1].astype(np.int64))
        return window[:-1], window[1:]

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes get the path, not a pickled copy of the whole memory map.
        return {**self.__dict__, "_tokens": None}


def train_windows(
    path: Path, dtype: str, num_tokens: int, context_length: int, seed: int, epoch: int = 0
) -> TokenWindows:
    """``num_tokens // context_length`` windows at uniformly random offsets, so one pass over them
    sees about as many tokens as the split holds. The offsets depend only on ``(seed, epoch)``."""
    rng = np.random.default_rng([seed, epoch])
    offsets = rng.integers(0, num_tokens - context_length, size=num_tokens // context_length)
    return TokenWindows(path, dtype, context_length, offsets)


def val_windows(path: Path, dtype: str, num_tokens: int, context_length: int) -> TokenWindows:
    """Back-to-back windows from the start of the split: every target token is scored exactly once,
    identically in every run."""
    offsets = np.arange((num_tokens - 1) // context_length, dtype=np.int64) * context_length
    return TokenWindows(path, dtype, context_length, offsets)
