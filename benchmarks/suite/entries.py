"""Timed training blocks, and the interleaved rounds that run every contestant once per repeat."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .contestants import TrainSpec, build_train_step
from .probes import Matmul
from .settings import Settings
from .stats import minor_faults, now, rotated, use_threads

log = logging.getLogger(__name__)


@dataclass
class TrainEntry:
    """A training contestant and its measurements, keyed by repeat."""

    spec: TrainSpec
    label: str = ""
    default_threads: int = 0
    """Threads when the spec sets none (0: torch's count as it is)."""
    step: Callable[[], torch.Tensor] | None = None
    tokens: int = 0
    flops: int = 0
    first_step_s: float = float("nan")
    error: str | None = None
    tps: dict[int, float] = field(default_factory=dict)
    mfu: dict[int, float] = field(default_factory=dict)
    faults: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.label = self.label or self.spec.name

    @property
    def threads(self) -> int:
        return self.spec.threads or self.default_threads or torch.get_num_threads()

    def prepare(self, warmup: int, batch_div: int) -> None:
        try:
            use_threads(self.threads)
            self.step, self.tokens, self.flops = build_train_step(self.spec, batch_div)
            for i in range(max(1, warmup)):
                start = now()
                loss = float(self.step())
                if i == 0:
                    self.first_step_s = now() - start
                if not loss == loss or loss in (float("inf"), float("-inf")):
                    raise RuntimeError(f"loss is {loss}")
        except Exception as error:  # report, keep benchmarking the others
            self.error = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
            self.step = None
            log.info(f"  FAILED {self.label}: {self.error}")

    def measure(self, r: int, steps: int, matmul: Matmul) -> None:
        if self.step is None:
            return
        if use_threads(self.threads):
            self.step()  # the first step after a thread-count switch pays for new threads and kernels
        peak = matmul.probe(self.spec.dtype)
        faults = minor_faults()
        start = now()
        for _ in range(steps):
            self.step()
        seconds = now() - start
        faults = minor_faults() - faults
        self.tps[r] = self.tokens * steps / seconds
        self.mfu[r] = self.flops * steps / seconds / (peak * 1e9)
        self.faults[r] = faults / steps
        log.info(f"  [{r}] {self.label}: {self.tps[r]:,.0f} tok/s, MFU {100 * self.mfu[r]:.1f}%")

    def release(self) -> None:
        self.step = None


def run_interleaved(
    entries: list[TrainEntry],
    settings: Settings,
    matmul: Matmul,
    title: str,
    each_round: Callable[[int], None] | None = None,
) -> None:
    """Prepare every entry, then `settings.repeats` rounds of one timed block per entry in
    rotating order. Each round starts with a matmul round and `each_round(r)`, if given."""
    log.info(f"[{title}] building and warming up {len(entries)} contestants")
    for entry in entries:
        entry.prepare(settings.warmup, settings.batch_div)
    for r in range(settings.repeats):
        log.info(f"[{title}] repeat {r + 1}/{settings.repeats}")
        matmul.round()
        if each_round is not None:
            each_round(r)
        for entry in rotated(entries, r):
            entry.measure(r, settings.steps, matmul)


def new_entries(specs: list[TrainSpec], settings: Settings) -> list[TrainEntry]:
    """An entry per spec, at the run's thread count unless the spec sets its own."""
    return [TrainEntry(spec, default_threads=settings.threads) for spec in specs]
