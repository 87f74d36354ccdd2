"""Every route of load_gpt2_encoding, with the network routes replaced where a test needs them gone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import tiktoken

from minigpt.common import sha256_file
from minigpt.data import DataError, load_gpt2_encoding
from minigpt.data import gpt2_encoding as module


def test_explicit_path_works_offline(offline_gpt2: Path, ranks_bytes: bytes, tmp_path: Path) -> None:
    path = tmp_path / "ranks.tiktoken"
    path.write_bytes(ranks_bytes)
    encoding = load_gpt2_encoding(str(path))
    assert encoding.encode_ordinary("Hello world") == [15496, 995]
    assert encoding.n_vocab == 50257 and encoding.eot_token == 50256
    assert not offline_gpt2.exists()  # an explicit file is used in place, not copied


def test_corrupted_path_is_rejected(offline_gpt2: Path, ranks_bytes: bytes, tmp_path: Path) -> None:
    path = tmp_path / "ranks.tiktoken"
    path.write_bytes(ranks_bytes.replace(b" 15496\n", b" 15497\n"))
    with pytest.raises(DataError, match="is not GPT-2's r50k_base.tiktoken: its sha256 is"):
        load_gpt2_encoding(str(path))


def test_missing_path_is_rejected(offline_gpt2: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_gpt2_encoding(str(tmp_path / "nope.tiktoken"))


def test_cache_route(offline_gpt2: Path, ranks_bytes: bytes) -> None:
    offline_gpt2.mkdir()
    (offline_gpt2 / "r50k_base.tiktoken").write_bytes(ranks_bytes)
    assert load_gpt2_encoding().encode_ordinary("Hello world") == [15496, 995]


def test_registry_route_fills_the_cache(
    offline_gpt2: Path, ranks_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A corrupt cached copy is ignored and replaced.
    offline_gpt2.mkdir()
    (offline_gpt2 / "r50k_base.tiktoken").write_bytes(b"garbage")
    monkeypatch.setattr(module, "_fetch_ranks_from_registry", lambda: ranks_bytes)
    assert load_gpt2_encoding().encode_ordinary("Hello world") == [15496, 995]
    assert sha256_file(offline_gpt2 / "r50k_base.tiktoken") == module.R50K_SHA256
    assert [p.name for p in offline_gpt2.iterdir()] == ["r50k_base.tiktoken"]  # no temporary files left


def test_all_routes_failing_names_each_and_the_fix(
    offline_gpt2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(module, "_fetch_ranks_from_registry", lambda: b"not the ranks")
    with pytest.raises(DataError) as info:
        load_gpt2_encoding()
    message = str(info.value)
    assert "\n" not in message
    for part in (
        "no cached copy",
        "tiktoken.get_encoding('gpt2') failed",
        "openai-whisper",
        "tokenizer_path",
    ):
        assert part in message
    assert not (offline_gpt2 / "r50k_base.tiktoken").exists()  # a wrong file is never cached


def test_hanging_tiktoken_is_abandoned(
    offline_gpt2: Path, ranks_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: release.wait(30))
    monkeypatch.setattr(module, "GET_ENCODING_TIMEOUT_S", 0.2)
    monkeypatch.setattr(module, "_fetch_ranks_from_registry", lambda: ranks_bytes)
    start = time.perf_counter()
    try:
        assert load_gpt2_encoding().eot_token == 50256
        assert time.perf_counter() - start < 5
    finally:
        release.set()  # let the abandoned thread finish


@pytest.mark.slow
@pytest.mark.network
def test_ranks_file_in_whisper_source_package() -> None:
    """The real download: the source package still carries the exact ranks file."""
    data = module._fetch_ranks_from_registry()
    assert module.encoding_from_ranks(data, "download").encode_ordinary("Hello world") == [15496, 995]
