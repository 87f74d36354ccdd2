"""Stopping safely: on a signal with a checkpoint saved (`SaveAndStopOnSignal`), and before a
non-finite loss or gradient reaches the weights or a checkpoint (`StopOnNonFinite`)."""

from __future__ import annotations

import math
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
import torch

from minigpt.model import ConfigError

from ..lightning_internals import expect_ranks_to_stop


def read_interval(every: int | None, trainer: L.Trainer, pl_module: L.LightningModule) -> int:
    """How many optimizer steps apart a callback reads values off the device: `every`, or where
    None, every step on a CPU (reading costs nothing there) and every `log_every_n_steps` steps
    elsewhere (each read makes the host wait for the device; Lightning reads the logged values
    then anyway)."""
    if every is not None:
        return every
    return 1 if pl_module.device.type == "cpu" else max(1, trainer.log_every_n_steps)


def _checked_interval(every: int | None) -> int | None:
    if every is not None and every < 1:
        raise ConfigError(f"check_every_n_steps must be at least 1, got {every}")
    return every


class SaveAndStopOnSignal(L.Callback):
    """On SIGINT (Ctrl-C) or SIGTERM, finish the current optimizer step, save, and stop.

    The checkpoint lands where `--ckpt_path last` finds it: `last.ckpt` beside the run's other
    checkpoints. A second signal stops at once: it raises KeyboardInterrupt, which Lightning
    answers by shutting down without finishing the step. Under DDP a signal to any rank stops
    every rank, and every rank records it in `received`, so each exits as the signalled one does.
    """

    def __init__(self, check_every_n_steps: int | None = None) -> None:
        """
        Args:
            check_every_n_steps: Under DDP, the ranks agree on whether one was signalled every
                this many optimizer steps, an exchange that makes the host wait for the device on
                an accelerator. None: every step on CPUs, every `trainer.log_every_n_steps` steps
                on accelerators. A single process looks at every step, at no cost.
        """
        self.check_every_n_steps = _checked_interval(check_every_n_steps)
        self._every = 1
        self.path: Path | None = None
        """Where the checkpoint goes; known once training starts."""
        self.received: int | None = None
        """The signal number that stopped the run, if one did."""
        self.saved_step: int | None = None
        self._previous: dict[int, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        checkpoint = trainer.checkpoint_callback
        folder = getattr(checkpoint, "dirpath", None) or Path(trainer.default_root_dir) / "checkpoints"
        self.path = Path(folder) / "last.ckpt"
        self._every = (
            read_interval(self.check_every_n_steps, trainer, pl_module) if trainer.world_size > 1 else 1
        )
        # Installed here, after the Trainer's own SIGTERM handler: that one would raise as soon as
        # the current batch ends, before an accumulated optimizer step is complete and saved.
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signum
        # Not the handler this one replaced: for SIGTERM that is Lightning's, which would let the
        # run save, then end it with SystemExit and exit status 0.
        signal.signal(signum, _interrupt_at_once)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # the optimizer step is not complete yet
        if trainer.global_step % self._every:
            return
        received = self.received or 0
        if trainer.world_size > 1:  # every rank must take part, signalled or not
            signalled = torch.tensor(received, device=pl_module.device)
            received = int(trainer.strategy.reduce(signalled, reduce_op="max"))
        if received:
            self.received = received
            if trainer.world_size > 1:
                expect_ranks_to_stop()  # every rank now exits with 128 + the signal
            trainer.save_checkpoint(self.path, weights_only=False)
            self.saved_step = trainer.global_step
            trainer.should_stop = True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


def _interrupt_at_once(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class DivergenceError(RuntimeError):
    """The loss, the gradients or the validation loss stopped being finite."""


class StopOnNonFinite(L.Callback):
    """Ends the run with DivergenceError when the loss, gradient norm or validation loss is not finite.

    No checkpoint ever holds weights that a non-finite value reached: the values still unread are
    read before every save (`on_save_checkpoint`, which a failed check ends before anything is
    written), and the validation loss before the checkpoints of its validation. Under DDP every
    rank stops together, or the others would wait for it forever, and the message names the value,
    the step and the rank it went bad on.

    How often the values are read is `check_every_n_steps`. Reading a value on an accelerator
    makes the host wait until the device has finished all the work queued so far, so that the
    next step's kernels start late: there the values of each step (the loss, the gradient norm
    measured when clipping) are kept on the device and read together every `log_every_n_steps`
    steps, when Lightning reads the logged values anyway. A bad loss then reaches the weights for
    the few steps until that read, and the run stops naming the first step it went bad at. On a
    CPU, where reading costs nothing, the loss is read before its backward pass, so its gradients
    never reach the weights, and the gradient norm after its step.
    """

    def __init__(self, check_every_n_steps: int | None = None) -> None:
        """
        Args:
            check_every_n_steps: Read the values every this many optimizer steps. None: every
                step on a CPU, every `trainer.log_every_n_steps` steps elsewhere.
        """
        self.check_every_n_steps = _checked_interval(check_every_n_steps)
        self._every = 1
        self._unread: list[tuple[str, int, torch.Tensor]] = []
        """(what, step, value) of the values not read yet."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._every, self._unread = read_interval(self.check_every_n_steps, trainer, pl_module), []

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        self._unread.append(("loss", trainer.global_step, loss.detach()))
        if self._every == 1:
            self._read(trainer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation: the step and its gradient norm are not done yet
        norm = getattr(pl_module, "grad_norm", None)
        if norm is not None:
            self._unread.append(("gradient norm", trainer.global_step - 1, norm.detach()))
        if trainer.global_step % self._every == 0:
            self._read(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._read(trainer)  # validation would spend its time on weights gone bad

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or "val_loss" not in trainer.callback_metrics:
            return
        self._unread.append(("validation loss", trainer.global_step, trainer.callback_metrics["val_loss"]))
        self._read(trainer)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._read(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._read(trainer)

    def _read(self, trainer: L.Trainer) -> None:
        """Read the unread values in one transfer (every rank takes part: the ranks' schedules
        are the same) and raise at the first that is not finite."""
        if not self._unread:
            return
        unread, self._unread = self._unread, []
        if len(unread) == 1 and trainer.world_size == 1 and math.isfinite(unread[0][2].item()):
            return  # one value on one process (each step on a CPU): read as it is, without a stack
        values = torch.stack([value.detach().float().reshape(()) for _, _, value in unread])  # (n,)
        if trainer.world_size > 1:  # every rank stops together, naming the value that went bad
            # torch.distributed's own collective: the strategy's all_gather goes through
            # torch.distributed.nn.functional.all_gather, which torch deprecates.
            gathered = [torch.empty_like(values) for _ in range(trainer.world_size)]
            torch.distributed.all_gather(gathered, values)
            values = torch.stack(gathered)  # (ranks, n)
        else:
            values = values.reshape(1, -1)
        finite = torch.isfinite(values).cpu()
        if bool(finite.all()):
            return
        first = int((~finite).any(dim=0).nonzero()[0])  # the first value, in order, bad on any rank
        rank = int((~finite[:, first]).nonzero()[0])
        what, step, _ = unread[first]
        where = f" on rank {rank}" if trainer.world_size > 1 else ""
        raise DivergenceError(f"the {what} became {values[rank, first].item()}{where} at step {step}")
