"""The LightningModule: a thin adapter that trains `minigpt.model.GPT` on token windows.

It owns what lives outside the network: the loss, the optimizer and schedule, and samples at
validation. It is the one place that knows both the model and the tokenizer, so it also
records the tokenizer in every checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import Any

import lightning as L
import torch

from minigpt.model import GPT, ConfigError, GPTConfig, generate
from minigpt.model.config import with_legacy_settings

from .config import OptimConfig, SampleConfig
from .loss import fused_linear_cross_entropy, next_token_loss
from .optim import build_optimizer, build_scheduler


class DivergenceError(RuntimeError):
    """The loss or the gradients stopped being finite."""


CHECKPOINT_KEY = "minigpt"
"""Checkpoint entry holding what is needed to rebuild the model without this module."""


class LitGPT(L.LightningModule):
    """Trains a GPT. The network is built in `configure_model`, once the tokenizer is known."""

    def __init__(
        self,
        gpt: GPTConfig = GPTConfig(),
        optim: OptimConfig = OptimConfig(),
        sample: SampleConfig = SampleConfig(),
        fused_loss: bool = False,
        compile: bool = False,
    ) -> None:
        """
        Args:
            gpt: Shape of the network.
            optim: Optimizer and learning-rate schedule.
            sample: The sample generated at each validation.
            fused_loss: Compute the LM head and the loss a chunk of rows at a time, never holding
                the full logits: same result in far less memory with a large vocabulary. Off by
                default: with the allocator tuned (--keep_freed_memory) full logits are faster on
                CPU (benchmarks/RESULTS.md, allocator levers).
            compile: Run the network's blocks through `torch.compile` (the loss and sampling stay
                eager). The first training step and the first validation each pay a compile of
                tens of seconds; see benchmarks/RESULTS.md for what it gains on your shapes.
        """
        super().__init__()
        # Plain dicts, so checkpoints load with torch.load(weights_only=True).
        self.save_hyperparameters(
            {
                "gpt": asdict(gpt),
                "optim": asdict(optim),
                "sample": asdict(sample),
                "fused_loss": fused_loss,
                "compile": compile,
            }
        )
        self.fused_loss = fused_loss
        self._compile = compile
        self._features: Any = None
        self.gpt_config = gpt
        self.optim_config = optim
        self.sample_config = sample
        self.model: GPT | None = None
        self.tokenizer_spec: dict[str, Any] | None = None
        self._val_loss_sum = 0.0
        self._val_batches = 0
        self.samples: list[list[Any]] = []
        """Rows (step, text) of the samples so far, for the dashboard's table."""

    # -- building ---------------------------------------------------------------------------

    def configure_model(self) -> None:
        if self.model is not None:
            return
        tokenizer = self.trainer.datamodule.tokenizer
        vocab_size = self.gpt_config.vocab_size or tokenizer.n_vocab
        if vocab_size < tokenizer.n_vocab:
            raise ConfigError(
                f"model vocab_size {vocab_size} is smaller than the tokenizer's {tokenizer.n_vocab} tokens"
            )
        self.gpt_config = replace(self.gpt_config, vocab_size=vocab_size)
        self.tokenizer_spec = tokenizer.spec()
        self.model = GPT(self.gpt_config)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model, self.optim_config)
        scheduler = build_scheduler(optimizer, self.optim_config, self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # -- steps ------------------------------------------------------------------------------

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of the model on inputs x (B, T) and targets y (B, T)."""
        if self._features is None:  # on first use, so that a model assigned directly works too
            # Compiling the bound method leaves the module, and so its state_dict, untouched.
            self._features = torch.compile(self.model.features) if self._compile else self.model.features
        hidden = self._features(x)
        if self.fused_loss:
            return fused_linear_cross_entropy(hidden, self.model.lm_head.weight, y)
        return next_token_loss(self.model.lm_head(hidden), y)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss(x, y)
        self._check_finite(loss, "loss")
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def _check_finite(self, value: torch.Tensor, what: str) -> None:
        """Stop before a non-finite value reaches the weights, and so any checkpoint."""
        bad = not bool(torch.isfinite(value))
        if self.trainer.world_size > 1:  # all ranks stop together, or the others would hang
            bad = self.trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad:
            raise DivergenceError(f"the {what} became {value.item()} at step {self.global_step}")

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Clipping here rather than through Trainer(gradient_clip_val=...): Lightning refuses that
        # with fused AdamW under mixed precision, although bf16 needs no gradient unscaling.
        if self.optim_config.grad_clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_config.grad_clip)
            self._check_finite(norm, "gradient norm")
            self.log("grad_norm", norm)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        loss = self.loss(x, y)
        # Mean over batches and, under DDP, over ranks.
        self.log("val_loss", loss, prog_bar=True, sync_dist=True)
        self._val_loss_sum += loss.item()
        self._val_batches += 1

    def on_validation_epoch_start(self) -> None:
        self._val_loss_sum, self._val_batches = 0.0, 0

    def on_validation_epoch_end(self) -> None:
        if self._val_batches:
            local_mean = torch.tensor(self._val_loss_sum / self._val_batches, device=self.device)
            mean = float(self.trainer.strategy.reduce(local_mean, reduce_op="mean"))
            if not math.isfinite(mean):  # raised before ModelCheckpoint would save these weights
                raise DivergenceError(f"the validation loss became {mean} at step {self.global_step}")
            # Perplexity of the mean loss (not the mean of per-batch perplexities).
            self.log("val_ppl", math.exp(min(mean, 50.0)), sync_dist=True)  # same on every rank
        if self.sample_config.max_new_tokens and not self.trainer.sanity_checking:
            self._sample()

    def _sample(self) -> None:
        """Generate the configured sample on rank 0, print it, and log it to every logger that takes text."""
        if not self.trainer.is_global_zero:
            return
        cfg = self.sample_config
        tokenizer = self.trainer.datamodule.tokenizer
        prompt_ids = tokenizer.encode(cfg.prompt) or [tokenizer.eot_id or 0]
        prompt = torch.tensor([prompt_ids[-self.gpt_config.context_length :]], device=self.device)
        generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        out = generate(
            self.model,
            prompt,
            cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            stop_token=tokenizer.eot_id,
            generator=generator,
        )
        text = tokenizer.decode(out[0, prompt.shape[1] :].tolist())
        self.print(f"\n--- sample at step {self.global_step} ---\n{cfg.prompt}{text}\n---")
        self.samples.append([self.global_step, cfg.prompt + text])
        for logger in self.loggers:
            if hasattr(logger, "log_text"):
                logger.log_text(key="samples", columns=["step", "text"], data=self.samples)

    # -- checkpoints ------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = {"gpt": asdict(self.gpt_config), "tokenizer": self.tokenizer_spec}
        # Dropout draws from torch's generator: restoring it makes a resumed run exact.
        checkpoint["torch_rng_state"] = torch.get_rng_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(CHECKPOINT_KEY)
        if saved is None:
            raise ConfigError("checkpoint was not written by minigpt (no model description in it)")
        if saved["tokenizer"] != self.tokenizer_spec:
            raise ConfigError("checkpoint was trained with a different tokenizer than this run's data uses")
        if "torch_rng_state" in checkpoint:
            torch.set_rng_state(checkpoint["torch_rng_state"])
        ours, theirs = asdict(self.gpt_config), with_legacy_settings(saved["gpt"])
        if any(theirs.get(k) != ours[k] for k in SHAPE_KEYS):
            raise ConfigError(
                f"checkpoint model shape {_shape(theirs)} differs from the config's {_shape(ours)}"
            )
        gelu = theirs["gelu_approximate"]
        if gelu != ours["gelu_approximate"]:
            raise ConfigError(
                f"checkpoint was trained with gelu_approximate {gelu!r}; set --model.gpt.gelu_approximate "
                f"{gelu} to resume it"
            )


SHAPE_KEYS = (
    "vocab_size",
    "context_length",
    "n_layer",
    "n_head",
    "n_embd",
    "qkv_bias",
    "bias",
    "tie_weights",
)
"""GPTConfig fields that change the parameters; the others (dropout) may differ on resume."""


def _shape(gpt: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={gpt.get(k)}" for k in SHAPE_KEYS) + ")"
