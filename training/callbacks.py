"""Callbacks and plugins the training run adds to Lightning's own."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


class TokensPerSecond(L.Callback):
    """Training throughput, in tokens per second over all ranks, shown in the progress bar.

    Measured from the end of one optimizer step to the end of the next, so it includes data
    loading, forward, backward and the optimizer.
    """

    def __init__(self) -> None:
        self._last: float | None = None
        self._tokens = 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._tokens += batch[0].numel() * trainer.world_size
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation: the step is not done yet
        now = time.perf_counter()
        if self._last is not None:
            pl_module.log("tokens_per_sec", self._tokens / (now - self._last), prog_bar=True)
        self._last, self._tokens = now, 0

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last, self._tokens = None, 0  # validation time is not training time


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file and renames it into place.

    A kill during a save leaves the previous checkpoint intact: the rename is atomic on POSIX
    and Windows, and the file is flushed to disk before it.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
