"""Checkpoints that are whole or absent: written atomically, with the free space checked first, a
one-line reason where one cannot be written (a full disk, a folder the run may not write), and a
`last.ckpt` that always holds the end of the run."""

from __future__ import annotations

import errno
import logging
import re
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.plugins.io import TorchCheckpointIO

from minigpt.common import WRITE_FAILURES, atomic_write, byte_size, free_space, write_failure

from ..lightning_internals import save_last_checkpoint

log = logging.getLogger("minigpt")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written for a reason the user can fix (a full disk, a quota, a
    folder the run may not write), named with the free space and the checkpoint's size. An OSError."""

    def __init__(self, path: Path, reason: str, free: int | None, size: int | None) -> None:
        self.path = path
        """The checkpoint that was not written; the one there before, if any, is as it was."""
        sizes = [f"{byte_size(free)} free there"] if free is not None else []
        sizes += [f"the checkpoint needs about {byte_size(size)}"] if size else []
        detail = f" ({', '.join(sizes)})" if sizes else ""
        super().__init__(f"cannot write checkpoint {path}: {reason}{detail}")


_TORCH_WRITE_FAILED = re.compile(r"file write failed|unexpected pos|failed writing")  # torch's zip writer


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file and renames it into place.

    A kill during a save leaves the previous checkpoint intact: the rename is atomic on POSIX
    and Windows, and the file is flushed to disk before it. A save that fails on a full disk or a
    folder it may not write raises CheckpointWriteError, which the command line prints as one line.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        size, free = _tensor_bytes(checkpoint, set()), free_space(path)
        if free is not None and size > free:  # refused before a byte is written
            raise CheckpointWriteError(Path(path), WRITE_FAILURES[errno.ENOSPC], free, size)
        try:
            with atomic_write(path) as tmp, open(tmp, "wb") as f:
                torch.save(checkpoint, f)
        except (OSError, RuntimeError) as err:
            reason = _why_not_written(err)
            if reason is None:
                raise
            raise CheckpointWriteError(Path(path), reason, free_space(path), size) from err


def _why_not_written(error: BaseException) -> str | None:
    """Why a save failed, for the failures a user can fix; None for any other error."""
    if (failure := write_failure(error)) is not None:
        return WRITE_FAILURES[failure.errno]
    if isinstance(error, RuntimeError) and _TORCH_WRITE_FAILED.search(str(error)):
        return "the write failed"
    return None


def _tensor_bytes(value: Any, seen: set[int]) -> int:
    """The bytes of the tensors in a checkpoint, nearly all of its size on disk: each storage once,
    as torch.save writes a tied weight once (`seen`: the storages counted so far)."""
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, seen) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v, seen) for v in value)
    return 0


class Checkpoints(LightningModelCheckpoint):
    """Lightning's ModelCheckpoint, with `save_last` writing `last.ckpt` at the end of every run.

    Lightning writes `last.ckpt` beside each checkpoint it saves at a validation, and at the end of
    a run only when it never wrote one. A run that stops at `max_steps` between validations (888
    steps validated every 222 would not; 300 would) would leave `last.ckpt` at its last
    validation, and `--ckpt_path last` would train the steps after it over again. Here the end of
    the run is saved too, whenever the last save was at an earlier step.
    """

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint: the one Lightning's ModelCheckpoint
        gives the same settings, `ModelCheckpoint{'monitor': ...}`. Lightning starts the key with
        the class's name; this class was named ModelCheckpoint before, and checkpoints written
        then resume with their best checkpoint and score only under that key."""
        key = super().state_key
        return LightningModelCheckpoint.__qualname__ + key.removeprefix(type(self).__qualname__)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not (self.save_last and save_last_checkpoint(self, trainer)):
            super().on_train_end(trainer, pl_module)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Say at the start, not at the first save, when the checkpoints will not fit."""
        if not trainer.is_global_zero or self.dirpath is None:
            return
        files = max(self.save_top_k, 0) + int(bool(self.save_last))
        size = checkpoint_bytes(trainer, pl_module)
        # An atomic save writes the new file beside the old one before it replaces it.
        needed, free = (files + 1) * size, free_space(self.dirpath)
        if files and free is not None and needed > free:
            log.warning(
                f"warning: this run's checkpoints need about {byte_size(needed)} in {self.dirpath} "
                f"({files} of about {byte_size(size)}, and room for one more while a save replaces "
                f"one) and {byte_size(free)} is free there: the first save will fail; free some space "
                "or choose another --trainer.default_root_dir"
            )


ModelCheckpoint = Checkpoints
"""The name `Checkpoints` had before, kept only so that the config.yaml of a run trained then
(`class_path: minigpt.training.callbacks.checkpoints.ModelCheckpoint`) still resolves."""


def checkpoint_bytes(trainer: L.Trainer, pl_module: L.LightningModule) -> int:
    """About what one checkpoint of this run will hold: the weights, the optimizer's moments (two
    per trained value for Adam, one for Muon, in fp32) and, with a weight average, a second copy."""
    weights = sum(p.numel() * p.element_size() for p in pl_module.parameters())
    moments = 0
    for optimizer in trainer.optimizers:
        for group in optimizer.param_groups:
            per_value = 1 if "ns_steps" in group else 2  # Muon's groups have Newton-Schulz steps
            moments += sum(4 * per_value * p.numel() for p in group["params"] if p.requires_grad)
    averaged = any(isinstance(c, WeightAveraging) for c in trainer.callbacks)
    return weights * (2 if averaged else 1) + moments
