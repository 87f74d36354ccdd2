"""An exponential moving average of the weights: what validation, checkpoints and the finished
run use, while the optimizer keeps stepping the raw weights.

Averaging the last few hundred steps' weights smooths out the noise of the last updates, which a
learning-rate decay alone only damps (benchmarks/RESULTS.md measures it at small.yaml's shape).
This is Lightning's `WeightAveraging` callback with an EMA, made to fit how this project builds
its model.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch.optim.swa_utils import AveragedModel

from minigpt.model import ConfigError


class EMAWeights(WeightAveraging):
    """After every optimizer step: average = decay * average + (1 - decay) * weights.

    The average starts as the weights after the first step. Validation runs on the average, so
    `val_loss` and the best checkpoint are the average's, and so are the samples and attention
    maps drawn when validation ends, from callbacks listed before this one. Each checkpoint's
    `state_dict` holds the average (generate.py and export read that) and the run ends with it
    in the model; a checkpoint keeps the raw weights too (`current_model_state`), so
    `--ckpt_path` resumes training where it stopped. Buffers (the causal mask, rotary tables) are
    not averaged: they never change.

    Args:
        decay: The weight of the past per step; 0.995 averages over roughly the last 200 steps
            (the weights of step t - k count 0.995^k).
    """

    def __init__(self, decay: float = 0.995) -> None:
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"EMAWeights decay must be between 0 and 1 (exclusive), got {decay}")
        super().__init__(use_buffers=False)
        self.decay = decay
        self._raw_at_end: dict[str, torch.Tensor] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Lightning's version warns about any `configure_model`; ours only builds the network
        # (no sharding), which must exist before the average copies it.
        if stage == "fit":
            self._raw_at_end = None
            pl_module.configure_model()
            self._average_model = MovingAverage(pl_module, self.decay)

    # Lightning builds the average in `setup`, before the strategy moves the model to its device:
    # on a GPU it would stay in host memory, and every step would copy all the weights off the GPU.
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is not None:
            self._average_model.to(pl_module.device)

    # Lightning swaps the average in for the validation epoch alone. Swapping it in for the whole
    # validation stage lets the callbacks that run when validation ends (SampleText,
    # AttentionMaps) see it too; ModelCheckpoint, which Lightning always runs last, still finds
    # the raw weights back in place when it saves.
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    # Lightning ends the run by copying the average into the model, and ModelCheckpoint, which runs
    # after every other callback, then saves `last` when no validation saved it at the last step.
    # That checkpoint must still resume from the raw weights, not train on from the average.
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raw_at_end = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        super().on_train_end(trainer, pl_module)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._raw_at_end is not None and "current_model_state" in checkpoint:
            checkpoint["current_model_state"] = self._raw_at_end


class MovingAverage(AveragedModel):
    """`AveragedModel` with torch's EMA (`get_ema_multi_avg_fn`: the same numbers) updated in one
    foreach call, with no read of a device value. It lives on the model's device (`EMAWeights`
    moves it there when training starts).

    torch's `update_parameters` walks the parameters in Python, compares its step count on the
    device twice (each a wait for the device to finish its queued work) and copies every buffer,
    at every step. Here the pairs of tensors are listed once, the count is also kept on the host,
    and buffers, which never change in this project's models, are copied with the first update
    only. The state dict (the average and `n_averaged`) is torch's.
    """

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        super().__init__(model, use_buffers=False)
        self.decay = decay
        self._pairs: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self._updates: int | None = None
        """`n_averaged` on the host; None until first needed (a loaded state may have changed it)."""

    @torch.no_grad()
    def update_parameters(self, model: torch.nn.Module) -> None:
        if self._pairs is None:  # the parameters themselves, so that moving a module keeps them current
            self._pairs = (list(self.parameters()), list(model.parameters()))
        if self._pairs[0][0].device != self._pairs[1][0].device:
            raise ValueError("the moving average and the model it averages are on different devices")
        if self._updates is None:
            self._updates = int(self.n_averaged)
        average, current = self._pairs
        if self._updates == 0:
            torch._foreach_copy_(average, current)
            for mine, theirs in zip(self.module.buffers(), model.buffers(), strict=True):
                mine.copy_(theirs)
        else:
            torch._foreach_lerp_(average, current, 1.0 - self.decay)
        self.n_averaged += 1
        self._updates += 1

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._updates = None  # read again from the loaded n_averaged
