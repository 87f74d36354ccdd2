"""Callbacks that inject failures into a real training run, added with --trainer.callbacks+=..."""

from __future__ import annotations

import os
import signal

import lightning as L
import torch


class PoisonWeights(L.Callback):
    """Before optimizer step `step`, turn one embedding row into NaN, as a blow-up would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.transformer.wte.weight[batch[0][0, 0]] = float("nan")


class SignalAt(L.Callback):
    """Send this process `signum` when optimizer step `step` is reached (SIGKILL: no cleanup at all)."""

    def __init__(self, step: int, signum: int = int(signal.SIGKILL)) -> None:
        self.step = step
        self.signum = signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero:
            os.kill(os.getpid(), self.signum)
