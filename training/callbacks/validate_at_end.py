"""A run validates at its end, whatever its validation interval."""

from __future__ import annotations

from typing import Any

import lightning as L


class ValidateAtEnd(L.Callback):
    """Validates after the run's last optimizer step, so that its closing line has a validation
    loss and the checkpoint callback a best checkpoint, also when `val_check_interval` does not
    divide `max_steps` (a 20-step run that validates every 375 steps would otherwise never validate).

    Lightning validates a run that is asked to stop (`trainer.should_stop`, as early stopping
    asks), after the step in progress; this asks as the last micro-batch of the last step begins.
    A run whose last step falls on its interval validates once. Asking then also makes Lightning
    write the last step's logged values, whatever `log_every_n_steps`.
    """

    def __init__(self) -> None:
        self._last_step: float = float("inf")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Optimizer steps in all, from max_steps or max_epochs, whichever ends the run first.
        self._last_step = trainer.estimated_stepping_batches

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step + 1 < self._last_step:
            return
        if (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or trainer.is_last_batch:
            trainer.should_stop = True
