"""Every route of load_gpt2_encoding, offline, and which of the suite's tests this machine runs.

Stand-in ranks (see conftest.py) take each route, in order, on any machine and without the network;
GPT-2's own ranks, where they can be had, check the real file through the same offline routes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tiktoken

from minigpt.data import DataError, load_gpt2_encoding
from minigpt.data import gpt2_encoding as module
from minigpt.data.cache import cache_dir

from ..conftest import gpt2_ranks_unobtainable
from ..training.conftest import REPO
from .conftest import Offline

STAND_IN_HE = 256 + 72 * 256 + 101
"""The id of b"He" in the stand-in ranks (GPT-2's is 1544)."""


def is_stand_in(encoding: tiktoken.Encoding) -> bool:
    """Whether `encoding` was built from the stand-in ranks, with GPT-2's vocabulary size and end-of-text."""
    return (
        encoding.encode_single_token(b"He") == STAND_IN_HE
        and (encoding.n_vocab, encoding.eot_token) == (50257, 50256)
        and encoding.decode(encoding.encode_ordinary("Hello world")) == "Hello world"
    )


def serve_from_registry(offline: Offline, monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    """The package-index route answers with `data` (and is recorded as tried)."""

    def fetch() -> bytes:
        offline.tried.append("registry")
        return data

    monkeypatch.setattr(module, "_fetch_ranks_from_registry", fetch)


def test_a_verified_cached_copy_is_used_without_the_network(
    offline_gpt2: Offline, stand_in_ranks: bytes
) -> None:
    offline_gpt2.cache.mkdir()
    (offline_gpt2.cache / module.CACHE_FILE_NAME).write_bytes(stand_in_ranks)
    assert is_stand_in(load_gpt2_encoding())
    assert offline_gpt2.tried == []


def test_a_users_file_comes_first_and_is_used_in_place(
    offline_gpt2: Offline, stand_in_ranks: bytes, tmp_path: Path
) -> None:
    path = tmp_path / "ranks.tiktoken"
    path.write_bytes(stand_in_ranks)
    offline_gpt2.cache.mkdir()
    (offline_gpt2.cache / module.CACHE_FILE_NAME).write_bytes(b"a corrupt cached copy")
    assert is_stand_in(load_gpt2_encoding(str(path)))
    assert offline_gpt2.tried == []
    # Not copied into the cache, and the cache not even looked at (it would have been replaced).
    assert [p.read_bytes() for p in offline_gpt2.cache.iterdir()] == [b"a corrupt cached copy"]


def test_a_users_file_with_another_hash_is_refused_in_one_line(
    offline_gpt2: Offline, stand_in_ranks: bytes, tmp_path: Path
) -> None:
    path = tmp_path / "ranks.tiktoken"
    path.write_bytes(stand_in_ranks.replace(b" 300\n", b" 301\n"))
    offline_gpt2.cache.mkdir()
    (offline_gpt2.cache / module.CACHE_FILE_NAME).write_bytes(stand_in_ranks)
    with pytest.raises(DataError) as info:
        load_gpt2_encoding(str(path))  # the file asked for, not the good copy in the cache
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path} is not GPT-2's r50k_base.tiktoken: its sha256 is ")
    assert message.endswith(f", expected {module.R50K_SHA256}")
    assert offline_gpt2.tried == []


def test_a_missing_users_file_is_refused(offline_gpt2: Offline, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_gpt2_encoding(str(tmp_path / "nope.tiktoken"))
    assert offline_gpt2.tried == []


def test_without_a_cached_copy_tiktoken_then_the_index_are_tried_and_the_index_fills_the_cache(
    offline_gpt2: Offline, stand_in_ranks: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_from_registry(offline_gpt2, monkeypatch, stand_in_ranks)
    assert is_stand_in(load_gpt2_encoding())
    assert offline_gpt2.tried == ["tiktoken", "registry"]
    assert [p.name for p in offline_gpt2.cache.iterdir()] == [module.CACHE_FILE_NAME]  # no temporary files
    assert (offline_gpt2.cache / module.CACHE_FILE_NAME).read_bytes() == stand_in_ranks
    offline_gpt2.tried.clear()
    assert is_stand_in(load_gpt2_encoding())  # from the cache now
    assert offline_gpt2.tried == []


def test_a_corrupt_cached_copy_is_ignored_and_replaced(
    offline_gpt2: Offline,
    stand_in_ranks: bytes,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    offline_gpt2.cache.mkdir()
    (offline_gpt2.cache / module.CACHE_FILE_NAME).write_bytes(b"garbage")
    serve_from_registry(offline_gpt2, monkeypatch, stand_in_ranks)
    with caplog.at_level(logging.WARNING):
        assert is_stand_in(load_gpt2_encoding())
    assert "ignoring corrupt cached GPT-2 ranks" in caplog.text
    assert offline_gpt2.tried == ["tiktoken", "registry"]
    assert (offline_gpt2.cache / module.CACHE_FILE_NAME).read_bytes() == stand_in_ranks


def test_tiktoken_answering_ends_the_search(offline_gpt2: Offline, monkeypatch: pytest.MonkeyPatch) -> None:
    answer = object()

    def get_encoding(name: str) -> object:
        offline_gpt2.tried.append(f"tiktoken {name}")
        return answer

    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
    assert load_gpt2_encoding() is answer
    assert offline_gpt2.tried == ["tiktoken gpt2"]
    assert not offline_gpt2.cache.exists()  # tiktoken keeps its own cache


def test_all_routes_failing_names_each_in_order_and_the_fix(
    offline_gpt2: Offline, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_from_registry(offline_gpt2, monkeypatch, b"not the ranks")
    with pytest.raises(DataError) as info:
        load_gpt2_encoding()
    message = str(info.value)
    assert "\n" not in message
    parts = ["no cached copy", "tiktoken.get_encoding('gpt2') failed", "openai-whisper", "tokenizer_path"]
    assert [message.find(part) for part in parts] == sorted(message.find(part) for part in parts)
    assert all(part in message for part in parts)
    assert offline_gpt2.tried == ["tiktoken", "registry"]
    assert not (offline_gpt2.cache / module.CACHE_FILE_NAME).exists()  # a wrong file is never cached


def test_hanging_tiktoken_is_abandoned(
    offline_gpt2: Offline, stand_in_ranks: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: release.wait(30))
    monkeypatch.setattr(module, "GET_ENCODING_TIMEOUT_S", 0.2)
    serve_from_registry(offline_gpt2, monkeypatch, stand_in_ranks)
    start = time.perf_counter()
    try:
        assert is_stand_in(load_gpt2_encoding())
        assert time.perf_counter() - start < 5
    finally:
        release.set()  # let the abandoned thread finish


def test_gpt2s_own_ranks_load_offline(offline_gpt2: Offline, ranks_bytes: bytes, tmp_path: Path) -> None:
    path = tmp_path / module.CACHE_FILE_NAME
    path.write_bytes(ranks_bytes)
    assert load_gpt2_encoding(str(path)).encode_ordinary("Hello world") == [15496, 995]
    assert not offline_gpt2.cache.exists()
    offline_gpt2.cache.mkdir()
    (offline_gpt2.cache / module.CACHE_FILE_NAME).write_bytes(ranks_bytes)
    encoding = load_gpt2_encoding()
    assert encoding.encode_ordinary("Hello world") == [15496, 995]
    assert (encoding.n_vocab, encoding.eot_token) == (50257, 50256)
    assert offline_gpt2.tried == []


def test_the_ranks_tests_skip_only_where_the_ranks_cannot_be_had(
    stand_in_ranks: bytes, tmp_path: Path
) -> None:
    refused = "the package index http://127.0.0.1:9/simple/ cannot be reached (refused)"
    assert gpt2_ranks_unobtainable(tmp_path, lambda: None) is None  # fetched from the index
    reason = f"needs GPT-2's BPE ranks: no verified copy in {tmp_path}, and {refused}"
    assert gpt2_ranks_unobtainable(tmp_path, lambda: refused) == reason
    (tmp_path / module.CACHE_FILE_NAME).write_bytes(stand_in_ranks + b"\n")
    assert gpt2_ranks_unobtainable(tmp_path, lambda: refused) == reason
    (tmp_path / module.CACHE_FILE_NAME).write_bytes(stand_in_ranks)
    assert gpt2_ranks_unobtainable(tmp_path, lambda: refused) is None


@pytest.mark.slow
def test_the_ranks_tests_run_offline_where_the_ranks_are_cached(ranks_bytes: bytes, tmp_path: Path) -> None:
    """The suite, its package index unreachable, runs a test that needs GPT-2's ranks when the
    user's cache holds them."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / module.CACHE_FILE_NAME).write_bytes(ranks_bytes)
    test = f"{Path(__file__).resolve()}::{test_gpt2s_own_ranks_load_offline.__name__}"
    command = [sys.executable, "-m", "pytest", test, "-rs", "-n", "0", "-p", "no:cacheprovider"]
    command += ["--basetemp", str(tmp_path / "tmp")]
    # The discard port refuses at once.
    env = {**os.environ, "MINIGPT_CACHE": str(cache), "PIP_INDEX_URL": "http://127.0.0.1:9/simple/"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert "1 passed" in result.stdout, result.stdout + result.stderr


def test_the_suite_caches_in_a_folder_of_its_own(
    private_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """What a test (or a process it starts) downloads, writes or deletes never reaches the user's cache."""
    assert os.environ["MINIGPT_CACHE"] == str(private_cache)
    assert cache_dir() == private_cache and private_cache.is_relative_to(tmp_path_factory.getbasetemp())


@pytest.mark.slow
@pytest.mark.network
def test_ranks_file_in_whisper_source_package() -> None:
    """The real download: the source package still carries the exact ranks file."""
    data = module._fetch_ranks_from_registry()
    assert module.encoding_from_ranks(data, "download").encode_ordinary("Hello world") == [15496, 995]
