"""Throughput of a run: tokens per second, tokens seen, and MFU where the hardware's peak is known."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch

from ..flops import known_peak_flops, training_flops_per_token
from ..loggers import step_logs_written


def tokens_per_step(trainer: L.Trainer, batch_tokens: int) -> int:
    """Tokens in one optimizer step over all ranks, from the tokens of one rank's batch."""
    return batch_tokens * trainer.accumulate_grad_batches * trainer.world_size


class TokensPerSecond(L.Callback):
    """Logs `tokens_per_sec` (in the progress bar), `tokens_seen` and, with a known peak, `mfu`.

    Throughput is measured from the end of one logged optimizer step to the end of the next (every
    `log_every_n_steps` steps), over all ranks, so it includes data loading, forward, backward and
    the optimizer, and not validation: the first step after a validation is timed from its own
    start. The run's first step, which pays one-off costs, is not timed. MFU is model FLOPs per
    second (`training_flops_per_token`) over the hardware's peak.
    """

    def __init__(self, peak_flops: float | None = None) -> None:
        """
        Args:
            peak_flops: The hardware's peak FLOP/s in the run's precision, for MFU. None: the
                data-sheet peak of a known GPU under 16-bit mixed precision; MFU is not logged
                where no peak is known (CPUs).
        """
        self.peak_flops = peak_flops
        self._flops_per_token: int | None = None
        self._last: float | None = None
        self._tokens = 0
        self._after_validation = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.peak_flops is None:
            self.peak_flops = known_peak_flops(pl_module.device, str(trainer.precision))
        self._flops_per_token = training_flops_per_token(pl_module.model.config)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._after_validation and batch_idx % trainer.accumulate_grad_batches == 0:
            # Else this step would log nothing, and Lightning would repeat the last step's figures.
            self._last, self._after_validation = time.perf_counter(), False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._tokens += batch[0].numel() * trainer.world_size
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation: the step is not done yet
        if self._last is not None and not step_logs_written(trainer):
            return  # the tokens and the time add up to the next step that is written
        # From the step count, so that a resumed run continues the count where it stopped.
        pl_module.log("tokens_seen", float(trainer.global_step * tokens_per_step(trainer, batch[0].numel())))
        if pl_module.device.type == "cuda":
            # Steps run ahead of the host between log steps; this step reads its values anyway, so
            # waiting here for the device costs nothing and times the device's work, not the queue.
            torch.cuda.synchronize(pl_module.device)
        now = time.perf_counter()
        if self._last is not None:
            rate = self._tokens / (now - self._last)
            pl_module.log("tokens_per_sec", rate)  # StepProgressBar shows it
            if self.peak_flops and self._flops_per_token:
                pl_module.log("mfu", rate * self._flops_per_token / self.peak_flops)
        self._last, self._tokens = now, 0

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last, self._tokens = None, 0  # validation time is not training time
        self._after_validation = not trainer.sanity_checking
