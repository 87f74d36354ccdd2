"""The one way to load a trained model: checkpoint -> (GPT, tokenizer).

Used by generation and export alike. Files are untrusted input: they are read with
`torch.load(weights_only=True)` or safetensors, never with full unpickling.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_model

from minigpt.data import Tokenizer, tokenizer_from_spec
from minigpt.model import GPT, GPTConfig

from .lit import CHECKPOINT_KEY


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message is one line naming the file and the problem."""


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory (its best, else last, checkpoint)."""
    path = Path(path)
    if path.is_dir():
        for candidate in (path / "checkpoints" / "best.ckpt", path / "checkpoints" / "last.ckpt"):
            if candidate.is_file():
                return candidate
        raise CheckpointError(
            f"no checkpoint in run directory {path} (expected checkpoints/best.ckpt or last.ckpt)"
        )
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    return path


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, Tokenizer]:
    """Rebuild the trained GPT (in eval mode, on `device`) and its tokenizer from a file."""
    path = resolve_checkpoint(path)
    if path.suffix == ".safetensors":
        meta, state = _read_safetensors(path)
    else:
        meta, state = _read_lightning_checkpoint(path)
    try:
        config = GPTConfig(**meta["gpt"])
        tokenizer = tokenizer_from_spec(meta["tokenizer"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} has an invalid model description: {err}") from None
    model = GPT(config)
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
        raise CheckpointError(f"checkpoint {path} does not match its model description: {first}") from None
    return model.to(device).eval(), tokenizer


def _read_lightning_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        reason = str(err).splitlines()[0]
        raise CheckpointError(
            f"refusing to load {path}: it holds objects other than tensors ({reason})"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(
            f"cannot read checkpoint {path}: truncated or not a PyTorch checkpoint ({err})"
        ) from None
    if not isinstance(checkpoint, dict) or CHECKPOINT_KEY not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not a minigpt checkpoint")
    prefix = "model."
    state = {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    return checkpoint[CHECKPOINT_KEY], state


def _read_safetensors(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    try:
        state = load_file(path)
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
        meta = json.loads(metadata[CHECKPOINT_KEY])
    except (SafetensorError, OSError, KeyError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {path} as minigpt safetensors weights ({err})") from None
    if "lm_head.weight" not in state and meta["gpt"].get("tie_weights", True):
        state["lm_head.weight"] = state["transformer.wte.weight"]  # stored once when tied
    return meta, state


def export_safetensors(model: GPT, tokenizer: Tokenizer, path: str | Path) -> Path:
    """Write the weights as safetensors, with the model description and tokenizer as metadata."""
    path = Path(path)
    meta = {"gpt": asdict(model.config), "tokenizer": tokenizer.spec()}
    save_model(model, str(path), metadata={CHECKPOINT_KEY: json.dumps(meta)})
    return path
