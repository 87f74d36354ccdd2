"""The hub probe answers at once for a closed port and for offline mode, and says yes to a server
that answers; offline mode makes huggingface_hub and datasets fail at once, and ends with its block."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import datasets
import huggingface_hub.constants
import pytest

from minigpt.common import hub

CLOSED = "http://127.0.0.1:9"
"""Nothing listens on the discard port: a connection is refused at once."""


@pytest.fixture
def answering_server() -> Iterator[str]:
    class NotFound(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # any status is an answer
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_a_closed_port_is_unreachable_at_once() -> None:
    start = time.perf_counter()
    reason = hub.probe_hub(CLOSED, timeout=5.0)
    assert reason == f"the Hugging Face hub ({CLOSED}) cannot be reached"
    assert time.perf_counter() - start < 2.0


def test_a_server_that_answers_is_reachable(answering_server: str) -> None:
    assert hub.probe_hub(answering_server) is None


def test_offline_mode_is_unreachable_without_asking(
    answering_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert hub.probe_hub(answering_server) == "HF_HUB_OFFLINE is set"


def test_offline_mode_fails_a_hub_dataset_at_once_and_ends_with_its_block(tmp_path) -> None:
    before = huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    start = time.perf_counter()
    with hub.hub_offline(), pytest.raises(ConnectionError, match="minigpt-tests/absent"):
        datasets.load_dataset("minigpt-tests/absent", cache_dir=str(tmp_path))
    assert time.perf_counter() - start < 2.0  # no request, so no retries
    assert (huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE) == before
