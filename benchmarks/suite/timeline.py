"""When a `train.py` run reached what: a callback that a benchmark adds to a run
(`--trainer.callbacks+=suite.timeline.Timeline`, with this folder on PYTHONPATH) to write one JSON
line per event, each with the seconds since the command started (`$MINIGPT_T0`, the epoch time the
benchmark took just before starting the command; else since the callback was built)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import lightning as L

T0 = "MINIGPT_T0"
"""The environment variable holding the epoch time the command was started at."""


class Timeline(L.Callback):
    """Writes `{"event", "step", "s", ...}` lines to `path` (rank 0): the start of training, the
    first step's end, every validation's start and end (with its figures, once the callbacks
    listed before this one have done their part), and the end of training."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.start = float(os.environ.get(T0) or time.time())
        self._first = True
        self._last: float | None = None
        """When the last step (or the start of training) ended, on the perf_counter clock."""
        self.steps_s = 0.0
        """Seconds spent in training steps: from the end of one to the end of the next, less any
        validation between them."""

    def _write(self, trainer: L.Trainer, event: str, **figures: Any) -> None:
        if not trainer.is_global_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = {
            "event": event,
            "step": trainer.global_step,
            "s": round(time.time() - self.start, 3),
            **figures,
        }
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, "train_start")
        self._last = time.perf_counter()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._write(trainer, "validation_start")
            if self._last is not None:  # the part of the next step's interval before validating
                self.steps_s += time.perf_counter() - self._last

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        now = time.perf_counter()
        self.steps_s += now - self._last
        self._last = now
        if self._first:
            self._first = False
            self._write(trainer, "first_step")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        figures = {name: float(metrics[name]) for name in ("val_loss", "val_bpb") if name in metrics}
        self._write(trainer, "validation", **figures)
        self._last = time.perf_counter()  # the rest of the interval starts now

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, "train_end", steps_s=round(self.steps_s, 3))


class StepTimes(L.Callback):
    """Takes turns with the bare loop of step_overhead.py (`suite.turns`), and writes the seconds
    and steps of each turn and the first 30 losses to `path` as JSON (`{"turns": [...], "losses":
    [...]}`) when training ends."""

    def __init__(self, path: str) -> None:
        from .turns import Turns

        self.path = Path(path)
        self.turns = Turns.from_env()
        self.losses: list[float] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.turns is not None:
            self.turns.begin()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, *args: Any
    ) -> None:
        if len(self.losses) < 30:
            self.losses.append(float(outputs["loss"]))
        if self.turns is not None:
            self.turns.step_done(last=trainer.global_step >= trainer.max_steps)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            turns = [] if self.turns is None else self.turns.turns
            self.path.write_text(json.dumps({"turns": turns, "losses": self.losses}))
