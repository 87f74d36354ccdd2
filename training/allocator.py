"""Keep freed memory in the process instead of handing it back to the OS after every step.

glibc serves large allocations (above a threshold of at most 32 MiB) with fresh mmap'ed pages and
returns them on free. A training step allocates and frees hundreds of MB of activations, logits
and gradients, so every step page-faults all of that memory in again and the kernel zeroes it:
on a small CPU that is a large share of a step (measured in benchmarks/RESULTS.md, "Levers").
Raising the thresholds makes those buffers come from the heap, which keeps its pages.

`apply_mallopt` applies any set of glibc malloc parameters, so the benchmarks can compare other
settings with exactly the code path train.py uses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

# glibc's mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4

SETTINGS = {M_MMAP_THRESHOLD: 1 << 30, M_TRIM_THRESHOLD: (1 << 31) - 1}
"""glibc mallopt parameters and values: no mmap below 1 GiB, never trim the heap (benchmarks use them too)."""


def glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's `mallopt(param, value)`, or None where the C library is not glibc on Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None  # not glibc (e.g. musl): nothing to tune
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def apply_mallopt(settings: Mapping[int, int]) -> str:
    """Apply glibc malloc `settings` ({parameter: value}) to this process.

    Returns "" when every setting applied (an empty mapping always does), otherwise why not: no
    glibc, or the parameters glibc rejected. Settings only affect allocations made afterwards, so
    apply them before the process allocates its big buffers.
    """
    if not settings:
        return ""
    mallopt = glibc_mallopt()
    if mallopt is None:
        return f"no glibc mallopt on this platform ({sys.platform})"
    rejected = [param for param, value in settings.items() if mallopt(param, value) != 1]
    return f"mallopt rejected parameters {rejected}" if rejected else ""


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to reuse freed memory. Returns whether it applied (glibc on Linux only)."""
    if glibc_mallopt() is None:
        return False
    problem = apply_mallopt(SETTINGS)
    if problem:
        log.warning("could not tune the memory allocator (%s); training runs at default speed", problem)
    return not problem
