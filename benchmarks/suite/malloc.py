"""The glibc allocator settings the benchmark compares, applied through minigpt's own allocator code."""

from __future__ import annotations

from minigpt.training import allocator

MALLOC_VARIANTS: dict[str, dict[int, int]] = {
    "default": {},
    "tuned": dict(allocator.SETTINGS),  # exactly what train.py applies (--keep_freed_memory)
    "nommap": {
        allocator.M_MMAP_MAX: 0,
        allocator.M_TRIM_THRESHOLD: allocator.SETTINGS[allocator.M_TRIM_THRESHOLD],
    },
}
MALLOC_DESCRIPTIONS = {
    "default": "glibc defaults (allocations above a dynamic threshold, at most 32 MiB, are mmap'ed "
    "and unmapped on free)",
    "tuned": "mallopt(M_MMAP_THRESHOLD, 1 GiB) + mallopt(M_TRIM_THRESHOLD, 2 GiB - 1): big tensors "
    "come from the heap, which keeps its pages",
    "nommap": "mallopt(M_MMAP_MAX, 0) + mallopt(M_TRIM_THRESHOLD, 2 GiB - 1): never mmap",
}


def apply_variant(variant: str) -> str:
    """Apply a MALLOC_VARIANTS entry to this process; returns '' or a reason it could not."""
    return allocator.apply_mallopt(MALLOC_VARIANTS[variant])
