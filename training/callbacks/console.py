"""What a run prints: a summary before the first step, a progress bar over the run's steps, and a
closing line after the last."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from minigpt.common import duration, short_count
from minigpt.model import GPTConfig
from minigpt.model.config import parameter_count

from ..flops import training_flops_per_token
from ..loggers import AutoWandbLogger, step_logs_written
from ..lora import ADAPTER_FOLDER
from ..precision import cpu_description
from .throughput import tokens_per_step

log = logging.getLogger("minigpt")


BAR_FIGURES = ("train_loss", "tokens_per_sec")
"""Training figures the progress bar shows beside the validation's."""


class StepProgressBar(TQDMProgressBar):
    """Lightning's progress bar, counting the run's optimizer steps rather than one epoch's batches,
    so its total and ETA are the whole run's.

    Into a terminal it draws the bar. Into anything else (a file, a pipe, a job's log) a bar is
    one line rewritten with carriage returns and cursor codes, hundreds of times, and a
    validation's bar ten lines more: there it prints `lines` plain lines instead, evenly over
    the run, each with the step, the time so far and left, and the latest figures.
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, lines: int = 10) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position)
        self.lines = lines
        self._plain = False
        self._next_line = 0
        self._started = 0.0
        self._first_step = 0
        self._figures: dict[str, Any] = {}  # the latest figures, as the last log step read them

    @property
    def train_description(self) -> str:
        return "steps"

    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(disable=True) if self._plain else super().init_train_tqdm()

    def init_validation_tqdm(self) -> Tqdm:
        return Tqdm(disable=True) if self._plain else super().init_validation_tqdm()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._plain = not sys.stdout.isatty()
        super().on_train_start(trainer, pl_module)
        bar = self.train_progress_bar
        bar.total = trainer.estimated_stepping_batches
        bar.initial = bar.n = trainer.global_step  # a resumed run starts where it stopped
        self._started, self._first_step = time.monotonic(), trainer.global_step
        self._next_line = self._line_after(trainer.global_step, bar.total)

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        pass  # one bar for the whole run: epochs are an artefact of the sampler here

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the logger's version id: noise next to the losses
        # The training figures are logged without `prog_bar`: Lightning turns every progress-bar
        # figure into a number after every batch, which on a GPU makes the host wait for the
        # device at each step. The bar reads them here, on the steps that log them.
        logged = trainer.callback_metrics
        shown = {name: float(logged[name]) for name in BAR_FIGURES if name in logged}
        return {**shown, **metrics}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._plain:
            self.train_progress_bar.n = trainer.global_step  # counted all the same, not drawn
            if step_logs_written(trainer):  # new figures, read where reading costs nothing extra
                self._figures = self.get_metrics(trainer, pl_module)
            self._print_line(trainer)
            return
        bar, step = self.train_progress_bar, trainer.global_step
        if bar is None or bar.disable or not self._should_update(step, bar.total):
            return
        bar.n = step
        if step_logs_written(trainer):  # the step logged new figures
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # also refreshes the bar
        else:
            # The figures are as they were: reading them again would make the host wait for the
            # device (Lightning turns each into a number), at every step.
            bar.refresh()

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        # Lightning's print goes through the bar that is drawn; with none drawn it would drop
        # the line (the samples at each validation).
        if self._plain:
            print(*args, sep=sep, **kwargs)
        else:
            super().print(*args, sep=sep, **kwargs)

    def _line_after(self, step: int, total: int | float) -> int:
        """The step of the next plain line after `step`: the next of `lines` even marks."""
        if not self.lines or total in (0, float("inf")):
            return -1
        marks = [round(total * i / self.lines) for i in range(1, self.lines + 1)]
        return next((mark for mark in marks if mark > step), -1)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if self._plain and trainer.state.fn == "fit":
            self._figures = self.get_metrics(trainer, pl_module)

    def _print_line(self, trainer: L.Trainer) -> None:
        step, total = trainer.global_step, self.train_progress_bar.total
        if step != self._next_line or self.is_disabled:
            return
        self._next_line = self._line_after(step, total)
        elapsed = time.monotonic() - self._started
        left = elapsed / max(step - self._first_step, 1) * (total - step)
        figures = ", ".join(f"{name} {_figure(value)}" for name, value in self._figures.items())
        print(
            f"step {step:,}/{total:,} ({step / total:.0%}), {duration(elapsed)}, {duration(left)} left"
            + (f": {figures}" if figures else ""),
            flush=True,
        )


def _figure(value: Any) -> str:
    """A progress line's figure: losses to 3 decimals, rates to 3 significant digits."""
    if not isinstance(value, float):
        return str(value)
    return f"{value:.3f}" if abs(value) < 100 else short_count(value)


def _device(device: torch.device) -> str:
    if device.type == "cpu":
        return f"cpu ({cpu_description()})"
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def _optimizer_line(trainer: L.Trainer, pl_module: L.LightningModule) -> str:
    """What the optimizer says of itself, where it says anything (Muon: its orthogonalisation)."""
    for optimizer in trainer.optimizers:
        if (describe := getattr(optimizer, "describe", None)) is not None:
            return "; " + describe(pl_module.device)
    return ""


