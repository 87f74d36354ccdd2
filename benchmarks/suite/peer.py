"""The reference GPT of "Build a Large Language Model (From Scratch)", if it is installed.

Its rows are skipped when it is not; the note saying so is logged once per process, since the
loaders are cached.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from types import ModuleType

log = logging.getLogger(__name__)

PEER_PACKAGE = "llms-from-scratch"
PEER_INSTALL = "pip install --no-deps llms-from-scratch"


@functools.cache
def load_peer() -> ModuleType | None:
    """The peer's ch04 module (GPTModel, GPTModelFast, generate_text_simple), or None."""
    try:
        from llms_from_scratch import ch04
    except ImportError as error:
        log.info(
            f"NOTE: {PEER_PACKAGE} is not installed ({error}); install it with: {PEER_INSTALL}. "
            "Its rows are skipped."
        )
        return None
    return ch04


def require_peer() -> ModuleType:
    """The peer's ch04 module; RuntimeError if it is not installed."""
    peer = load_peer()
    if peer is None:
        raise RuntimeError(f"{PEER_PACKAGE} is not installed ({PEER_INSTALL})")
    return peer


@functools.cache
def load_peer_kv() -> tuple[ModuleType, ModuleType] | None:
    """The peer's GPT-2 with a KV cache and its cache utilities (``llms_from_scratch.kv_cache``)."""
    if load_peer() is None:
        return None
    try:
        from llms_from_scratch.kv_cache import gpt2, utils
    except ImportError as error:
        log.info(f"NOTE: the peer's kv_cache module is missing ({error}); its row is skipped.")
        return None
    return gpt2, utils


def peer_version() -> str:
    try:
        return importlib.metadata.version(PEER_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
