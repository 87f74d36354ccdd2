"""LoRA through `peft`: adapters put into a GPT's layers, and written alone when a run ends.

peft imports transformers, seconds on a cold start, so it is imported in these functions: only a
run that sets `model.lora` pays for it. Checkpoints hold the whole network as peft wraps it (each
adapted layer's frozen `base_layer` beside its `lora_A` and `lora_B`), so a run resumes exactly
and `minigpt.checkpoints` reads one as the merged model (`convert.merge_lora`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from minigpt.checkpoints.convert import LORA_ADAPTER
from minigpt.common import atomic_write
from minigpt.model import GPT

from .config import LoRAConfig

if TYPE_CHECKING:
    from peft import LoraConfig

ADAPTER_FOLDER = "adapter"
"""Where in the run folder a LoRA run's adapters are written alone."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""The adapters' file in that folder, named as peft names it (beside its `adapter_config.json`)."""
ADAPTER_PARAMETERS = (".lora_A.", ".lora_B.")
"""What the names of the adapters' parameters hold, and no other parameter's."""


def is_adapter(name: str) -> bool:
    """Whether the parameter `name` (as `named_parameters` gives it) is one of LoRA's."""
    return any(part in name for part in ADAPTER_PARAMETERS)


def add_adapters(model: GPT, config: LoRAConfig) -> None:
    """Wrap `config.targets` in every block of `model` with adapters, in place, and freeze every
    other parameter (peft's `inject_adapter_in_model`: the GPT stays a GPT, its forward as it was)."""
    from peft import inject_adapter_in_model

    inject_adapter_in_model(_peft_config(config), model)


def save_adapter(model: GPT, state: dict[str, torch.Tensor], folder: Path, base: str | None) -> Path:
    """Write the adapters of `state`, a state dict of `model` (which holds the adapters), alone in
    `folder`: `adapter_model.safetensors` and `adapter_config.json`, peft's files, which
    `load_adapter` reads back onto the weights the run started from, `base` (the config names
    it). Returns the weights' path."""
    from peft import get_peft_model_state_dict

    adapters = get_peft_model_state_dict(model, state_dict=state)
    path = folder / ADAPTER_WEIGHTS
    with atomic_write(path) as tmp:
        save_file({name: tensor.contiguous() for name, tensor in adapters.items()}, tmp, {"format": "pt"})
    config = model.peft_config[LORA_ADAPTER]
    config.base_model_name_or_path = base
    config.save_pretrained(str(folder))
    return path


def load_adapter(model: GPT, folder: Path) -> None:
    """Put the adapters `save_adapter` wrote in `folder` into `model`, the weights the run started
    from, in place: its layers wrapped as the folder's `adapter_config.json` says, then filled."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

    inject_adapter_in_model(LoraConfig.from_pretrained(str(folder)), model)
    result = set_peft_model_state_dict(model, load_file(folder / ADAPTER_WEIGHTS))
    if result.unexpected_keys:
        raise ValueError(f"{folder} holds adapters for layers the model lacks: {result.unexpected_keys[0]}")


def _peft_config(config: LoRAConfig) -> LoraConfig:
    from peft import LoraConfig

    return LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.targets),
        bias="none",
    )
