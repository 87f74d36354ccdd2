"""What a run shows besides numbers: text samples and attention maps as the model learns, and at
the end the loss curves and the HTML run report; in the run folder and on the wandb dashboard."""

from __future__ import annotations

import json
import multiprocessing
import os
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

from minigpt.common import atomic_write
from minigpt.model import GPT, generate
from minigpt.viz.attention import attention_of, draw_attention, figure_to_png
from minigpt.viz.report import write_run_report

from .config import SampleConfig

ATTENTION_DIR = "attention"
"""In the run folder: the latest attention maps, one PNG per layer."""

SAMPLES_FILE = "samples.jsonl"
"""In the run folder: one {"step": ..., "text": ...} object per line, one line per sample."""


def whole_model(trainer: L.Trainer, pl_module: L.LightningModule) -> GPT | None:
    """The network with all its weights on rank 0, None on the other ranks. Every rank must call it.

    Under FSDP each rank holds a shard of every weight: the weights are gathered, through FSDP's
    full state dict, into a plain copy of the network (rank 0 only, one block at a time).
    """
    root = trainer.strategy.model
    if not isinstance(root, FullyShardedDataParallel):
        return pl_module.model if trainer.is_global_zero else None
    # Off the GPU as they arrive; on CPU processes there is nowhere to offload to, and PyTorch
    # 2.13's FSDP crashes (SIGSEGV) cloning the gathered weights if asked to.
    options = FullStateDictConfig(offload_to_cpu=pl_module.device.type != "cpu", rank0_only=True)
    with FullyShardedDataParallel.state_dict_type(root, StateDictType.FULL_STATE_DICT, options):
        state = root.state_dict()
    if not trainer.is_global_zero:
        return None
    model = GPT(pl_module.model.config)
    model.load_state_dict({key.removeprefix("model."): value for key, value in state.items()})
    return model.to(pl_module.device).eval()


