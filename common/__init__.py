"""Small helpers every other package uses: atomic file writes, file hashing, error and duration
text, the cores this process may use.

Imports nothing from the rest of minigpt, so `model/`, `data/` and the rest can all depend on it.
"""

from .errors import UsageError, one_line
from .files import atomic_write, sha256_file
from .machine import available_cores
from .settings import data_settings
from .text import duration

__all__ = [
    "UsageError",
    "atomic_write",
    "available_cores",
    "data_settings",
    "duration",
    "one_line",
    "sha256_file",
]
