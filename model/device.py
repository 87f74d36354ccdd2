"""What a device can hold: its memory, and a one-line refusal of an allocation that can never fit.

The model asks before it allocates what grows with a setting (the causal mask with the context
length, the parameters with the shape, the attention scores with the batch), so a setting too big
for the machine is named in one line instead of failing in the allocator or under the OOM killer.
"""

from __future__ import annotations

import functools
import os

import torch

from .config import ConfigError


@functools.cache  # asked at every explicit attention call: the answer does not change
def device_memory(device: torch.device) -> int | None:
    """Bytes of memory `device` has in all (None where that cannot be known, e.g. "meta")."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
            return None
    return None


def check_fits(num_bytes: int, device: torch.device, what: str) -> None:
    """Refuse an allocation larger than all of `device`'s memory, in one line starting with `what`.

    Such an allocation can never succeed; asking for it anyway fails with a long allocator
    message, or, where the kernel overcommits memory, gets the process killed part way.

    Raises:
        ConfigError: `num_bytes` exceeds the device's memory.
    """
    total = device_memory(device)
    if total is not None and num_bytes > total:
        raise ConfigError(
            f"{what} needs {_size(num_bytes)}, more than this machine's {device.type} memory ({_size(total)})"
        )


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e9:,.1f} GB" if num_bytes >= 1e8 else f"{num_bytes / 1e6:,.1f} MB"
