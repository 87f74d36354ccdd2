"""What a run shows besides numbers: text samples as the model learns, written to the console, the
run folder (`samples.jsonl`, for the report) and the wandb dashboard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger

from minigpt.model import generate

from .config import SampleConfig

SAMPLES_FILE = "samples.jsonl"
"""In the run folder: one {"step": ..., "text": ...} object per line, one line per sample."""


class SampleText(L.Callback):
    """Generates a sample after every validation: printed, appended to `samples.jsonl` in the run
    folder, and logged to wandb as a table that grows by one row each time.

    Runs on rank 0 only, with its own seeded generator, so samples from different steps differ
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
        if trainer.sanity_checking or not self.sample.max_new_tokens or not trainer.is_global_zero:
            return
        cfg, model = self.sample, pl_module.model
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
        text = cfg.prompt + tokenizer.decode(out[0, prompt.shape[1] :].tolist())
        pl_module.print(f"\n--- sample at step {trainer.global_step} ---\n{text}\n---")
        self.rows.append([trainer.global_step, text])
        run_dir = Path(trainer.default_root_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / SAMPLES_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": trainer.global_step, "text": text}) + "\n")
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_text(key="samples", columns=["step", "text"], data=self.rows)
