"""Fixed-length windows over token shards, and the samplers that pick the training and validation windows.

The window at start position ``s`` of a segment is ``(x, y)``: two int64 tensors of shape ``(T,)``
cut from the ``T + 1`` tokens from ``s`` on, with ``y[t] = x[t + 1]`` (the next token is the target).

Samplers hand the dataset window indices, a pure function of the split's layout, never positions
in a table: a worker process then needs nothing but the files to serve any window, whatever the epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

from .prepared import Segment


class TokenWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Every window of ``context_length + 1`` tokens within the segments of one split, keyed by index.

    Windows never span two segments (two shard files, or the split point). Index ``i`` is the
    ``i``-th window start counting segment after segment; with one segment it is the start position.
    """

    def __init__(self, segments: Sequence[Segment], dtype: str, context_length: int) -> None:
        """
        Args:
            segments: The split's pieces of shard files (:meth:`PreparedData.segments`).
            dtype: Their numpy dtype name (``"uint16"`` or ``"uint32"``).
            context_length: ``T``, tokens per input sequence.
        """
        self.segments = list(segments)
        self.dtype = dtype
        self.context_length = context_length
        self.num_tokens = sum(len(s) for s in self.segments)
        starts = [max(len(s) - context_length, 0) for s in self.segments]
        self._first = np.concatenate([[0], np.cumsum(starts, dtype=np.int64)])  # first index of each segment
        self._tokens: dict[Path, np.memmap] = {}

    def __len__(self) -> int:
        """Number of window starts, ``len - T`` per segment."""
        return int(self._first[-1])

    def locate(self, index: int) -> tuple[Segment, int]:
        """The segment window ``index`` lies in, and its start position in that segment."""
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} is outside 0..{len(self) - 1}")
        which = int(np.searchsorted(self._first, index, side="right")) - 1
        return self.segments[which], index - int(self._first[which])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        segment, start = self.locate(index)
        tokens = self._tokens.get(segment.path)
        if tokens is None:
            # Opened lazily in each process; reads touch only the pages of this window.
            tokens = self._tokens[segment.path] = np.memmap(segment.path, dtype=self.dtype, mode="r")
        begin = segment.start + start
        window = torch.from_numpy(tokens[begin : begin + self.context_length + 1].astype(np.int64))
        return window[:-1], window[1:]

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes get the paths, not pickled copies of the memory maps.
        return {**self.__dict__, "_tokens": {}}


