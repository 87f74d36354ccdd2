"""Clocks, interleaving and the statistics every section reports.

CPU speed on shared or virtual machines drifts, sometimes within seconds, so sections interleave
their contestants (`rotated`) and report medians over repeats; speed-ups are medians of
per-repeat ratios (`paired_ratio`), which cancels most of the drift.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import torch

T = TypeVar("T")


def now() -> float:
    return time.perf_counter()


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def paired_ratio(a: dict[int, float], b: dict[int, float]) -> float:
    """Median over repeats of a[r] / b[r], using only repeats where both were measured."""
    return median([a[r] / b[r] for r in a if r in b and b[r] > 0])


def rotated(items: list[T], r: int) -> list[T]:
    """`items` starting at position r (mod its length): repeat r's running order."""
    if not items:
        return items
    k = r % len(items)
    return items[k:] + items[:k]


def use_threads(n: int) -> bool:
    """Switch torch to `n` threads; True if the count changed."""
    if torch.get_num_threads() == n:
        return False
    torch.set_num_threads(n)
    return True


class LoadMeter:
    """CPU time used by other processes and stolen by the hypervisor while a section ran.

    On a shared machine another busy process makes multi-threaded kernels wait for a thread that
    is not running, so this is printed under every section to tell such runs apart.
    """

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, list[int], float] | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        except (OSError, ValueError, IndexError):
            return None
        t = os.times()
        return now(), fields, t.user + t.system + t.children_user + t.children_system

    def summary(self) -> str:
        end = self._sample()
        if self.start is None or end is None:
            return ""
        wall = end[0] - self.start[0]
        d = [b - a for a, b in zip(self.start[1], end[1], strict=True)]
        tick = os.sysconf("SC_CLK_TCK")
        user, nice, system, _idle, _iowait, irq, softirq, steal = d
        busy = (user + nice + system + irq + softirq) / tick
        other = max(0.0, busy - (end[2] - self.start[2])) / wall
        return (
            f"_Machine during this section ({wall:.0f} s): other processes used {other:.2f} cores on "
            f"average, hypervisor steal {steal / tick / wall:.2f} cores._"
        )