class SampleText(L.Callback):
    """Generates a sample after every validation: printed, appended to `samples.jsonl` in the run
    folder, and logged to wandb as a table that grows by one row each time.

    Generates on rank 0 only, with its own seeded generator, so samples from different steps differ
    only by what the model learned.
    """

    def __init__(self, sample: SampleConfig = SampleConfig()) -> None:
        """
        Args:
            sample: The prompt, length and sampling settings.
        """
        self.sample = sample
        self.rows: list[list[Any]] = []
        """(step, text) of every sample so far."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not self.sample.max_new_tokens:
            return
        model = whole_model(trainer, pl_module)
        if model is None:  # not rank 0
            return
        cfg = self.sample
        tokenizer = trainer.datamodule.tokenizer
        prompt_ids = tokenizer.encode(cfg.prompt) or [tokenizer.eot_id or 0]
        prompt = torch.tensor([prompt_ids[-model.config.context_length :]], device=pl_module.device)
        out = generate(
            model,
            prompt,
            cfg.max_new_tokens,
            **cfg.sampling(),
            stop_token=tokenizer.eot_id,
            generator=torch.Generator(device=pl_module.device).manual_seed(cfg.seed),
        )
        new = out[0, prompt.shape[1] :].tolist()
        if tokenizer.eot_id in new:  # the sample ends where the model ended the document
            new = new[: new.index(tokenizer.eot_id)]
        text = cfg.prompt + tokenizer.decode(new)
        pl_module.print(f"\n--- sample at step {trainer.global_step} ---\n{text}\n---")
        self.rows.append([trainer.global_step, text])
        run_dir = Path(trainer.default_root_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / SAMPLES_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": trainer.global_step, "text": text}) + "\n")
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_text(key="samples", columns=["step", "text"], data=self.rows)


class AttentionMaps(L.Callback):
    """Draws the attention of every layer for a fixed prompt after each validation.

    The latest maps are kept as `<run>/attention/layer{i}.png` (the run report shows them) and
    logged to wandb as images, so the dashboard shows how the heads change as the model learns.
    Draws on rank 0 only.

    The weights are computed when validation ends (one forward pass of the prompt); drawing them
    takes matplotlib seconds, as long as hundreds of training steps of a small model, so by
    default it happens in a process of its own, forked then, at a lower priority, while training
    goes on. One drawing runs at a time, in order; the images reach wandb when it is done, and the
    run waits for the last one before it ends, so the run report shows the final maps.
    """

    def __init__(
        self, prompt: str = "ROMEO:\nWhat light through yonder window breaks?", background: bool = True
    ) -> None:
        """
        Args:
            prompt: The text whose attention is drawn; keep it short (tens of tokens) to stay readable.
            background: Draw in a forked process while training goes on (where the platform can
                fork); False: draw before training goes on.
        """
        self.prompt = prompt
        self.background = background
        self._drawing: tuple[Any, int, list[Path]] | None = None
        """The drawing under way: its process, the step it shows and the files it writes."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        model = whole_model(trainer, pl_module)
        if model is None:  # not rank 0
            return
        weights, labels = attention_of(model, trainer.datamodule.tokenizer, self.prompt)
        folder = Path(trainer.default_root_dir) / ATTENTION_DIR
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / f"layer{layer}.png" for layer in weights]
        self._finish(trainer)  # the previous drawing, so that the files are written in order
        job = (weights, labels, self.prompt, str(folder))
        context = _fork_context() if self.background else None
        if context is None:
            _draw_pngs(*job)
            self._log(trainer, trainer.global_step, paths)
            return
        with warnings.catch_warnings():  # Python 3.12+ warns of forking a threaded process: the
            # child only draws with matplotlib and writes files, and takes no lock the threads hold
            warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
            process = context.Process(target=_draw_pngs, args=job, kwargs={"niceness": 10}, daemon=True)
            process.start()
        self._drawing = (process, trainer.global_step, paths)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._drawing is not None and not self._drawing[0].is_alive():
            self._finish(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._finish(trainer)  # before RunReport reads the maps, when the fit ends

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._finish(trainer)

    def _finish(self, trainer: L.Trainer) -> None:
        """Wait for the drawing under way, if any, and log its images."""
        if self._drawing is None:
            return
        (process, step, paths), self._drawing = self._drawing, None
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(
                f"drawing the attention maps of step {step} failed (exit code {process.exitcode})"
            )
        self._log(trainer, step, paths)

    @staticmethod
    def _log(trainer: L.Trainer, step: int, paths: list[Path]) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                captions = [f"{p.stem} at step {step}" for p in paths]
                logger.log_image(key="attention", images=[str(p) for p in paths], caption=captions, step=step)


def _fork_context() -> Any:
    """multiprocessing's fork context, where the platform has it (not Windows; macOS forks
    matplotlib safely with the Agg canvas, which needs no window server)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


def _draw_pngs(
    weights: dict[int, Any], labels: list[str], prompt: str, folder: str, niceness: int = 0
) -> None:
    """Draw the layers' grids and write them to `folder` as `layer{i}.png`, each atomically."""
    if niceness:
        os.nice(niceness)  # training, in the parent, goes first
    for name, figure in draw_attention(weights, labels, prompt).items():
        with atomic_write(Path(folder) / f"{name}.png") as tmp:
            tmp.write_bytes(figure_to_png(figure))


class RunReport(L.Callback):
    """At the end of training: `<run>/loss_curves.png` and the self-contained `<run>/report.html`
    (curves, samples, attention maps, config, final figures), and the curves on wandb.

    The same files come from `python report.py --run <run folder>` at any time.
    """

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            logger.save()  # the CSV logger buffers rows; the report reads them from disk
        # A run shorter than its log interval has logged nothing: it still ends well, and says so.
        curves, _ = write_run_report(Path(trainer.default_root_dir), allow_empty=True)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image(key="loss_curves", images=[str(curves)])
