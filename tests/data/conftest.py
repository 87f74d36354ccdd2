"""Fixtures shared by the data tests."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import tiktoken


@pytest.fixture(scope="session")
def ranks_bytes(gpt2_encoding: tiktoken.Encoding) -> bytes:
    """The exact bytes of r50k_base.tiktoken, rebuilt from the loaded ranks whichever route loaded them."""
    ranks = sorted(gpt2_encoding._mergeable_ranks.items(), key=lambda item: item[1])
    return b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n" for token, rank in ranks)


@pytest.fixture
def offline_gpt2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache folder, and tiktoken's and the package-index routes made to fail."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MINIGPT_CACHE", str(cache))

    def no_network(*args: object, **kwargs: object) -> None:
        raise ConnectionError("network disabled in this test")

    monkeypatch.setattr(tiktoken, "get_encoding", no_network)
    monkeypatch.setattr("minigpt.data.gpt2_encoding._fetch_ranks_from_registry", no_network)
    return cache


@pytest.fixture
def data_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh folder for prepared data; the working directory moves there so nothing lands in the repo."""
    monkeypatch.chdir(tmp_path)
    return tmp_path / "data_cache"
