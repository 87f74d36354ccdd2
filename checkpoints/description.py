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
    "value_residual",
    "unet_skips",
)
"""GPTConfig fields that decide which parameters exist and their shapes (with context_length,
which sizes the learned position table)."""

FUNCTION_SETTINGS = (
    "gelu_approximate",
    "layer_norm_eps",
    "rope_base",
    "qk_norm",
    "activation",
    "logit_softcap",
    "embed_norm",
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
    "logit_softcap": None,
    "value_residual": False,
    "unet_skips": False,
    "embed_norm": False,
}
"""Settings that descriptions written before they existed lack, with the values those models
were built with."""


def describe(config: GPTConfig, tokenizer_spec: dict[str, Any]) -> dict[str, Any]:
    """The description of a model: plain JSON-able values, so checkpoints load with weights_only."""
    return {"gpt": asdict(config), "tokenizer": tokenizer_spec}


def with_legacy_settings(gpt: dict[str, Any]) -> dict[str, Any]:
    """A saved `asdict(GPTConfig)` with the settings it predates filled in."""
    return {**LEGACY_SETTINGS, **gpt}


def read_description(description: Any, origin: str | Path) -> tuple[GPTConfig, dict[str, Any]]:
    """The model config and tokenizer spec a description holds.

    Raises:
        CheckpointError: The description is missing fields or holds invalid values.
    """
    try:
        config = GPTConfig(**with_legacy_settings(description["gpt"]))
        spec = description["tokenizer"]
    except (KeyError, TypeError, ValueError, ConfigError) as err:
        raise CheckpointError(f"checkpoint {origin} has an invalid model description: {err}") from None
    if not isinstance(spec, dict):
        raise CheckpointError(f"checkpoint {origin} has an invalid model description: no tokenizer spec")
    return config, spec
