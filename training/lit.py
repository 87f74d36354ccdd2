"""`LitGPT`, the LightningModule that trains `minigpt.model.GPT` on token windows: the step.

- The step is written out (`training_step`): forward, backward of each micro-batch's share, and on
  the last micro-batch of a step the clipped update and the schedule's.
- Validation sums nats and bytes over every rank's targets (`BitsPerByte`).
- The network it trains is built in `weights.py`; what its checkpoints keep and check, in
  `resume.py`. Everything else a run does is a callback (cli/train_defaults.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.distributed.fsdp import FullyShardedDataParallel

from minigpt.evaluation.metrics import BitsPerByte
from minigpt.model import GPT, GPTConfig

from .config import LoRAConfig, OptimConfig
from .lightning_internals import gradients_kept_local, optimize_manually, set_logging_step
from .loggers import step_logs_written
from .loss import fused_linear_cross_entropy, next_token_loss, token_losses
from .optim import build_optimizer, build_scheduler
from .resume import load_run_state, save_run_state
from .weights import build_network, trainable_line, write_adapter


class LitGPT(L.LightningModule):
    """Trains a GPT. The network is built in `configure_model`, once the tokenizer is known."""

    def __init__(
        self,
        gpt: GPTConfig = GPTConfig(),
        optim: OptimConfig = OptimConfig(),
        fused_loss: bool = False,
        compile: bool = False,
        init_from: str | None = None,
        lora: LoRAConfig | None = None,
    ) -> None:
        """
        Args:
            gpt: Shape of the network.
            optim: Optimizer and learning-rate schedule.
            fused_loss: Compute the LM head and the loss a chunk of rows at a time, never holding
                the full logits: far less memory with a large vocabulary, slower otherwise.
            compile: Run the training step's forward, head and loss through `torch.compile` as
                one region (with `fused_loss`, the blocks alone; validation compiles the blocks).
            init_from: Start from these weights (fine-tuning): a GPT-2 folder in the Hugging Face
                layout, a hub name such as `gpt2`, a run folder, or a checkpoint or safetensors
                file of ours. They fix the model's shape and the tokenizer.
            lora: Train low-rank adapters (LoRA, through peft) on the layers it names and the rows
                of tokens new to the weights, freezing the rest; null trains every parameter. The
                run's end writes the adapters alone in `<run>/adapter/` (docs/training.md, "LoRA").
        """
        super().__init__()
        self.lora = lora
        # Plain dicts, so checkpoints load with torch.load(weights_only=True).
        self.save_hyperparameters(
            {
                "gpt": asdict(gpt),
                "optim": asdict(optim),
                "fused_loss": fused_loss,
                "compile": compile,
                "init_from": init_from,
                "lora": self.lora_settings(),
            }
        )
        self.init_from = init_from
        self.fused_loss = fused_loss
        self._compile = compile
        self._features: Any = None
        self._step_loss: Any = None
        self.gpt_config = gpt
        self.optim_config = optim
        self.model: GPT | None = None
        self.new_tokens: list[int] = []
        """Ids the weights the run started from had no rows for (the chat markers a fine-tune
        adds): under LoRA their rows train, in the embedding and the head."""
        self.tokenizer_spec: dict[str, Any] | None = None
        self.grad_norm: torch.Tensor | None = None
        """Global gradient norm of the last optimizer step, before clipping (None without clipping)."""
        self._clipped: list[torch.nn.Parameter] | None = None
        """The parameters clipping reads, listed once: `parameters()` walks every module each step."""
        self._token_bytes: torch.Tensor | None = None
        """(n_vocab,) int64: the UTF-8 bytes each token id stands for (0: end-of-text)."""
        self._val_score: BitsPerByte | None = None
        """This validation's sums over this rank's targets (a new one each validation)."""

    def configure_model(self) -> None:
        if self.model is not None:
            return
        tokenizer = self.trainer.datamodule.tokenizer
        self.tokenizer_spec = tokenizer.spec()
        self._token_bytes = torch.from_numpy(tokenizer.byte_lengths())
        started = self.hparams.get("init_from")  # a resumed run's weights started from these
        network = build_network(self.gpt_config, tokenizer, self.init_from, self.lora, started)
        self.model, self.new_tokens = network
        self.gpt_config = self.model.config

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model, self.optim_config)
        scheduler = build_scheduler(optimizer, self.optim_config, self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def hidden(
        self, x: torch.Tensor, segments: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The final hidden states (B, T, C) of x (B, T); `segments` and `positions` (B, T) keep
        packed conversations apart."""
        if self._features is None:  # on first use, so that a model assigned directly works too
            # Compiling the bound method leaves the module, and so its state_dict, untouched.
            self._features = torch.compile(self.model.features) if self._compile else self.model.features
        return self._features(x, segments=segments, positions=positions)

    def loss(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        segments: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean next-token cross-entropy of the model on inputs x (B, T) and targets y (B, T), over
        the targets that are not -100; `segments` and `positions` as in `hidden`."""
        if self.fused_loss:  # its chunk loop is an autograd function of its own: the blocks alone compile
            hidden = self.hidden(x, segments, positions)
            return fused_linear_cross_entropy(hidden, self.model.lm_head.weight, y)
        if self._step_loss is None:
            # One region from token ids to the loss: the compiler fuses the head's output with the
            # cross-entropy, and the step launches no eager kernel between the blocks and the loss.
            self._step_loss = torch.compile(self._plain_loss) if self._compile else self._plain_loss
        return self._step_loss(x, y, segments, positions)

    def _plain_loss(
        self, x: torch.Tensor, y: torch.Tensor, segments: torch.Tensor | None, positions: torch.Tensor | None
    ) -> torch.Tensor:
        return next_token_loss(self.model(x, segments=segments, positions=positions), y)

    def setup(self, stage: str) -> None:
        if stage == "fit":
            optimize_manually(self)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # A resumed curve would otherwise sit one step left: see set_logging_step.
        set_logging_step(self.trainer, self.trainer.global_step)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        """One micro-batch: `(x, y)`, or packed conversations' `(x, y, segments, positions)`. Manual
        optimization (`optimize_manually`), but under FSDP, whose backward cannot run in the step.
        `train_loss`, the mean over the step's micro-batches and the ranks, is logged only on steps
        whose logs are written (the reduction makes every rank wait). Returns the micro-batch's
        share of the step's loss, as Lightning hands callbacks."""
        x, y, *packed = batch
        trainer = self.trainer
        accumulated = trainer.accumulate_grad_batches
        ends_step = (batch_idx + 1) % accumulated == 0 or trainer.is_last_batch
        if batch_idx % accumulated == 0:
            self._step_losses: list[torch.Tensor] = []
        if self.automatic_optimization:
            loss = share = self.loss(x, y, *packed)
        else:
            loss, share = self._step(x, y, packed, first=batch_idx % accumulated == 0, last=ends_step)
        self._step_losses.append(loss.detach())
        if ends_step and step_logs_written(trainer):  # StepProgressBar shows it
            self.log("train_loss", torch.stack(self._step_losses).mean(), sync_dist=True)
        return share

    def _step(
        self, x: torch.Tensor, y: torch.Tensor, packed: list[torch.Tensor], first: bool, last: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch's forward and backward, and on the `last` of a step the update: its
        loss, and its share of the step's."""
        if first:
            self.optimizers().zero_grad(set_to_none=True)  # as the step starts: callbacks saw the last's
        loss = self.loss(x, y, *packed)
        share = loss / self.trainer.accumulate_grad_batches  # the step's gradient: the micro-batches' mean
        self.backward_and_update(share, last)
        return loss, share

    def backward_and_update(self, share: torch.Tensor, last: bool) -> None:
        """Backward of a micro-batch's `share`; on the `last`, the update. Outside Lightning's autocast."""
        with torch.autocast(self.device.type, enabled=False):
            with gradients_kept_local(self.trainer, not last):  # no all-reduce before the last micro-batch
                self.manual_backward(share)
            if last:
                self.optimizers().step()  # through the precision plugin: on_before_optimizer_step
                self.lr_schedulers().step()

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Clipping here rather than through Trainer(gradient_clip_val=...): Lightning refuses that
        # with manual optimization (and with fused AdamW under mixed precision); here it runs
        # after a 16-bit run's scaler has unscaled the gradients.
        if self.optim_config.grad_clip is not None:
            root = self.trainer.strategy.model
            if isinstance(root, FullyShardedDataParallel):
                # Each rank holds a shard of the gradients: FSDP's own clipping takes the norm of all.
                self.grad_norm = root.clip_grad_norm_(self.optim_config.grad_clip)
            else:
                if self._clipped is None:
                    self._clipped = [p for p in self.model.parameters() if p.requires_grad]
                self.grad_norm = torch.nn.utils.clip_grad_norm_(self._clipped, self.optim_config.grad_clip)
            if step_logs_written(self.trainer):
                self.log("grad_norm", self.grad_norm)

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        x, y, *packed = batch
        chunk_rows = 256 if self.fused_loss else None  # the fused loss never holds all the logits
        losses = token_losses(self.hidden(x, *packed), self.model.lm_head.weight, y, chunk_rows)  # (B*T,)
        self._val_score.update(losses, y)

    def on_validation_epoch_start(self) -> None:
        self._val_score = BitsPerByte(self._token_bytes).to(self.device)

    def on_validation_epoch_end(self) -> None:
        """Log val_loss (nats per target token), val_ppl and val_bpb, each from the sums over every
        rank's targets (`BitsPerByte`, which also says what end-of-text counts in each)."""
        # Every rank joins the reduction, also one that scored no batch (it would hang the others).
        score = {name: value.item() for name, value in self._val_score.compute().items()}
        if not score["targets"]:
            return
        # The same on every rank (already summed over them), so sync_dist's mean leaves them as they are.
        self.log("val_loss", score["loss"], prog_bar=True, sync_dist=True)
        self.log("val_ppl", math.exp(min(score["loss"], 50.0)), sync_dist=True)  # of the mean loss
        if score["bytes"]:
            self.log("val_bpb", score["bpb"], prog_bar=True, sync_dist=True)

    # -- checkpoints and the end -------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        save_run_state(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        load_run_state(self, checkpoint)

    def training_summary(self, params: int) -> str:
        return trainable_line(self.model, self.lora, self.new_tokens, params)  # for the run's summary

    def lora_settings(self) -> dict[str, Any] | None:
        """`lora` as the checkpoints and hyperparameters keep it (None: every weight trains)."""
        return None if self.lora is None else {**asdict(self.lora), "targets": list(self.lora.targets)}

    def on_train_end(self) -> None:
        if self.lora is not None and self.trainer.is_global_zero:
            write_adapter(self.model, Path(self.trainer.default_root_dir), base=self.hparams.get("init_from"))
