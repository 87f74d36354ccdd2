"""`ModelFile`, what every model file format hands back, and `ModelFormat`, what a format is: the
interface `formats.py` lists its formats behind and `sharded.py` implements, apart from both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import nn


@dataclass(frozen=True)
class ModelFile:
    """A readable model file: its description and how to load its weights."""

    path: Path
    description: dict[str, Any]
    """What `describe` wrote: the model's config and its tokenizer spec."""
    load_weights: Callable[[nn.Module], None]
    """Copies the weights into a model built from the description (raises on any mismatch)."""


class ModelFormat(Protocol):
    name: str

    def recognizes(self, path: Path) -> bool:
        """Whether this format reads `path` (by its name or layout; contents are checked in `open`)."""
        ...

    def open(self, path: Path) -> ModelFile:
        """Read the description; raise CheckpointError naming the problem if the file is unusable."""
        ...
