"""Callbacks that inject failures into a real training run, added with --trainer.callbacks+=..."""

from __future__ import annotations

import os
import signal

import lightning as L
import torch


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
