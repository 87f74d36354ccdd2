"""Keep freed memory in the process instead of handing it back to the OS after every step.

glibc serves large allocations (above a threshold of at most 32 MiB) with fresh mmap'ed pages and
returns them on free. A training step allocates and frees hundreds of MB of activations, logits
and gradients, so every step page-faults all of that memory in again and the kernel zeroes it:
on a 2-core CPU that was over half of a small model's step (benchmarks/RESULTS.md, "Levers").
Raising the thresholds makes those buffers come from the heap, which keeps its pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
SETTINGS = {M_MMAP_THRESHOLD: 1 << 30, M_TRIM_THRESHOLD: (1 << 31) - 1}
"""glibc mallopt parameters and values: no mmap below 1 GiB, never trim the heap (benchmarks use them too)."""


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to reuse freed memory. Returns whether it applied (glibc on Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (e.g. musl): nothing to tune
    ok = all(mallopt(param, value) == 1 for param, value in SETTINGS.items())
    if not ok:
        log.warning("could not tune the memory allocator; training runs at default speed")
    return ok
