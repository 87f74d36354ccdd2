"""What the sections of one run share: the resolved command line and the results they hand on."""

from __future__ import annotations

from dataclasses import dataclass, field

from .probes import Matmul, MatmulBound
from .report import Report


@dataclass(frozen=True)
class Settings:
    """The command line with its defaults resolved (--quick applied); fixed for the whole run."""

    sections: tuple[str, ...]
    repeats: int
    """Timed blocks per contestant."""
    steps: int
    """Training steps per timed block."""
    warmup: int
    """Untimed training steps per contestant."""
    batch_div: int
    """Every shape's batch is divided by this (--quick: 4)."""
    threads: int
    """Torch threads of every contestant that does not set its own count."""
    quick: bool
    shapes: tuple[str, ...]
    chunks: tuple[int, ...]
    """Fused cross-entropy chunk sizes to try."""
    malloc: tuple[str, ...]
    """Allocator settings the alloc section compares, each in its own process."""
    allocator: str
    """Allocator setting of the main process."""
    new_tokens: int
    text: str | None
    """Text file for the data section (None: the built-in corpus)."""
    out: str | None
    worker: str | None
    """Set in a worker subprocess: its allocator setting."""


@dataclass
class State:
    """One run's settings and report, and the results a section leaves for later ones."""

    settings: Settings
    report: Report
    matmul: Matmul = field(default_factory=Matmul)
    """Every matmul probe of the run, for the peak table (section 1, written last)."""
    bound: MatmulBound = field(default_factory=MatmulBound)
    """Matmul bound rounds, taken by train and alloc next to their timed blocks."""
    best_chunk: int = 256
    """The fastest fused cross-entropy chunk at the small shape, which alloc then uses."""
    fastest: dict[str, tuple[str, str, dict[int, float]]] = field(default_factory=dict)
    """The fastest contestant of each kind ("ours", "peer") per shape and measurement, as (label,
    the section whose bound rounds it pairs with, tokens/s per repeat)."""