def train_offsets(
    num_tokens: int,
    context_length: int,
    seed: int,
    epoch: int,
    num_starts: int | None = None,
    least: int = 0,
) -> np.ndarray:
    """Indices of one epoch's training windows, ``(max(num_tokens // T, least),)`` int64.

    Uniformly random over the ``num_starts`` window starts (default ``num_tokens - T``: one
    segment, where an index is a start position), so one pass sees about as many tokens as the
    split holds (at least ``least`` windows, for a text smaller than a batch), and a function of
    ``(seed, epoch)`` alone.
    """
    rng = np.random.default_rng([seed, epoch])
    high = num_tokens - context_length if num_starts is None else num_starts
    return rng.integers(0, high, size=max(num_tokens // context_length, least))


def val_offsets(windows: TokenWindows, max_tokens: int | None = None) -> list[int]:
    """The validation windows: back to back within each segment, so every target token is scored
    at most once; when they hold more than ``max_tokens`` targets, ``max_tokens // T`` of them
    spread evenly over the split. The same in every run, whatever the devices or batch size."""
    T = windows.context_length
    back_to_back = [
        first + np.arange(0, (len(segment) - 1) // T * T, T, dtype=np.int64)
        for first, segment in zip(windows._first, windows.segments, strict=False)
    ]
    indices = np.concatenate(back_to_back) if back_to_back else np.zeros(0, dtype=np.int64)
    keep = len(indices) if max_tokens is None else max(1, max_tokens // T)
    if keep < len(indices):
        indices = indices[np.arange(keep, dtype=np.int64) * len(indices) // keep]
    return indices.tolist()


def validated_windows(
    windows: TokenWindows, max_tokens: int | None, limit_batches: int | float | None, batch_size: int
) -> list[int]:
    """The windows one validation scores over every rank together: :func:`val_offsets`, then, for a
    whole number ``limit_batches`` (Lightning's ``limit_val_batches``), the first ``limit_batches``
    batches' worth of them. The limit counts batches of the whole run, not of each process, so one
    process and N validate on the same windows; a fraction is left to Lightning, per process."""
    offsets = val_offsets(windows, max_tokens)
    if isinstance(limit_batches, int) and not isinstance(limit_batches, bool):
        offsets = offsets[: limit_batches * batch_size]
    return offsets


class ValWindowSampler(DistributedSampler):
    """One rank's share of the validation windows: windows ``r, r + R, r + 2R, ...`` of the
    given ones, each scored by exactly one rank.

    Torch's ``DistributedSampler``, which Lightning puts on a validation loader under DDP, pads
    the shares to one length by repeating windows, which would then count twice; this one leaves
    them uneven by at most one window. As a ``DistributedSampler``, Lightning neither wraps nor
    replaces it.
    """

    def __init__(
        self, windows: TokenWindows, offsets: Sequence[int], num_replicas: int = 1, rank: int = 0
    ) -> None:
        """
        Args:
            windows: The validation split.
            offsets: The windows of the whole validation (:func:`validated_windows`).
            num_replicas: Number of ranks sharing it.
            rank: This rank, ``0 <= rank < num_replicas``.
        """
        super().__init__(windows, num_replicas, rank, shuffle=False, drop_last=False)
        self.share = list(offsets[rank::num_replicas])
        self.num_samples = len(self.share)
        self.total_size = len(offsets)

    def __iter__(self) -> Iterator[int]:
        return iter(self.share)

    def __len__(self) -> int:
        return self.num_samples


class TrainWindowSampler(DistributedSampler):
    """One rank's share of an epoch's random training windows, as start positions.

    A :class:`~torch.utils.data.DistributedSampler`, so Lightning neither wraps nor replaces it
    under DDP; the rank and the number of ranks are given, never read from ``torch.distributed``.
    Rank ``r`` of ``R`` takes windows ``r, r + R, r + 2R, ...`` of :func:`train_offsets`; the tail
    that does not divide evenly is dropped, so every rank has the same number of batches. A text
    smaller than ``least_per_rank`` windows per rank still gives each rank that many a pass.

    :meth:`set_epoch` (Lightning calls it before every epoch) selects the epoch's windows; only the
    running epoch's share is held in memory, and only while it is being iterated.
    """

    def __init__(
        self, windows: TokenWindows, seed: int, num_replicas: int = 1, rank: int = 0, least_per_rank: int = 0
    ) -> None:
        """
        Args:
            windows: The training split.
            seed: With the epoch, determines every window.
            num_replicas: Number of ranks sharing the epoch.
            rank: This rank, ``0 <= rank < num_replicas``.
            least_per_rank: Windows each rank takes in an epoch at the least (one batch: an epoch
                of none would end the run before its first step).
        """
        super().__init__(windows, num_replicas, rank, shuffle=False, seed=seed, drop_last=True)
        self.windows = windows
        self.least = least_per_rank * num_replicas
        self.num_samples = max(windows.num_tokens // windows.context_length, self.least) // num_replicas
        self.total_size = self.num_samples * num_replicas
        self._start = 0

    def start_at(self, position: int) -> None:
        """Make the next iteration (only) begin at this rank's ``position``-th window of the epoch."""
        self._start = position

    def offsets(self) -> np.ndarray:
        """This rank's start positions for the current epoch, ``(num_samples,)`` int64."""
        windows = self.windows
        offsets = train_offsets(
            windows.num_tokens, windows.context_length, self.seed, self.epoch, len(windows), self.least
        )
        return offsets[self.rank : self.total_size : self.num_replicas].copy()  # frees the other ranks' part

    def __iter__(self) -> Iterator[int]:
        start, self._start = self._start, 0
        for offset in self.offsets()[start:]:
            yield int(offset)
