"""The LightningModule: a thin adapter that trains `minigpt.model.GPT` on token windows.

It owns what lives outside the network: the loss, the optimizer and schedule, gradient
clipping, and the model description every checkpoint carries (shape and tokenizer, written by
`minigpt.checkpoints`). Samples, throughput and the non-finite guard are callbacks
(`callbacks.py`), declared in the YAML.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch.distributed.fsdp import FullyShardedDataParallel

from minigpt.checkpoints import MODEL_KEY, CheckpointError, describe, resolve_checkpoint
from minigpt.checkpoints.convert import LORA_KEY, from_lightning
from minigpt.checkpoints.description import FUNCTION_SETTINGS, PARAMETER_SETTINGS, with_legacy_settings
from minigpt.checkpoints.pickled import load_tensors_only
from minigpt.checkpoints.pretrained import load_pretrained, open_pretrained
from minigpt.evaluation.metrics import BitsPerByte
from minigpt.model import GPT, ConfigError, GPTConfig
from minigpt.model.vocab import add_token_rows

from .config import LoRAConfig, OptimConfig
from .lightning_internals import (
    carry_step_count,
    gradients_kept_local,
    keep_stopped_epoch_open,
    optimize_manually,
    set_logging_step,
)
from .loggers import step_logs_written
from .lora import ADAPTER_FOLDER, add_adapters, save_adapter
from .loss import fused_linear_cross_entropy, next_token_loss, token_losses
from .optim import build_optimizer, build_scheduler
from .precision import fast_matmul_dtype

log = logging.getLogger("minigpt")


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
                the full logits: the same result in far less memory with a large vocabulary, but
                slower than full logits where memory is plentiful (benchmarks/RESULTS.md).
            compile: Run the training step's forward through `torch.compile` as one region: the
                blocks, the LM head and the cross-entropy (with `fused_loss`, the blocks alone;
                validation compiles the blocks, sampling stays eager). The first training step
                and the first validation each pay a compile; benchmarks/RESULTS.md says what it
                gains at our shapes.
            init_from: Start from these weights instead of random ones (fine-tuning): a GPT-2
                folder in the Hugging Face layout, a hub name such as `gpt2` (fetched when a
                network exists), a run folder or a checkpoint or safetensors file of ours. The
                weights fix the model's shape (train.py fills `gpt` from them) and the tokenizer.
            lora: Train low-rank adapters (LoRA, through peft) on the layers it names, and the
                rows of tokens new to the weights (the chat markers), and freeze every other
                parameter; null trains every parameter. The run's checkpoints hold the whole
                network and read as the merged model; its end writes the adapters alone in
                `<run>/adapter/` (docs/training.md, "LoRA").
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
                "lora": self._lora_settings(),
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
        self._token_bytes: torch.Tensor | None = None
        """(n_vocab,) int64: the UTF-8 bytes each token id stands for (0: end-of-text)."""
        self._val_score: BitsPerByte | None = None
        """This validation's sums over this rank's targets (a new one each validation)."""

    # -- building ---------------------------------------------------------------------------

    def configure_model(self) -> None:
        if self.model is not None:
            return
        tokenizer = self.trainer.datamodule.tokenizer
        # A tokenizer that adds the chat markers to the weights' (ChatTokenizer) adds rows too.
        base = getattr(tokenizer, "base", tokenizer)
        vocab_size = self.gpt_config.vocab_size or tokenizer.n_vocab
        if vocab_size < base.n_vocab:
            raise ConfigError(
                f"model vocab_size {vocab_size} is smaller than the tokenizer's {tokenizer.n_vocab} tokens"
            )
        self.gpt_config = replace(self.gpt_config, vocab_size=vocab_size)
        self.tokenizer_spec = tokenizer.spec()
        self._token_bytes = torch.from_numpy(tokenizer.byte_lengths())
        self.model = GPT(self.gpt_config)
        new_tokens = list(range(base.n_vocab, tokenizer.n_vocab))
        if self.init_from is not None:
            model_file, weights, spec = open_pretrained(self.init_from)
            if spec not in (self.tokenizer_spec, base.spec()):
                raise ConfigError(
                    f"the weights of {self.init_from} read {spec['name']} token ids, but this run's data is "
                    f"tokenized with {self.tokenizer_spec['name']}"
                    + (" (a vocabulary built from other text)" if spec["name"] == tokenizer.name else "")
                )
            load_pretrained(self.model, model_file, weights)
            if spec != self.tokenizer_spec:  # the markers are new to the weights
                add_token_rows(self.model, tokenizer.n_vocab, trained=base.n_vocab)
                self.new_tokens = new_tokens
        elif vocab_size < tokenizer.n_vocab:  # resuming such a run: its checkpoint holds the rows
            add_token_rows(self.model, tokenizer.n_vocab, trained=base.n_vocab)
            self.new_tokens = new_tokens
        elif new_tokens and self.lora is not None and self._started_without_markers():
            self.new_tokens = new_tokens  # resuming, from a table padded past them (GPT-2's 50304 rows)
        if self.lora is not None:  # last: it freezes what is there, but the new tokens' rows
            add_adapters(self.model, self.lora, self.new_tokens)
        self.gpt_config = self.model.config

    def _started_without_markers(self) -> bool:
        """Whether the weights a resumed run started from (its `init_from`, which train.py has
        read again for their shape) lacked the chat markers, which a padded table's size cannot
        tell."""
        started = self.hparams.get("init_from")
        return started is not None and open_pretrained(started)[2] != self.tokenizer_spec

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model, self.optim_config)
        scheduler = build_scheduler(optimizer, self.optim_config, self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # -- steps ------------------------------------------------------------------------------

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def hidden(
        self, x: torch.Tensor, segments: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The final hidden states (B, T, C) of inputs x (B, T): what the LM head reads. `segments`
        and `positions` (B, T), those of a batch of packed conversations, keep them apart."""
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
        # Lightning logs each step under its own count of optimizer steps, which equals
        # global_step at the start of every batch. A checkpoint saved by the validation Lightning
        # adds when a run is told to stop (SIGTERM, Ctrl-C, max_time) brings that count back one
        # short, and the resumed run's curve would sit one step left of the first part's.
        set_logging_step(self.trainer, self.trainer.global_step)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        """One micro-batch: `(x, y)`, or packed conversations' `(x, y, segments, positions)`.

        The step is written out here (manual optimization, `optimize_manually`): the forward pass
        and the backward of the loss over the step's micro-batches; on the micro-batch that ends
        the step, the optimizer's update (clipping first, in `on_before_optimizer_step`) and the
        schedule's. Under FSDP, whose backward cannot run inside the step, Lightning takes them.
        Logs `train_loss`, the loss of the step's global batch (the mean over its micro-batches
        and over the ranks), on the steps whose logs are written; only those reduce it over the
        ranks, since the reduction makes every rank wait for the others. Returns the micro-batch's
        loss (its mean over the targets that are not -100), or under manual optimization its share
        of the step's (over the number of micro-batches), as Lightning hands callbacks either way."""
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
        optimizer = self.optimizers()
        if first:
            optimizer.zero_grad(set_to_none=True)  # as the step starts: callbacks see the last step's
        loss = self.loss(x, y, *packed)
        share = loss / self.trainer.accumulate_grad_batches  # the step's gradient: the micro-batches' mean
        # Lightning runs the whole step under the precision's autocast; the backward pass and the
        # update run outside it, as they do under automatic optimization.
        with torch.autocast(self.device.type, enabled=False):
            with gradients_kept_local(self.trainer, not last):  # no all-reduce before the last micro-batch
                self.manual_backward(share)
            if last:
                optimizer.step()  # through the precision plugin, which calls on_before_optimizer_step
                self.lr_schedulers().step()
        return loss, share

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
                self.grad_norm = torch.nn.utils.clip_grad_norm_(
                    self.model.parameters(), self.optim_config.grad_clip
                )
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

    # -- checkpoints ------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[MODEL_KEY] = describe(self.gpt_config, self.tokenizer_spec)
        # Dropout draws from torch's generator: restoring it makes a resumed run exact.
        checkpoint["torch_rng_state"] = torch.get_rng_state()
        checkpoint[ARITHMETIC_KEY] = self._arithmetic()
        if self.lora is not None:  # how to merge the adapters (minigpt.checkpoints reads it)
            checkpoint[LORA_KEY] = {**self._lora_settings(), "tokens": self.new_tokens}
        # A run stopped by max_steps mid-epoch resumes with the epoch's next batch.
        keep_stopped_epoch_open(self.trainer, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(MODEL_KEY)
        if saved is None:
            raise ConfigError("checkpoint was not written by minigpt (no model description in it)")
        if saved["tokenizer"] != self.tokenizer_spec:
            raise ConfigError("checkpoint was trained with a different tokenizer than this run's data uses")
        self._check_adapters(checkpoint.get(LORA_KEY))
        carry_step_count(checkpoint, manual=not self.automatic_optimization)
        if "torch_rng_state" in checkpoint:
            torch.set_rng_state(checkpoint["torch_rng_state"])
        if self.trainer.state.fn == TrainerFn.FITTING:
            self._check_resumable(checkpoint)
        ours, theirs = asdict(self.gpt_config), with_legacy_settings(saved["gpt"])
        if any(theirs.get(k) != ours[k] for k in SHAPE_KEYS):
            raise ConfigError(
                f"checkpoint model shape {_shape(theirs)} differs from the config's {_shape(ours)}"
            )
        for name in FUNCTION_KEYS:
            if theirs.get(name) != ours[name]:
                raise ConfigError(
                    f"checkpoint was trained with {name} {theirs.get(name)!r}; set --model.gpt.{name} "
                    f"{theirs.get(name)} to resume it"
                )

    def _lora_settings(self) -> dict[str, Any] | None:
        return None if self.lora is None else {**asdict(self.lora), "targets": list(self.lora.targets)}

    def _check_adapters(self, saved: dict[str, Any] | None) -> None:
        """Refuse a checkpoint whose adapters (or lack of them) differ from this run's `lora`."""
        ours = self._lora_settings()
        keys = ("rank", "alpha", "targets")  # what decides the parameters and what they compute
        if saved is None and ours is None:
            return
        if saved is None:
            raise ConfigError("checkpoint was trained without adapters: set --model.lora null to resume it")
        if ours is None or any(saved[key] != ours[key] for key in keys):
            said = ", ".join(f"{key} {saved[key]}" for key in keys)
            raise ConfigError(f"checkpoint was trained with model.lora {said}: set the same to resume it")
        if saved.get("tokens", []) != self.new_tokens:  # the weights it started from have changed
            raise ConfigError(
                f"checkpoint trained the rows of tokens {saved.get('tokens', [])} and this run would train "
                f"those of {self.new_tokens}: it cannot resume; start a new run from its weights with "
                "--model.init_from <checkpoint>"
            )

    def on_train_end(self) -> None:
        """A LoRA run writes its adapters alone: those of the checkpoint that loading the run
        folder reads (its best, else its last), or the model's own where none was saved."""
        if self.lora is None or not self.trainer.is_global_zero:
            return
        run = Path(self.trainer.default_root_dir)
        try:
            checkpoint = load_tensors_only(resolve_checkpoint(run), "cannot read the run's checkpoint")
            state = from_lightning(checkpoint["state_dict"])
        except CheckpointError:
            state = self.model.state_dict()
        # A resumed run's init_from is None (its weights come from the checkpoint); not its hparams'.
        save_adapter(self.model, state, run / ADAPTER_FOLDER, base=self.hparams.get("init_from"))

    def _check_resumable(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint that cannot resume training, and say where a resume cannot be
        exact, rather than going on wrongly."""
        if "optimizer_states" not in checkpoint:
            raise CheckpointError(
                "the checkpoint holds the weights only, without the optimizer's state: it cannot resume a "
                "run; start a new one from its weights with --model.init_from <checkpoint>"
            )
        # A checkpoint written with a weight average (EMAWeights) holds the average as its weights
        # and the raw weights beside them. With the average in this run, EMAWeights restores both;
        # without it, training must go on from the raw weights, not from the average.
        averaged = any(isinstance(c, WeightAveraging) for c in self.trainer.callbacks)
        if "current_model_state" in checkpoint and not averaged:
            checkpoint["state_dict"] = checkpoint["current_model_state"]
            self._warn(
                "the checkpoint keeps an average of the weights (EMAWeights) that this run does not: "
                "training goes on from the raw weights, and the average is dropped"
            )
        saved, here = checkpoint.get(ARITHMETIC_KEY), self._arithmetic()
        if saved is not None and saved != here:
            self._warn(
                f"the checkpoint was trained in {saved} and this machine trains in {here}: the run goes "
                "on, but not bit for bit as it would have on the machine that wrote it"
            )

    def _warn(self, message: str) -> None:
        if self.trainer.is_global_zero:
            log.warning(message)

    def _arithmetic(self) -> str:
        """What decides a step's rounding here: the trainer's precision and, with Muon, the
        precision it orthogonalises in (both follow the machine: training/precision.py)."""
        arithmetic = str(self.trainer.precision)
        if self.optim_config.optimizer == "muon":
            dtype = fast_matmul_dtype(self.trainer.strategy.root_device)
            arithmetic += f", Muon orthogonalising in {str(dtype).removeprefix('torch.')}"
        return arithmetic


ARITHMETIC_KEY = "minigpt_arithmetic"
"""Checkpoint key: `LitGPT._arithmetic()` of the run that wrote it."""

SHAPE_KEYS = ("context_length", *PARAMETER_SETTINGS)
"""GPTConfig fields that change the parameters; the others (dropout) may differ on resume."""

FUNCTION_KEYS = FUNCTION_SETTINGS
"""GPTConfig fields that change what the parameters compute, so a resume must keep them."""


def _shape(gpt: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={gpt.get(k)}" for k in SHAPE_KEYS) + ")"