def compile_tip(device: torch.device, config: GPTConfig, compiled: bool) -> str | None:
    """A line for an eager run on a GPU of a recipe with RoPE or QK-norm, whose elementwise passes
    over the queries and keys `torch.compile` fuses; None for any other run."""
    if device.type != "cuda" or compiled or not (config.qk_norm or config.position_embedding == "rope"):
        return None
    return (
        "tip: --model.compile true fuses RoPE's and QK-norm's passes over the queries and keys, "
        "which saves much of an eager step's time on a GPU (docs/results/compile.md)"
    )


class RunSummary(L.Callback):
    """Prints what the run is about to do before its first step, and what it did after its last.

    Before: the model (shape, parameters, how many of them train), the data (tokens per split),
    the steps (tokens per step and in all, passes over the training tokens), the compute (FLOPs
    per token, the precision and the device), where the files go and where wandb's run is; on a
    GPU, a tip to compile a recipe with RoPE or QK-norm that runs eager.
    After: steps, tokens and wall time, the best validation loss with its bits per byte, where
    the best checkpoint, a LoRA run's adapters and the report are, and what evaluating tasks
    during training cost (`EvaluateTasks`).
    """

    def __init__(self) -> None:
        self._start: float | None = None
        self._tokens_per_step = 0
        self._bpb_at: dict[float, float] = {}
        """val_bpb of each validation of this process, by its val_loss."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics = trainer.callback_metrics
        if not trainer.sanity_checking and "val_loss" in metrics and "val_bpb" in metrics:
            self._bpb_at[float(metrics["val_loss"])] = float(metrics["val_bpb"])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()
        data = trainer.datamodule
        config = pl_module.model.config
        batch_tokens, batch = data.micro_batch()  # the data module says what a batch is
        self._tokens_per_step = tokens_per_step(trainer, batch_tokens)
        if not trainer.is_global_zero:
            return
        steps = trainer.estimated_stepping_batches
        total = steps * self._tokens_per_step
        train_tokens, data_line = data.train_tokens(), data.summary()
        params = parameter_count(config)  # from the shape: under FSDP this rank holds a shard
        flops = training_flops_per_token(config)
        lines = [
            f"model: {config.n_layer} layers x {config.n_head} heads x {config.n_embd} wide, context "
            f"{config.context_length}, vocab {config.vocab_size:,}: {params / 1e6:.2f}M parameters"
            + (
                f", starting from the weights of {pl_module.init_from}"
                if getattr(pl_module, "init_from", None)
                else ""
            ),
            pl_module.training_summary(params),
            f"data: {data_line}",
            f"steps: {trainer.global_step:,} done, {steps:,} in all, global batch {self._tokens_per_step:,} "
            f"tokens (micro-batch {batch} x {trainer.accumulate_grad_batches} accumulated x "
            f"{trainer.world_size} {'process' if trainer.world_size == 1 else 'processes'}) = "
            f"{short_count(total)} tokens, "
            f"{total / max(train_tokens, 1):.1f} passes over the training tokens",
            f"compute: {flops / 1e6:.1f} MFLOPs per token, {flops * total / 1e15:.2f} PFLOPs in all; "
            f"{trainer.precision} on {_device(pl_module.device)}{_optimizer_line(trainer, pl_module)}",
            f"output: {trainer.default_root_dir}",
        ]
        wandb = [logger.summary_line() for logger in trainer.loggers if isinstance(logger, AutoWandbLogger)]
        lines += [line for line in wandb if line]
        tip = compile_tip(pl_module.device, config, bool(pl_module.hparams.get("compile", False)))
        log.info("\n".join(lines + ([tip] if tip else [])))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or self._start is None:
            return
        seconds = time.perf_counter() - self._start
        tokens = trainer.global_step * self._tokens_per_step
        parts = [f"done: {trainer.global_step:,} steps, {short_count(tokens)} tokens in {duration(seconds)}"]
        checkpoint = trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_score is not None:
            best = float(checkpoint.best_model_score)
            # Known when the best validation ran in this process (not before a resume).
            bpb = self._bpb_at.get(best) if checkpoint.monitor == "val_loss" else None
            parts.append(
                f"best val loss {best:.3f}"
                + (f" ({bpb:.3f} bits per byte)" if bpb is not None else "")
                + f" in {checkpoint.best_model_path}"
            )
        tasks = next((c for c in trainer.callbacks if hasattr(c, "seconds_spent")), None)
        if tasks is not None and tasks.runs:
            plural = "s" if tasks.runs != 1 else ""
            parts.append(
                f"task evaluation {duration(tasks.seconds_spent)} over {tasks.runs} validation{plural}"
            )
        if getattr(pl_module, "lora", None) is not None:
            parts.append(f"adapters {Path(trainer.default_root_dir) / ADAPTER_FOLDER}")
        report = Path(trainer.default_root_dir) / "report.html"
        if report.is_file():
            parts.append(f"report {report}")
        log.info("; ".join(parts))
