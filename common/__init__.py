"""Small helpers every other package uses: atomic file writes and why a write failed, file
hashing, error, duration and size text, the cores this process may use.

Imports nothing from the rest of minigpt, so `model/`, `data/` and the rest can all depend on it.
"""

from .errors import UsageError, one_line
from .files import WRITE_FAILURES, atomic_write, free_space, sha256_file, write_failure
from .machine import available_cores
from .settings import data_settings
from .text import byte_size, duration

__all__ = [
    "WRITE_FAILURES",
    "UsageError",
    "atomic_write",
    "available_cores",
    "byte_size",
    "data_settings",
    "duration",
    "free_space",
    "one_line",
    "sha256_file",
    "write_failure",
]
