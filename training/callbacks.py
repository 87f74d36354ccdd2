"""Callbacks and plugins the training run adds to Lightning's own."""

from __future__ import annotations

import os
import signal
import threading
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


class SaveAndStopOnSignal(L.Callback):
    """On SIGINT (Ctrl-C) or SIGTERM, finish the current optimizer step, save, and stop.

    The checkpoint lands where `--ckpt_path last` finds it. A second signal is not caught, so
    pressing Ctrl-C twice still interrupts at once.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.received: int | None = None
        """The signal number that stopped the run, if one did."""
        self.saved_step: int | None = None
        self._previous: dict[int, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Installed here, after the Trainer's own SIGTERM handler: that one would raise as soon as
        # the current batch ends, before an accumulated optimizer step is complete and saved.
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signum
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # the optimizer step is not complete yet
        stop = self.received is not None
        if trainer.world_size > 1:  # every rank must take part, signalled or not
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop:
            trainer.save_checkpoint(self.path)
            self.saved_step = trainer.global_step
            trainer.should_stop = True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
