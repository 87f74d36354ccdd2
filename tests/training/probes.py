"""Callbacks (added with --trainer.callbacks+=...) and a checkpoint writer (--trainer.plugins) that
record what each rank of a run saw and did."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.strategies.fsdp import _setup_activation_checkpointing
from torch.distributed.fsdp import FullyShardedDataParallel

from minigpt.training.callbacks.checkpoints import AtomicCheckpointIO


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


class CountReferencePairs(L.Callback):
    """Writes `<folder>/reference<r>.json` for each rank: how many pairs `LitDPO` scored for its
    reference before the first step (its `answer_logps` counted from `on_fit_start`, which runs
    before the module's, to `on_train_start`)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.pairs = 0

    def on_fit_start(self, trainer, pl_module) -> None:
        score = pl_module.answer_logps

        def counted(x: torch.Tensor, y: torch.Tensor):
            self.pairs += len(x)
            return score(x, y)

        pl_module.answer_logps = counted

    def on_train_start(self, trainer, pl_module) -> None:
        del pl_module.answer_logps  # the method again
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"reference{trainer.global_rank}.json").write_text(json.dumps(self.pairs))


class RecordStepLoss(L.Callback):
    """Writes `<folder>/steps.json` from rank 0: the loss of each optimizer step over its whole
    global batch, the mean over the accumulated micro-batches and over the ranks (Lightning hands
    callbacks each micro-batch's loss divided by the accumulation)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.losses: list[float] = []
        self._sum = 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sum += float(outputs["loss"])
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        step_loss = trainer.strategy.reduce(
            torch.tensor(self._sum, device=pl_module.device), reduce_op="mean"
        )
        self.losses.append(float(step_loss))
        self._sum = 0.0

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / "steps.json").write_text(json.dumps(self.losses))


class RecordSaves(AtomicCheckpointIO):
    """The project's checkpoint writer, noting in `<folder>/saves-rank<r>.txt` each file it writes
    on rank r."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = Path(folder)

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f"saves-rank{rank}.txt", "a") as f:
            f.write(f"{Path(path).name}\n")


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's FSDPStrategy on CPU processes (gloo), to test what runs around it without a GPU.

    Lightning refuses `FSDPStrategy` without a GPU (an exact type check, which this subclass
    passes), and hands FSDP `device_id=None` on CPU, which PyTorch's FSDP refuses ("FSDP needs a
    non-CPU accelerator device"); given the CPU device explicitly, it runs. Everything else,
    wrapping, activation checkpointing and sharded checkpoints, is Lightning's own.
    """

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = FullyShardedDataParallel(
            module=model,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=torch.device("cpu"),
            **self.kwargs,
        )
        _setup_activation_checkpointing(model, self._activation_checkpointing_kwargs)
        return model


HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__")
"""Tensor methods that read a value on the host: on an accelerator, each waits for the device."""


class CountHostReads(L.Callback):
    """Counts the host reads of tensor values (`HOST_READS`) in each training step: from the end of
    one step's `on_train_batch_end` hooks to the end of the next's (this callback's own hook runs
    last), so Lightning's logging between steps counts toward the next step. Writes
    `<folder>/host_reads.json`: {step: [where each read came from]}, for every step counted."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.reads: dict[int, list[str]] = {}
        self._step: int | None = None
        self._saved: dict[str, object] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._counting(name, original))

    def _counting(self, name, original):
        def read(tensor, *args, **kwargs):
            if self._step is not None:
                stack = traceback.extract_stack(limit=14)[:-1]
                where = f"{name} via " + " < ".join(
                    f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(stack)
                )
                self.reads.setdefault(self._step, []).append(where)
            return original(tensor, *args, **kwargs)

        return read

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._step is not None:
            self.reads.setdefault(self._step, [])
        self._step = trainer.global_step + 1  # the step whose reads come next

    def on_validation_start(self, trainer, pl_module) -> None:
        self._step = None  # validation reads its results: not a training step's

    def on_train_end(self, trainer, pl_module) -> None:
        self._step = None
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "host_reads.json").write_text(json.dumps(self.reads))
