"""A callback that records what each rank of a run saw, added with --trainer.callbacks+=..."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F


class RecordRank(L.Callback):
    """Writes `<folder>/rank<r>.json` for each rank: its process id (at the start), then the first
    `tokens` ids of every training window of its first `steps` steps, and its own mean validation
    loss at each validation, computed here from the model's logits (at the end, even a failed one)."""

    def __init__(self, folder: str, steps: int = 2, tokens: int = 16) -> None:
        self.folder = Path(folder)
        self.steps = steps
        self.tokens = tokens
        self.record: dict = {"windows": [], "val_loss": []}
        self._val_losses: list[float] = []

    def _write(self, trainer: L.Trainer) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.record))

    def on_train_start(self, trainer, pl_module) -> None:
        self.record["pid"] = os.getpid()
        self._write(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step < self.steps:
            self.record["windows"].append(batch[0][:, : self.tokens].tolist())

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._val_losses = []

    @torch.no_grad()
    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        x, y = batch
        self._val_losses.append(F.cross_entropy(pl_module(x).flatten(0, 1).float(), y.flatten()).item())

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.record["val_loss"].append(sum(self._val_losses) / len(self._val_losses))

    def teardown(self, trainer, pl_module, stage) -> None:
        self._write(trainer)
