"""What a run shows besides numbers: text samples and attention maps as the model learns, and at
the end the loss curves and the HTML run report; in the run folder and on the wandb dashboard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

from minigpt.common import atomic_write
from minigpt.model import GPT, generate
from minigpt.viz.attention import attention_figures, figure_to_png
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
    """

    def __init__(self, prompt: str = "ROMEO:\nWhat light through yonder window breaks?") -> None:
        """
        Args:
            prompt: The text whose attention is drawn; keep it short (tens of tokens) to stay readable.
        """
        self.prompt = prompt

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        model = whole_model(trainer, pl_module)
        if model is None:  # not rank 0
            return
        figures = attention_figures(model, trainer.datamodule.tokenizer, self.prompt)
        folder = Path(trainer.default_root_dir) / ATTENTION_DIR
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, figure in figures.items():
            path = folder / f"{name}.png"
            with atomic_write(path) as tmp:
                tmp.write_bytes(figure_to_png(figure))
            paths.append(path)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                captions = [f"{p.stem} at step {trainer.global_step}" for p in paths]
                logger.log_image(key="attention", images=[str(p) for p in paths], caption=captions)


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
