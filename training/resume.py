"""What a run keeps in its checkpoints beside Lightning's state, and what it checks before it goes
on from one.

- Saving: the model description (shape and tokenizer) that every model file of ours carries,
  torch's generator (dropout), the arithmetic the run trained in, LoRA's settings.
- Loading: the same tokenizer, shape and adapters, or one line saying what to set; a checkpoint
  without the optimizer's state cannot resume; where the machine's arithmetic differs, or the
  weight average is gone, a warning says the run will not be bit for bit what it would have been.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn

from minigpt.checkpoints import MODEL_KEY, CheckpointError, describe
from minigpt.checkpoints.convert import LORA_KEY
from minigpt.checkpoints.description import FUNCTION_SETTINGS, PARAMETER_SETTINGS, with_legacy_settings
from minigpt.model import ConfigError

from .lightning_internals import carry_step_count, keep_stopped_epoch_open
from .precision import fast_matmul_dtype

if TYPE_CHECKING:
    from .lit import LitGPT

log = logging.getLogger("minigpt")

ARITHMETIC_KEY = "minigpt_arithmetic"
"""Checkpoint key: `arithmetic()` of the run that wrote it."""

SHAPE_KEYS = ("context_length", *PARAMETER_SETTINGS)
"""GPTConfig fields that change the parameters; the others (dropout) may differ on resume."""

FUNCTION_KEYS = FUNCTION_SETTINGS
"""GPTConfig fields that change what the parameters compute, so a resume must keep them."""


def save_run_state(module: LitGPT, checkpoint: dict[str, Any]) -> None:
    """Add to `checkpoint` what the run keeps beside Lightning's state."""
    checkpoint[MODEL_KEY] = describe(module.gpt_config, module.tokenizer_spec)
    # Dropout draws from torch's generator: restoring it makes a resumed run exact.
    checkpoint["torch_rng_state"] = torch.get_rng_state()
    checkpoint[ARITHMETIC_KEY] = arithmetic(module)
    if module.lora is not None:  # how to merge the adapters (minigpt.checkpoints reads it)
        checkpoint[LORA_KEY] = {**module.lora_settings(), "tokens": module.new_tokens}
    # A run stopped by max_steps mid-epoch resumes with the epoch's next batch.
    keep_stopped_epoch_open(module.trainer, checkpoint)


def load_run_state(module: LitGPT, checkpoint: dict[str, Any]) -> None:
    """Refuse a checkpoint this run cannot go on from, and restore what `save_run_state` kept."""
    saved = checkpoint.get(MODEL_KEY)
    if saved is None:
        raise ConfigError("checkpoint was not written by minigpt (no model description in it)")
    if saved["tokenizer"] != module.tokenizer_spec:
        raise ConfigError("checkpoint was trained with a different tokenizer than this run's data uses")
    check_adapters(checkpoint.get(LORA_KEY), module.lora_settings(), module.new_tokens)
    carry_step_count(checkpoint, manual=not module.automatic_optimization)
    if "torch_rng_state" in checkpoint:
        torch.set_rng_state(checkpoint["torch_rng_state"])
    if module.trainer.state.fn == TrainerFn.FITTING:
        check_resumable(module, checkpoint)
    ours, theirs = asdict(module.gpt_config), with_legacy_settings(saved["gpt"])
    if any(theirs.get(k) != ours[k] for k in SHAPE_KEYS):
        raise ConfigError(f"checkpoint model shape {shape(theirs)} differs from the config's {shape(ours)}")
    for name in FUNCTION_KEYS:
        if theirs.get(name) != ours[name]:
            raise ConfigError(
                f"checkpoint was trained with {name} {theirs.get(name)!r}; set --model.gpt.{name} "
                f"{theirs.get(name)} to resume it"
            )


def check_adapters(saved: dict[str, Any] | None, ours: dict[str, Any] | None, new_tokens: list[int]) -> None:
    """Refuse a checkpoint whose adapters (or lack of them) differ from this run's `lora`."""
    keys = ("rank", "alpha", "targets")  # what decides the parameters and what they compute
    if saved is None and ours is None:
        return
    if saved is None:
        raise ConfigError("checkpoint was trained without adapters: set --model.lora null to resume it")
    if ours is None or any(saved[key] != ours[key] for key in keys):
        said = ", ".join(f"{key} {saved[key]}" for key in keys)
        raise ConfigError(f"checkpoint was trained with model.lora {said}: set the same to resume it")
    if saved.get("tokens", []) != new_tokens:  # the weights it started from have changed
        raise ConfigError(
            f"checkpoint trained the rows of tokens {saved.get('tokens', [])} and this run would train "
            f"those of {new_tokens}: it cannot resume; start a new run from its weights with "
            "--model.init_from <checkpoint>"
        )


def check_resumable(module: LitGPT, checkpoint: dict[str, Any]) -> None:
    """Refuse a checkpoint that cannot resume training, and say where a resume cannot be exact,
    rather than going on wrongly."""
    if "optimizer_states" not in checkpoint:
        raise CheckpointError(
            "the checkpoint holds the weights only, without the optimizer's state: it cannot resume a "
            "run; start a new one from its weights with --model.init_from <checkpoint>"
        )
    # A checkpoint written with a weight average (EMAWeights) holds the average as its weights
    # and the raw weights beside them. With the average in this run, EMAWeights restores both;
    # without it, training must go on from the raw weights, not from the average.
    trainer = module.trainer
    averaged = any(isinstance(c, WeightAveraging) for c in trainer.callbacks)
    if "current_model_state" in checkpoint and not averaged:
        checkpoint["state_dict"] = checkpoint["current_model_state"]
        warn(
            module,
            "the checkpoint keeps an average of the weights (EMAWeights) that this run does not: "
            "training goes on from the raw weights, and the average is dropped",
        )
    saved, here = checkpoint.get(ARITHMETIC_KEY), arithmetic(module)
    if saved is not None and saved != here:
        warn(
            module,
            f"the checkpoint was trained in {saved} and this machine trains in {here}: the run goes "
            "on, but not bit for bit as it would have on the machine that wrote it",
        )


def arithmetic(module: LitGPT) -> str:
    """What decides a step's rounding here: the trainer's precision and, with Muon, the precision
    it orthogonalises in (both follow the machine: training/precision.py)."""
    trainer = module.trainer
    said = str(trainer.precision)
    if module.optim_config.optimizer == "muon":
        dtype = fast_matmul_dtype(trainer.strategy.root_device)
        said += f", Muon orthogonalising in {str(dtype).removeprefix('torch.')}"
    return said


def warn(module: LitGPT, message: str) -> None:
    if module.trainer.is_global_zero:
        log.warning(message)


def shape(gpt: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={gpt.get(k)}" for k in SHAPE_KEYS) + ")"
