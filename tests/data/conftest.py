"""Fixtures shared by the data tests."""

from __future__ import annotations

import base64
import hashlib
import itertools
import socket
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tiktoken

from minigpt.data import gpt2_encoding as gpt2_encoding_module


@pytest.fixture(scope="session")
def ranks_bytes(gpt2_encoding: tiktoken.Encoding) -> bytes:
    """The exact bytes of r50k_base.tiktoken, rebuilt from the loaded ranks whichever route loaded them."""
    ranks = sorted(gpt2_encoding._mergeable_ranks.items(), key=lambda item: item[1])
    return b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n" for token, rank in ranks)


STAND_IN_TOKENS = [bytes([b]) for b in range(256)] + [
    bytes(pair) for pair in itertools.islice(itertools.product(range(256), repeat=2), 50_000)
]
"""GPT-2's vocabulary size in r50k_base.tiktoken's format, but not GPT-2's tokens: the 256 bytes,
then the first 50,000 byte pairs in order (b"He" is rank 256 + 72 * 256 + 101)."""


@pytest.fixture
def stand_in_ranks(monkeypatch: pytest.MonkeyPatch) -> bytes:
    """A ranks file load_gpt2_encoding accepts as GPT-2's (its expected sha256 is patched to this
    file's), so the routes can be tested on any machine without OpenAI's file."""
    data = b"".join(base64.b64encode(token) + b" %d\n" % rank for rank, token in enumerate(STAND_IN_TOKENS))
    monkeypatch.setattr(gpt2_encoding_module, "R50K_SHA256", hashlib.sha256(data).hexdigest())
    return data


@dataclass
class Offline:
    """The cache folder load_gpt2_encoding reads, and the network routes it tried, in order."""

    cache: Path
    tried: list[str] = field(default_factory=list)


@pytest.fixture
def offline_gpt2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Offline:
    """An empty cache folder; tiktoken's and the package-index routes fail and are recorded, and
    no socket can connect, so a test shows which routes were tried and that none reached the network."""
    offline = Offline(tmp_path / "cache")
    monkeypatch.setenv("MINIGPT_CACHE", str(offline.cache))

    def route(name: str):
        def no_network(*args: object, **kwargs: object) -> None:
            offline.tried.append(name)
            raise ConnectionError("network disabled in this test")

        return no_network

    def refuse(*args: object, **kwargs: object) -> None:
        offline.tried.append(f"socket to {args[1:]}")
        raise ConnectionError("network disabled in this test")

    monkeypatch.setattr(tiktoken, "get_encoding", route("tiktoken"))
    monkeypatch.setattr(gpt2_encoding_module, "_fetch_ranks_from_registry", route("registry"))
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return offline


@pytest.fixture
def data_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh folder for prepared data; the working directory moves there so nothing lands in the repo."""
    monkeypatch.chdir(tmp_path)
    return tmp_path / "data_cache"
