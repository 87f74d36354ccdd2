"""What every model file records besides the weights: the model's shape and its tokenizer.

Training stores it in each checkpoint under `MODEL_KEY`, export in the safetensors metadata, so
any of them rebuilds the model without the config it was trained from.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from minigpt.model import ConfigError, GPTConfig

from .errors import CheckpointError

MODEL_KEY = "minigpt"
"""Where a checkpoint (or safetensors metadata) holds the description."""

PARAMETER_SETTINGS = (
    "vocab_size",
    "n_layer",
    "n_head",
    "n_embd",
    "qkv_bias",
    "bias",
    "tie_weights",
    "position_embedding",
    "norm",
)
"""GPTConfig fields that decide which parameters exist and their shapes (with context_length,
which sizes the learned position table)."""

FUNCTION_SETTINGS = (
    "gelu_approximate",
    "layer_norm_eps",
    "rope_base",
    "qk_norm",
    "activation",
)
"""GPTConfig fields that change what the parameters compute; weights trained with them need them."""

LEGACY_SETTINGS = {
    "gelu_approximate": "tanh",
    "layer_norm_eps": 1e-5,
    "position_embedding": "learned",
    "rope_base": 10000.0,
    "qk_norm": False,
    "norm": "layernorm",
    "activation": "gelu",
    "zero_init_proj": False,
}
"""Settings that descriptions written before they existed lack, with the values those models
were built with."""

REMOVED_SETTINGS = {"logit_softcap": None, "value_residual": False, "unet_skips": False, "embed_norm": False}
"""Levers the ablation rejected and the model no longer has (benchmarks/RESULTS.md), with the
values that left them off: a description holding them so describes the model we build without them."""

LAST_COMMIT_WITH_REMOVED = "6352ba0fea246c09b6ce67c64ad8cdec996f7db4"
"""The last commit whose model computes the removed settings: the one to read a model trained with them."""


def describe(config: GPTConfig, tokenizer_spec: dict[str, Any]) -> dict[str, Any]:
    """The description of a model: plain JSON-able values, so checkpoints load with weights_only."""
    return {"gpt": asdict(config), "tokenizer": tokenizer_spec}


def with_legacy_settings(gpt: dict[str, Any], origin: str = "checkpoint") -> dict[str, Any]:
    """A saved `asdict(GPTConfig)` as today's `GPTConfig` takes it: the settings it predates
    filled in, the removed ones dropped.

    Raises:
        CheckpointError: The model was trained with a removed setting on; the message names the
            commit that still reads it.
    """
    gpt = dict(gpt)
    for name, off in REMOVED_SETTINGS.items():
        if gpt.pop(name, off) != off:
            raise CheckpointError(
                f"{origin} was trained with model.gpt.{name}, which minigpt no longer has (its ablation in "
                f"benchmarks/RESULTS.md rejected it); commit {LAST_COMMIT_WITH_REMOVED} still reads it"
            )
    return {**LEGACY_SETTINGS, **gpt}


def read_description(description: Any, origin: str | Path) -> tuple[GPTConfig, dict[str, Any]]:
    """The model config and tokenizer spec a description holds.

    Raises:
        CheckpointError: The description is missing fields or holds invalid values.
    """
    try:
        config = GPTConfig(**with_legacy_settings(description["gpt"], f"checkpoint {origin}"))
        spec = description["tokenizer"]
    except CheckpointError:
        raise  # one line already, naming the file
    except (KeyError, TypeError, ValueError, ConfigError) as err:
        raise CheckpointError(f"checkpoint {origin} has an invalid model description: {err}") from None
    if not isinstance(spec, dict):
        raise CheckpointError(f"checkpoint {origin} has an invalid model description: no tokenizer spec")
    return config, spec
