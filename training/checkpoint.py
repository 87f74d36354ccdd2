"""The one way to load a trained model: checkpoint -> (GPT, tokenizer).

Used by generation and export alike. Files are untrusted input: they are read with
`torch.load(weights_only=True)` or safetensors, never with full unpickling.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model as load_safetensors_into
from safetensors.torch import save_model

from minigpt.data import Tokenizer, tokenizer_from_spec
from minigpt.model import GPT, GPTConfig
from minigpt.model.config import with_legacy_settings

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


def load_model(
    path: str | Path, device: str | torch.device = "cpu", tokenizer_path: str | None = None
) -> tuple[GPT, Tokenizer]:
    """Rebuild the trained GPT (in eval mode, on `device`) and its tokenizer from a file.

    `tokenizer_path` points at GPT-2's ranks file on machines that cannot fetch it.
    """
    path = resolve_checkpoint(path)
    if path.suffix == ".safetensors":
        meta, state = _read_safetensors_metadata(path), None
    else:
        meta, state = _read_lightning_checkpoint(path)
    try:
        config = GPTConfig(**with_legacy_settings(meta["gpt"]))
        spec = meta["tokenizer"]
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} has an invalid model description: {err}") from None
    tokenizer = tokenizer_from_spec(spec, tokenizer_path)  # DataError names what is missing
    model = GPT(config)
    try:
        if state is None:
            # safetensors stores tied tensors once; its loader restores the sharing.
            load_safetensors_into(model, path)
        else:
            model.load_state_dict(state)
    except (RuntimeError, SafetensorError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0]
        raise CheckpointError(f"checkpoint {path} does not match its model description: {detail}") from None
    return model.to(device).eval(), tokenizer


def check_readable(path: Path) -> None:
    """Fail fast on a truncated or foreign file: torch.save writes a zip archive, index at the end."""
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"cannot read checkpoint {path}: truncated or not a PyTorch checkpoint")


def _read_lightning_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    check_readable(path)
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


def _read_safetensors_metadata(path: Path) -> dict[str, Any]:
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
        return json.loads(metadata[CHECKPOINT_KEY])
    except (SafetensorError, OSError, KeyError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {path} as minigpt safetensors weights ({err})") from None


def export_safetensors(model: GPT, tokenizer: Tokenizer, path: str | Path) -> Path:
    """Write the weights as safetensors, with the model description and tokenizer as metadata."""
    path = Path(path)
    meta = {"gpt": asdict(model.config), "tokenizer": tokenizer.spec()}
    tmp = path.with_name(f".{path.name}.tmp")
    save_model(model, str(tmp), metadata={CHECKPOINT_KEY: json.dumps(meta)})
    os.replace(tmp, path)
    return path
