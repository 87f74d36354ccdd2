"""Callbacks that inject failures into a real training run, added with --trainer.callbacks+=..."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path
from typing import Any, BinaryIO

import lightning as L
import torch

from minigpt.common import sha256_file


class PoisonWeights(L.Callback):
    """Before optimizer step `step`, turn one embedding row into NaN, as a blow-up would; under DDP
    on rank `rank` only."""

    def __init__(self, step: int, rank: int = 0) -> None:
        self.step = step
        self.rank = rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            with torch.no_grad():
                pl_module.model.transformer.wte.weight[batch[0][0, 0]] = float("nan")


class SignalAt(L.Callback):
    """Send this process `signum` when optimizer step `step` is reached (SIGKILL: no cleanup at all);
    under DDP, the process of rank `rank` only."""

    def __init__(self, step: int, signum: int = int(signal.SIGKILL), rank: int = 0) -> None:
        self.step = step
        self.signum = signum
        self.rank = rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), self.signum)


class SignalTwiceAt(L.Callback):
    """Send this process `signum` when optimizer step `step` starts, and again before its backward
    pass: a user pressing Ctrl-C a second time while the first is being honoured."""

    def __init__(self, step: int, signum: int = int(signal.SIGINT)) -> None:
        self.step = step
        self.signum = signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class PoisonGradients(L.Callback):
    """Before optimizer step `step`, make one gradient infinite, as an overflow would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step == self.step:
            pl_module.model.lm_head.weight.grad[0, 0] = float("inf")


class PoisonBeforeValidation(L.Callback):
    """Before the validation at step `step`, turn the weights NaN: training never sees them."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.transformer.ln_f.weight.fill_(float("nan"))


class FailingSaveAt:
    """Stands in for `torch.save` (monkeypatched) and fails the `nth` checkpoint (from 1) as a full
    disk (`errno.ENOSPC`) or a folder made read-only (`errno.EACCES`) would: the file takes
    `room` bytes, then its writes raise OSError, and torch's zip writer raises over it. Before it
    fails it hashes the checkpoints already in the folder (`before`), to compare with after."""

    def __init__(self, nth: int, error: int = errno.ENOSPC, room: int = 4096) -> None:
        self.nth, self.error, self.room = nth, error, room
        self.saves = 0
        self.before: dict[str, str] = {}
        """sha256 of each checkpoint in the folder, by name, as the failing save began."""
        self.failed: str | None = None
        """The name of the checkpoint that failed."""
        self._save = torch.save

    def __call__(self, obj: Any, f: BinaryIO, *args: Any, **kwargs: Any) -> None:
        self.saves += 1
        if self.saves != self.nth:
            return self._save(obj, f, *args, **kwargs)
        temporary = Path(f.name)  # atomic_write's ".<name>.<random>.tmp"
        self.failed = temporary.name[1:].rsplit(".", 2)[0]
        self.before = {p.name: sha256_file(p) for p in temporary.parent.glob("*.ckpt")}
        self._save(obj, _FillingFile(f, self.room, self.error), *args, **kwargs)


class _FillingFile:
    """A file that takes `room` bytes, then raises OSError(`error`) at every write."""

    def __init__(self, f: BinaryIO, room: int, error: int) -> None:
        self.f, self.room, self.error = f, room, error

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            raise OSError(self.error, os.strerror(self.error))
        self.room -= len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


class FullDiskAtSave(L.Callback):
    """`FailingSaveAt` in a launched run: the `nth` checkpoint this process writes (from 1) meets a
    full disk. Under DDP only rank 0 writes checkpoints."""

    def __init__(self, nth: int) -> None:
        self.nth = nth

    def setup(self, trainer, pl_module, stage) -> None:
        torch.save = FailingSaveAt(self.nth)
