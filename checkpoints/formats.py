"""The model file formats minigpt reads, each behind the same interface.

A format says whether it can read a path and, if so, returns a `ModelFile`: the description and a
way to put the weights into a built `GPT`. To add a format, write a class with `name`,
`recognizes(path)` and `open(path)`, and add an instance to `FORMATS`.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model as load_safetensors_into

from .convert import LORA_KEY, from_lightning, merge_lora
from .description import MODEL_KEY, read_description
from .errors import CheckpointError
from .huggingface import HUB_NAME, fetch_from_hub, hf_weights_loader, is_gpt2_folder, read_hf_description
from .model_file import ModelFile, ModelFormat
from .pickled import load_tensors_only
from .sharded import ShardedCheckpoint, is_sharded_checkpoint


def check_readable(path: Path) -> None:
    """Fail fast on a truncated or foreign file: torch.save writes a zip archive, index at the end."""
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"cannot read checkpoint {path}: truncated or not a PyTorch checkpoint")


class LightningCheckpoint:
    """A `.ckpt` file that training wrote: Lightning's dict with our description under MODEL_KEY.
    A LoRA run's reads as its merged model (`merge_lora`).

    Read with `torch.load(weights_only=True)`: a file is untrusted input, and full unpickling
    would run whatever code it names.
    """

    name = "lightning"

    def recognizes(self, path: Path) -> bool:
        return path.is_file() and path.suffix != ".safetensors"

    def open(self, path: Path) -> ModelFile:
        check_readable(path)
        checkpoint = load_tensors_only(
            path, f"cannot read checkpoint {path}: truncated or not a PyTorch checkpoint"
        )
        if not isinstance(checkpoint, dict) or MODEL_KEY not in checkpoint or "state_dict" not in checkpoint:
            raise CheckpointError(f"{path} is not a minigpt checkpoint")
        state = from_lightning(checkpoint["state_dict"])
        if LORA_KEY in checkpoint:  # a LoRA run: the model it trained is the merged one
            lora = checkpoint[LORA_KEY]
            state = merge_lora(state, lora["alpha"] / lora["rank"], lora.get("tokens", ()))
        return ModelFile(path, checkpoint[MODEL_KEY], lambda model: model.load_state_dict(state))


class SafetensorsWeights:
    """A `.safetensors` file that export wrote: the weights, with the description as JSON metadata."""

    name = "safetensors"

    def recognizes(self, path: Path) -> bool:
        return path.is_file() and path.suffix == ".safetensors"

    def open(self, path: Path) -> ModelFile:
        try:
            with safe_open(path, framework="pt") as f:
                metadata = f.metadata() or {}
            description = json.loads(metadata[MODEL_KEY])
        except (SafetensorError, OSError, KeyError, json.JSONDecodeError) as err:
            raise CheckpointError(f"cannot read {path} as minigpt safetensors weights ({err})") from None
        # safetensors stores tied tensors once; its own loader restores the sharing.
        return ModelFile(path, description, lambda model: load_safetensors_into(model, path))


class HuggingFaceGPT2:
    """A model folder in the Hugging Face layout: `config.json` and the weights of GPT-2, or of
    our model with custom code (see `huggingface.py`), from transformers' `save_pretrained`, the
    hub, or `export.py`. Read by our code only: the custom code a folder carries never runs."""

    name = "huggingface"

    def recognizes(self, path: Path) -> bool:
        return is_gpt2_folder(path)

    def open(self, path: Path) -> ModelFile:
        description = read_hf_description(path)
        config, _ = read_description(description, path)
        return ModelFile(path, description, hf_weights_loader(path, config))


FORMATS: tuple[ModelFormat, ...] = (
    HuggingFaceGPT2(),
    SafetensorsWeights(),
    LightningCheckpoint(),
    ShardedCheckpoint(),
)
"""Every format, tried in order; the first that recognizes a path reads it."""


def resolve_checkpoint(path: str | Path) -> Path:
    """A model file, a GPT-2 folder, a run directory (its best, else last, checkpoint), or a model
    name on the Hugging Face hub (`gpt2`), fetched into its cache when no such path exists."""
    name = str(path)
    path = Path(path)
    if is_gpt2_folder(path):
        return path
    if not path.exists() and HUB_NAME.fullmatch(name) and path.suffix not in (".ckpt", ".safetensors"):
        return fetch_from_hub(name)
    if is_sharded_checkpoint(path):
        return path
    if path.is_dir():
        for candidate in (path / "checkpoints" / "best.ckpt", path / "checkpoints" / "last.ckpt"):
            if candidate.is_file() or is_sharded_checkpoint(candidate):
                return candidate
        raise CheckpointError(
            f"no checkpoint in run directory {path} (expected checkpoints/best.ckpt or last.ckpt)"
        )
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    return path


def open_model_file(path: str | Path) -> ModelFile:
    """Open whatever `path` names (a run directory or a model file) with the format that reads it."""
    path = resolve_checkpoint(path)
    for model_format in FORMATS:
        if model_format.recognizes(path):
            return model_format.open(path)
    raise CheckpointError(f"{path} is in none of the formats minigpt reads")
