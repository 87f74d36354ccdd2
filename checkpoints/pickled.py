"""Reading files written by `torch.save` as untrusted input."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError


def load_tensors_only(path: Path, unreadable: str) -> Any:
    """`torch.load(path, weights_only=True)` on the CPU: full unpickling would run whatever code
    the file names. A file holding other objects is refused; one that cannot be read at all
    raises with `unreadable` (which names the file) and the reason.

    Raises:
        CheckpointError: one line, as described.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        reason = str(err).splitlines()[0]
        raise CheckpointError(
            f"refusing to load {path}: it holds objects other than tensors ({reason})"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"{unreadable} ({' '.join(str(err).split())})") from None
