"""A training DataLoader that knows how far it got, so a run can resume mid-epoch exactly."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
from torch.utils.data import DataLoader, Dataset, DistributedSampler

logger = logging.getLogger(__name__)


@runtime_checkable
class ResumableSampler(Protocol):
    """A training sampler that can begin an epoch part-way (:class:`~.windows.TrainWindowSampler`,
    :class:`EpochShuffle`)."""

    epoch: int
    num_replicas: int

    def set_epoch(self, epoch: int) -> None: ...

    def start_at(self, position: int) -> None:
        """Make the next iteration (only) begin at this rank's ``position``-th item of the epoch."""


class EpochShuffle(DistributedSampler):
    """One rank's share of an epoch's items (conversation windows, preference pairs, questions),
    shuffled by ``(seed, epoch)``: rank ``r`` of ``R`` takes items ``r, r + R, ...`` of the
    epoch's order, the uneven tail dropped. A :class:`ResumableSampler`."""

    def __init__(self, items: Dataset[Any], seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(items, num_replicas, rank, shuffle=True, seed=seed, drop_last=True)
        self._start = 0

    def start_at(self, position: int) -> None:
        """Make the next iteration (only) begin at this rank's ``position``-th item."""
        self._start = position

    def __iter__(self) -> Iterator[int]:
        start, self._start = self._start, 0
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.dataset))
        share = order[self.rank : self.total_size : self.num_replicas]
        return iter(share[start:].tolist())


class ResumableLoader(DataLoader):
    """A :class:`~torch.utils.data.DataLoader` over a :class:`ResumableSampler` with
    ``state_dict`` / ``load_state_dict``.

    The state is the epoch and the number of batches the consumer has taken from the current
    iteration. Batches are counted as they are handed out, so windows that worker processes
    prefetched but nobody received do not count. Lightning stores the state in every checkpoint
    and loads it before iterating again on resume; the next iteration then starts the sampler
    past the batches already trained on, without reading them.

    Nothing is fixed when ``iter()`` is called: the epoch and the starting batch are read when the
    first batch is requested, so a ``set_epoch`` in between (Lightning calls it after creating the
    iterator) takes effect, and a resume point that belongs to another epoch is dropped.
    """

    sampler: ResumableSampler

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Takes the arguments of :class:`~torch.utils.data.DataLoader`; ``sampler`` must be a
        :class:`ResumableSampler` and ``batch_size`` set."""
        super().__init__(*args, **kwargs)
        if not isinstance(self.sampler, ResumableSampler) or self.batch_size is None:
            raise TypeError("ResumableLoader needs a ResumableSampler and a batch_size")
        self._epoch = 0
        self._batches = 0
        self._resume: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        epoch = self.sampler.epoch
        start = self._resume[1] if self._resume is not None and self._resume[0] == epoch else 0
        self._resume = None
        self.sampler.start_at(start * self.batch_size)
        self._epoch, self._batches = epoch, start
        for batch in super().__iter__():
            self._batches += 1  # before the consumer sees it: a checkpoint taken now includes it
            yield batch

    def state_dict(self) -> dict[str, int]:
        """``epoch`` and ``batches`` taken in it, plus the batch size and the number of ranks they
        were counted in."""
        return {
            "epoch": self._epoch,
            "batches": self._batches,
            "batch_size": self.batch_size,
            "num_replicas": self.sampler.num_replicas,
        }

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Continue from ``state_dict`` at the next iteration.

        With another batch size or number of ranks than the state was saved with, training resumes
        at the same share of the epoch's windows, rounded down to a whole batch.
        """
        epoch, batches = int(state_dict["epoch"]), int(state_dict["batches"])
        saved = (int(state_dict.get("batch_size", self.batch_size)), int(state_dict.get("num_replicas", 1)))
        ours = (self.batch_size, self.sampler.num_replicas)
        if saved != ours:
            windows = batches * saved[0] * saved[1]
            batches = windows // (ours[0] * ours[1])
            if batches * ours[0] * ours[1] != windows:
                logger.warning(
                    "resuming with batch size %d on %d ranks instead of %d on %d: %d of the epoch's windows"
                    " were trained on, continuing after %d",
                    *ours,
                    *saved,
                    windows,
                    batches * ours[0] * ours[1],
                )
        self.sampler.set_epoch(epoch)
        self._epoch, self._batches = epoch, batches
        self._resume = (epoch, batches)
