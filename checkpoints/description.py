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

LEGACY_SETTINGS = {"gelu_approximate": "tanh"}
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
