"""Loading a model from any format, and writing one as safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_model

from minigpt.common import safe_write
from minigpt.data import Tokenizer, tokenizer_from_spec
from minigpt.model import GPT

from .description import MODEL_KEY, describe, read_description
from .errors import CheckpointError
from .formats import ModelFile, open_model_file


def load_model(
    path: str | Path, device: str | torch.device = "cpu", tokenizer_path: str | None = None
) -> tuple[GPT, Tokenizer]:
    """Rebuild a trained GPT (in eval mode, on `device`) and its tokenizer from a file or run folder.

    Args:
        path: A run directory (its best, else last, checkpoint) or a file in any format of `FORMATS`.
        device: Where the model goes.
        tokenizer_path: GPT-2's ranks file, on machines that cannot fetch it.

    Raises:
        CheckpointError: The file is missing, unreadable, or disagrees with its own description.
        DataError: The tokenizer cannot be rebuilt (e.g. GPT-2's ranks cannot be loaded).
    """
    model_file = open_model_file(path)
    config, spec = read_description(model_file.description, model_file.path)
    tokenizer = tokenizer_from_spec(spec, tokenizer_path)
    model = GPT(config)
    load_weights(model_file, model)
    return model.to(device).eval(), tokenizer


def load_weights(model_file: ModelFile, model: GPT) -> None:
    """Put a model file's weights into `model`; a mismatch is one line naming the first key."""
    try:
        model_file.load_weights(model)
    except (RuntimeError, SafetensorError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0]
        raise CheckpointError(
            f"checkpoint {model_file.path} does not match its model description: {detail}"
        ) from None


def save_safetensors(model: GPT, tokenizer: Tokenizer, path: str | Path) -> Path:
    """Write the weights as safetensors, with the model description as metadata; atomically.

    Raises:
        WriteError: A full disk or a folder not the user's; `path` is then as it was.
    """
    path = Path(path)
    metadata = {MODEL_KEY: json.dumps(describe(model.config, tokenizer.spec()))}
    with safe_write(path, size=weight_bytes(model)) as tmp:
        save_model(model, str(tmp), metadata=metadata)
    return path


def weight_bytes(model: torch.nn.Module) -> int:
    """The bytes of the model's weights, nearly all of an exported file's size (a tied weight once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
