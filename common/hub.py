"""The Hugging Face hub from a machine that may not reach it: a quick probe, and offline mode.

huggingface_hub and datasets retry a hub they cannot reach (`Retrying in 8s`, half a minute and
more) before they fail. Asked first with a short deadline, the hub's silence lets a command either
read what the cache already holds at once (offline mode) or stop in one line saying what to
download. Online nothing changes but one HEAD request.

Offline mode is switched by the module constants both libraries read at call time
(`huggingface_hub.constants.HF_HUB_OFFLINE`, `datasets.config.HF_HUB_OFFLINE`; tested with
huggingface_hub 2.4 and datasets 5.2): the environment variables are read once, at their import.
tests/common/test_hub.py fails when either stops obeying them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

PROBE_SECONDS = 2.0
"""How long the hub may take to answer one request before it counts as unreachable."""


def probe_hub(endpoint: str | None = None, timeout: float = PROBE_SECONDS) -> str | None:
    """Why the hub cannot be used, or None when it answers a HEAD request within `timeout` seconds.

    The request goes through huggingface_hub's own client, so its proxies and certificates apply;
    a thread bounds it, since a name lookup may hang past any socket timeout.

    Args:
        endpoint: The hub's address (default: huggingface_hub's, `$HF_ENDPOINT` or huggingface.co).
        timeout: Seconds to wait for any answer.
    """
    import huggingface_hub.constants
    from huggingface_hub import get_session

    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    url = endpoint or huggingface_hub.constants.ENDPOINT
    answered: list[bool] = []
    done = threading.Event()

    def ask() -> None:
        try:
            get_session().head(url, timeout=timeout)  # any status is an answer
            answered.append(True)
        except Exception:
            pass
        finally:
            done.set()

    threading.Thread(target=ask, name="hub-probe", daemon=True).start()
    done.wait(timeout)
    return None if answered else f"the Hugging Face hub ({url}) cannot be reached"


@functools.cache
def hub_unreachable() -> str | None:
    """`probe_hub()`, asked once per process: every later question gets the same answer, so a
    command that loads several things from the hub waits for the probe once."""
    return probe_hub()


@contextmanager
def hub_offline() -> Iterator[None]:
    """huggingface_hub and datasets in offline mode inside the block: what their caches hold
    loads, anything else fails at once instead of being retried."""
    import datasets
    import huggingface_hub.constants

    saved = huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    huggingface_hub.constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved
