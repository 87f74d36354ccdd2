"""Starting a training run from trained weights (`init_from`): GPT-2's, or one of our models.

The weights decide the model's shape; a run may change only what leaves the parameters as they
are (dropout, the attention path) and may shorten the context, keeping the first rows of the
position table, as nanoGPT's `crop_block_size` does.

A hub name is looked up in the hub's cache first when the hub cannot be reached, and otherwise
stops at once with the command that downloads it, instead of after the hub client's retries.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from minigpt.common import hub
from minigpt.model import GPT, ConfigError, GPTConfig

from .description import FUNCTION_SETTINGS, PARAMETER_SETTINGS, read_description
from .errors import CheckpointError
from .formats import ModelFile, open_model_file
from .huggingface import CONFIG_FILE, HUB_NAME
from .load import load_weights

SHAPE_SETTINGS = PARAMETER_SETTINGS + FUNCTION_SETTINGS
"""Settings the weights fix: their parameters' shapes, and the functions they were trained with."""
DOWNLOADED_AS = {"gpt2-124m": "gpt2"}
"""Folder names docs/huggingface.md downloads a hub model into, and that model's hub name."""


def open_pretrained(source: str | Path) -> tuple[ModelFile, GPTConfig, dict[str, Any]]:
    """The model file `source` names (a GPT-2 folder, a hub name, a run folder, a checkpoint or
    safetensors file), the config its weights were trained with, and its tokenizer spec.

    Raises:
        CheckpointError: The file is unusable, or `source` is a hub name neither on this machine
            nor fetchable (the line says how to download it).
    """
    name = str(source)
    if _names_hub_model(name) and (reason := hub.hub_unreachable()) is not None:
        if not _in_hub_cache(name):
            raise CheckpointError(_download_hint(name, reason))
        with hub.hub_offline():
            model_file = open_model_file(source)
    else:
        model_file = open_model_file(source)
    config, spec = read_description(model_file.description, model_file.path)
    return model_file, config, spec


def _names_hub_model(name: str) -> bool:
    """Whether `resolve_checkpoint` would ask the hub for `name`: no such path, a hub-like name."""
    path = Path(name)
    return (
        not path.exists()
        and HUB_NAME.fullmatch(name) is not None
        and path.suffix not in (".ckpt", ".safetensors")
    )


def _in_hub_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, CONFIG_FILE), str)


def _download_hint(name: str, reason: str) -> str:
    """One line: `name` is not here and cannot be fetched, and the command that fetches it."""
    if name in DOWNLOADED_AS:
        return (
            f"no folder {name} here, and it cannot be fetched: {reason}; where a network is, download "
            f"`{DOWNLOADED_AS[name]}` into it with `hf download {DOWNLOADED_AS[name]} --local-dir {name}`, "
            "then copy that folder here"
        )
    folder = name.split("/")[-1]
    then = "copy that folder here" if folder == name else f"copy that folder here and pass {folder}"
    return (
        f"no file or folder {name} here, and the hub model `{name}` cannot be fetched: {reason}; where a "
        f"network is, download it with `hf download {name} --local-dir {folder}`, then {then}"
    )


def pretrained_config(weights: GPTConfig, ours: GPTConfig, given: set[str], source: str) -> GPTConfig:
    """The config to train the weights with: their shape, with our dropout and attention path,
    and our context length when `given` (the settings the user set) holds it.

    Raises:
        ConfigError: A shape setting the user gave disagrees with the weights, or the context is
            longer than their position table.
    """
    for name in SHAPE_SETTINGS:
        if (
            name in given
            and getattr(ours, name) is not None
            and getattr(ours, name) != getattr(weights, name)
        ):
            raise ConfigError(
                f"model.gpt.{name} is {getattr(ours, name)!r} but the weights of {source} have "
                f"{getattr(weights, name)!r}; leave it out to take theirs"
            )
    context_length = ours.context_length if "context_length" in given else weights.context_length
    if context_length > weights.context_length:
        raise ConfigError(
            f"model.gpt.context_length {context_length} is longer than the {weights.context_length} "
            f"positions the weights of {source} were trained with"
        )
    return replace(weights, context_length=context_length, dropout=ours.dropout, attention=ours.attention)


def load_pretrained(model: GPT, model_file: ModelFile, config: GPTConfig) -> None:
    """Copy the weights of `model_file` (trained with `config`, as `open_pretrained` returns them)
    into `model` (built with `pretrained_config`), cropping the position table to its context.

    Raises:
        CheckpointError: The file is unusable or its weights do not fit the model.
    """
    if config.context_length == model.config.context_length:
        load_weights(model_file, model)
        return
    full = GPT(replace(config, attention=model.config.attention))
    load_weights(model_file, full)
    state = full.state_dict()
    if "transformer.wpe.weight" in state:  # rotary models have no position table
        state["transformer.wpe.weight"] = state["transformer.wpe.weight"][: model.config.context_length]
    model.load_state_dict(state)
