"""The transformers configuration of a minigpt model (custom code, loaded with trust_remote_code).

Its settings are exactly those of minigpt's `GPTConfig` (minigpt_config.py, copied from minigpt's
model/config.py at export), read off the dataclass, so a setting minigpt adds is carried without
editing this file, and `GPTConfig` checks the values as it does in minigpt.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from transformers import PretrainedConfig

from .minigpt_config import GPTConfig


class MiniGPTConfig(PretrainedConfig):
    model_type = "minigpt"
    keys_to_ignore_at_inference = ["past_key_values"]
    # transformers' usual names for what GPTConfig calls otherwise (read by caches and pipelines).
    attribute_map = {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "context_length",
    }

    def __init__(self, **kwargs: Any) -> None:
        for field in fields(GPTConfig):
            setattr(self, field.name, kwargs.pop(field.name, field.default))
        kwargs["tie_word_embeddings"] = self.tie_weights  # transformers ties the head by this
        self.use_cache = kwargs.pop("use_cache", True)
        super().__init__(**kwargs)

    def gpt_config(self) -> GPTConfig:
        """minigpt's config of the model; raises minigpt's ConfigError naming a bad value."""
        return GPTConfig(**{field.name: getattr(self, field.name) for field in fields(GPTConfig)})
