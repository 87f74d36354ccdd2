"""LoRA through `peft`: adapters put into a GPT's layers, and written alone when a run ends.

peft imports transformers, seconds on a cold start, so it is imported in these functions: only a
run that sets `model.lora` pays for it. Checkpoints hold the whole network as peft wraps it (each
adapted layer's frozen `base_layer` beside its `lora_A` and `lora_B`), so a run resumes exactly
and `minigpt.checkpoints` reads one as the merged model (`convert.merge_lora`).

Tokens new to the weights (the chat markers a fine-tune adds) have rows that nothing trained, so
they train too, through peft's trainable tokens: the frozen table is read with those rows
replaced by a small parameter of their own (`trainable_tokens_delta`, which holds the rows
themselves, not a difference). An untied head gets rows of its own; a tied head reads the
embedding's. peft ties a head only for a transformers config that says `tie_word_embeddings`,
which `GPTConfig` (`tie_weights`) is not, so `_tie_head` does what peft does then. Tested with
peft 0.21 (tests/training/test_lora.py); an untied head's rows need a peft with
huggingface/peft#2863, before which a head (a Linear, not an Embedding) could not have them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from minigpt.checkpoints.convert import LORA_ADAPTER, TOKEN_ROWS
from minigpt.common import safe_write
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
TABLES = ("transformer.wte", "lm_head")
"""The layers whose rows are tokens: the embedding, and the head where it is not tied to it."""


def is_adapter(name: str) -> bool:
    """Whether the parameter `name` (as `named_parameters` gives it) is one of LoRA's."""
    return any(part in name for part in ADAPTER_PARAMETERS)


def is_token_rows(name: str) -> bool:
    """Whether the parameter `name` holds the trained rows of tokens new to the weights."""
    return TOKEN_ROWS in name


def add_adapters(model: GPT, config: LoRAConfig, new_tokens: Sequence[int] = ()) -> None:
    """Wrap `config.targets` in every block of `model` with adapters, in place, and freeze every
    other parameter (peft's `inject_adapter_in_model`: the GPT stays a GPT, its forward as it was).
    The rows of `new_tokens` (ids the weights had no rows for) train too, in the embedding and
    the head: with a tied head, the same rows serve both."""
    from peft import inject_adapter_in_model

    peft_config = _peft_config(config, model, list(new_tokens))
    inject_adapter_in_model(peft_config, model)
    _tie_head(model, peft_config)


def new_token_rows(model: nn.Module) -> dict[int, nn.Module]:
    """The parameters (by `id`) that hold the trained rows of new tokens, each with the table
    (embedding or head) whose rows they replace."""
    return {
        id(module.trainable_tokens_delta[LORA_ADAPTER]): module.base_layer
        for name, module in model.named_modules()
        if name.endswith(".token_adapter") and module.tied_adapter is None
    }


def save_adapter(model: GPT, state: dict[str, torch.Tensor], folder: Path, base: str | None) -> Path:
    """Write the adapters of `state`, a state dict of `model` (which holds the adapters), alone in
    `folder`: `adapter_model.safetensors` and `adapter_config.json`, peft's files, which
    `load_adapter` reads back onto the weights the run started from, `base` (the config names
    it). The new tokens' rows are written with them. Returns the weights' path. Each file is
    replaced whole or not at all: a full disk or a folder not the user's raises WriteError."""
    from peft import get_peft_model_state_dict
    from peft.utils import CONFIG_NAME

    # The rows alone, never the whole table (peft's "auto" would look for the base's config).
    adapters = get_peft_model_state_dict(model, state_dict=state, save_embedding_layers=False)
    path = folder / ADAPTER_WEIGHTS
    size = sum(tensor.numel() * tensor.element_size() for tensor in adapters.values())
    with safe_write(path, size=size) as tmp:
        save_file({name: tensor.contiguous() for name, tensor in adapters.items()}, tmp, {"format": "pt"})
    config = model.peft_config[LORA_ADAPTER]
    config.base_model_name_or_path = base
    # peft writes the config into a folder: a folder of its own, whose file then moves into place.
    with safe_write(folder / CONFIG_NAME) as tmp, tempfile.TemporaryDirectory(dir=folder) as staging:
        config.save_pretrained(staging)
        os.replace(Path(staging) / CONFIG_NAME, tmp)
    return path


def load_adapter(model: GPT, folder: Path) -> None:
    """Put the adapters `save_adapter` wrote in `folder` into `model`, the weights the run started
    from with rows for its new tokens (`add_token_rows`), in place: its layers wrapped as the
    folder's `adapter_config.json` says, then filled."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

    config = LoraConfig.from_pretrained(str(folder))
    inject_adapter_in_model(config, model)
    _tie_head(model, config)
    result = set_peft_model_state_dict(model, load_file(folder / ADAPTER_WEIGHTS))
    if result.unexpected_keys:
        raise ValueError(f"{folder} holds adapters for layers the model lacks: {result.unexpected_keys[0]}")


def _peft_config(config: LoRAConfig, model: GPT, new_tokens: list[int]) -> LoraConfig:
    from peft import LoraConfig

    tables = TABLES[:1] if model.config.tie_weights else TABLES
    return LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.targets),
        bias="none",
        trainable_token_indices={table: new_tokens for table in tables} if new_tokens else None,
    )


def _tie_head(model: GPT, config: LoraConfig) -> None:
    """Make a tied head read the embedding's trained rows: wrap it as peft wraps a head tied to a
    table with trainable tokens (its `tied_adapter`: no parameters of its own, nothing saved)."""
    if not (model.config.tie_weights and config.trainable_token_indices):
        return
    from peft.utils import TrainableTokensWrapper

    embedding = model.transformer.wte.token_adapter
    tokens = embedding.token_indices[LORA_ADAPTER]
    head = TrainableTokensWrapper(model.lm_head, LORA_ADAPTER, token_indices=tokens, tied_adapter=embedding)
    head.set_adapter(LORA_ADAPTER, inference_mode=False)
    model.lm_head = head
