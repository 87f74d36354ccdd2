"""`LitDPO`: preference tuning (DPO, or IPO) of a trained GPT, through LitGPT's step.

- The reference is the weights the run starts from. Before the first step, their log-probability
  of every pair's answers (train and validation) is computed once, and the checkpoints keep it:
  no second model is held, and a resumed run reads it back rather than from its own weights.
  Under LoRA the starting weights are the model with its adapters off (B starts at zero).
- A batch is `(x, y, index)` from `PreferenceDataModule`: the chosen and the rejected
  conversation of each pair in one forward, `(2B, T)`, scored on the answers' tokens alone.
- The step, its accumulation, clipping and update are LitGPT's: only the loss differs
  (`preference_loss.py`). The rewards are logged under TRL's names, validation's with `val_`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, Subset

from .lit import LitGPT
from .loggers import step_logs_written
from .loss import token_losses
from .preference_loss import REWARD_NAMES, DPOConfig, answer_logps, preference_losses, reward_stats

REFERENCE_KEY = "minigpt_dpo_reference"
"""Checkpoint key: the reference's log-probabilities, `{split: (pairs, 2)}` fp32."""


class LitDPO(LitGPT):
    """Tunes a GPT on preference pairs; every other setting is LitGPT's (`model.init_from`: the
    weights to tune, which are also the reference)."""

    def __init__(self, dpo: DPOConfig = DPOConfig(), **kwargs: Any) -> None:
        """
        Args:
            dpo: The preference loss and its beta.
            **kwargs: LitGPT's settings.
        """
        super().__init__(**kwargs)
        self.dpo = dpo
        self.save_hyperparameters({**self.hparams, "dpo": asdict(dpo)})
        self.reference: dict[str, torch.Tensor] = {}
        """Each split's answers' summed log-probabilities under the starting weights,
        `(pairs, 2)` fp32: chosen, rejected."""
        self._step_stats: list[torch.Tensor] = []
        self._val_sums: torch.Tensor | None = None

    def on_fit_start(self) -> None:
        if not self.reference:  # a resumed run has it from its checkpoint
            self.reference = {split: self.reference_logps(split) for split in ("train", "val")}

    @torch.no_grad()
    def reference_logps(self, split: str) -> torch.Tensor:
        """The current weights' summed log-probability of each pair's answers in `split`, `(pairs, 2)`,
        without dropout and in the arithmetic the steps use.

        Under DDP each rank scores every `world_size`-th pair from its own rank on, and the ranks
        add up their tables, in which every other pair's row is zero. Elsewhere (one process, or
        FSDP, whose forward every rank must take the same number of times) each process scores all."""
        trainer = self.trainer
        data = trainer.datamodule
        windows = data.windows(split)
        out = torch.zeros(len(windows), 2, device=self.device)
        shared = isinstance(trainer.strategy, DDPStrategy) and trainer.world_size > 1
        mine = (
            Subset(windows, range(trainer.global_rank, len(windows), trainer.world_size))
            if shared
            else windows
        )
        training = self.model.training
        self.model.eval()
        with trainer.precision_plugin.forward_context():
            for x, y, index in DataLoader(mine, batch_size=data.config.batch_size):
                out[index.to(self.device)] = self.answer_logps(x.to(self.device), y.to(self.device))[0]
        self.model.train(training)
        return trainer.strategy.reduce(out, reduce_op="sum") if shared else out

    def answer_logps(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The summed log-probability of each pair's two answers, `(B, 2)` fp32, and their token
        counts `(B, 2)`, for inputs and targets `(B, 2, T)`."""
        chunk_rows = 256 if self.fused_loss else None  # never all the logits at once, as asked
        flat = y.flatten(0, 1)  # (2B, T): chosen and rejected rows in one forward
        losses = token_losses(self.hidden(x.flatten(0, 1)), self.model.lm_head.weight, flat, chunk_rows)
        logps, counts = answer_logps(losses.view(flat.shape), flat)
        return logps.view(y.shape[:2]), counts.view(y.shape[:2])

    def pair_losses(
        self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor, split: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each pair's loss `(B,)` and `reward_stats` `(4,)` for a batch of `split`."""
        logps, counts = self.answer_logps(x, y)
        reference = self.reference[split][index]
        if self.dpo.loss_type == "ipo":  # the mean per token of each answer
            logps, reference = logps / counts, reference / counts
        losses, chosen, rejected = preference_losses(
            logps[:, 0], logps[:, 1], reference[:, 0], reference[:, 1], self.dpo
        )
        return losses, reward_stats(chosen, rejected)

    def loss(self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """The mean preference loss of a training batch (LitGPT's step calls it)."""
        losses, stats = self.pair_losses(x, y, index, "train")
        self._step_stats.append(stats)
        return losses.mean()

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        trainer = self.trainer
        accumulated = trainer.accumulate_grad_batches
        if batch_idx % accumulated == 0:
            self._step_stats = []
        share = super().training_step(batch, batch_idx)
        ends_step = (batch_idx + 1) % accumulated == 0 or trainer.is_last_batch  # as LitGPT's
        if ends_step and step_logs_written(trainer):
            means = torch.stack(self._step_stats).mean(0)
            self.log_dict(dict(zip(REWARD_NAMES, means, strict=True)), sync_dist=True)
        return share

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        x, y, index = batch
        losses, stats = self.pair_losses(x, y, index, "val")
        count = len(losses)
        self._val_sums += torch.cat([losses.sum().view(1), stats * count, losses.new_tensor([count])])

    def on_validation_epoch_start(self) -> None:
        self._val_sums = torch.zeros(len(REWARD_NAMES) + 2, device=self.device)

    def on_validation_epoch_end(self) -> None:
        """Log val_loss and the rewards, means over every rank's held-out pairs."""
        sums = self.trainer.strategy.reduce(self._val_sums, reduce_op="sum")  # every rank joins
        count = sums[-1].item()
        if not count:
            return
        self.log("val_loss", sums[0] / count, prog_bar=True)
        for name, value in zip(REWARD_NAMES, sums[1:-1] / count, strict=True):
            self.log(f"val_{name}", value)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[REFERENCE_KEY] = {split: logps.cpu() for split, logps in self.reference.items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if REFERENCE_KEY in checkpoint:
            saved = checkpoint[REFERENCE_KEY]
            self.reference = {split: logps.to(self.device) for split, logps in saved.items()}
