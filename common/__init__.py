"""Small helpers every other package uses: atomic file writes and a one-line error for a write
that failed, file hashing, error, duration and size text, the cores this process may use.

Imports nothing from the rest of minigpt, so `model/`, `data/` and the rest can all depend on it.
"""

from .errors import UsageError, one_line
from .files import (
    WRITE_FAILURES,
    WriteError,
    another_folder_with,
    appending,
    atomic_write,
    free_space,
    reporting_write_failures,
    safe_write,
    sha256_file,
    write_failure,
)
from .machine import available_cores
from .settings import data_settings
from .text import byte_size, duration, short_count

__all__ = [
    "WRITE_FAILURES",
    "UsageError",
    "WriteError",
    "another_folder_with",
    "appending",
    "atomic_write",
    "available_cores",
    "byte_size",
    "data_settings",
    "duration",
    "short_count",
    "free_space",
    "one_line",
    "reporting_write_failures",
    "safe_write",
    "sha256_file",
    "write_failure",
]
