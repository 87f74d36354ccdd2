"""Loading GPT-2's byte-pair encoding without depending on any one download route.

tiktoken normally fetches GPT-2's merge ranks from the internet on first use. Air-gapped and
firewalled machines cannot, so :func:`load_gpt2_encoding` tries, in order: a file the user points
at, our own hash-verified cached copy, tiktoken's usual route, and finally the identical ranks file
that ships inside the ``openai-whisper`` source distribution on the Python package index.
"""

from __future__ import annotations

import binascii
import hashlib
import logging
import tarfile
import tempfile
import threading
from pathlib import Path

import tiktoken

from minigpt.common import atomic_write, one_line

from .cache import cache_dir, pip_download
from .errors import DataError

logger = logging.getLogger(__name__)

# The parameters below are those of tiktoken's ``r50k_base`` encoding, which is GPT-2's tokenizer.
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pre-tokenizer regex, written without possessive quantifiers so that every tiktoken the
# project supports compiles it; newer tiktoken spells it with them, which only makes it faster.
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"
ENDOFTEXT_ID = 50256
N_VOCAB = 50257

CACHE_FILE_NAME = "r50k_base.tiktoken"
WHISPER_REQUIREMENT = "openai-whisper==20250625"
WHISPER_MEMBER_SUFFIX = "whisper/assets/gpt2.tiktoken"
GET_ENCODING_TIMEOUT_S = 20.0
PIP_TIMEOUT_S = 300.0


def encoding_from_ranks(data: bytes, origin: str) -> tiktoken.Encoding:
    """Build GPT-2's :class:`tiktoken.Encoding` from the bytes of an ``r50k_base.tiktoken`` file.

    Args:
        data: The file's bytes; each line is ``<base64 token> <rank>``.
        origin: Where the bytes came from, for the error message.

    Raises:
        DataError: The bytes are not the known ranks file (sha256 mismatch).
    """
    digest = hashlib.sha256(data).hexdigest()
    if digest != R50K_SHA256:
        raise DataError(
            f"{origin} is not GPT-2's r50k_base.tiktoken: its sha256 is {digest}, expected {R50K_SHA256}"
        )
    # Parsed here rather than with tiktoken.load.load_tiktoken_bpe, which copies every local file
    # into tiktoken's own cache folder. The hash check above guarantees the format.
    ranks = {binascii.a2b_base64(token): int(rank) for token, rank in map(bytes.split, data.splitlines())}
    return tiktoken.Encoding(
        name="r50k_base",
        pat_str=R50K_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: ENDOFTEXT_ID},
        explicit_n_vocab=N_VOCAB,
    )


def _from_tiktoken(timeout: float) -> tiktoken.Encoding:
    """tiktoken's own route, bounded in time: its HTTP request has no timeout and can hang offline."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["encoding"] = tiktoken.get_encoding("gpt2")
        except BaseException as error:  # reported to the caller below
            outcome["error"] = error

    # A daemon thread: if the request hangs we give up on it and it cannot keep the process alive.
    thread = threading.Thread(target=target, name="tiktoken-get-encoding", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout:.0f} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["encoding"]  # type: ignore[return-value]


def _fetch_ranks_from_registry(timeout: float = PIP_TIMEOUT_S) -> bytes:
    """Download the openai-whisper source distribution with pip and return its GPT-2 ranks file."""
    with tempfile.TemporaryDirectory(prefix="minigpt-whisper-") as tmp:
        archive = pip_download(WHISPER_REQUIREMENT, Path(tmp), sdist=True, timeout=timeout)
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.endswith(WHISPER_MEMBER_SUFFIX):
                    extracted = tar.extractfile(member)
                    if extracted is not None:
                        return extracted.read()
    raise DataError(f"{archive.name} has no {WHISPER_MEMBER_SUFFIX}")


def load_gpt2_encoding(path: str | None = None) -> tiktoken.Encoding:
    """GPT-2's tokenizer (tiktoken ``r50k_base``: 50257 tokens, ``<|endoftext|>`` = 50256).

    Sources, in order:

    1. ``path``, when given: the file must exist and match the known sha256, or this raises at once.
    2. ``<cache>/r50k_base.tiktoken`` (see :func:`minigpt.data.cache.cache_dir`), if its hash matches.
    3. ``tiktoken.get_encoding("gpt2")``: works online or when tiktoken's own cache has the files;
       abandoned after 20 s so a silently dropped connection cannot hang training.
    4. pip: the ``openai-whisper`` source distribution carries the same file; it is extracted,
       hash-checked and stored atomically in our cache, so this happens once per machine.

    Raises:
        DataError: ``path`` is missing or wrong, or every route failed (the message lists why).
    """
    if path is not None:
        ranks_path = Path(path).expanduser()
        if not ranks_path.is_file():
            raise DataError(f"tokenizer_path {ranks_path} does not exist or is not a file")
        return encoding_from_ranks(ranks_path.read_bytes(), str(ranks_path))

    failures = []
    cached = cache_dir() / CACHE_FILE_NAME
    if cached.is_file():
        try:
            return encoding_from_ranks(cached.read_bytes(), str(cached))
        except DataError as error:
            logger.warning("ignoring corrupt cached GPT-2 ranks: %s", error)
            failures.append(f"cached copy {cached} is corrupt")
    else:
        failures.append(f"no cached copy at {cached}")

    try:
        return _from_tiktoken(GET_ENCODING_TIMEOUT_S)
    except Exception as error:
        failures.append(f"tiktoken.get_encoding('gpt2') failed ({one_line(error, with_type=True)})")

    try:
        data = _fetch_ranks_from_registry()
        encoding = encoding_from_ranks(data, f"the ranks file in {WHISPER_REQUIREMENT}")
    except DataError as error:
        failures.append(str(error))
    except Exception as error:
        failures.append(f"pip download {WHISPER_REQUIREMENT} failed ({one_line(error, with_type=True)})")
    else:
        try:
            with atomic_write(cached) as tmp:
                tmp.write_bytes(data)
        except OSError as error:  # a read-only cache costs a download next time, nothing more
            logger.warning("could not cache GPT-2 ranks in %s: %s", cached, error)
        else:
            logger.info("fetched GPT-2 ranks from the %s source package into %s", WHISPER_REQUIREMENT, cached)
        return encoding

    raise DataError(
        "could not load the GPT-2 tokenizer: "
        + "; ".join(failures)
        + f". Fix: copy r50k_base.tiktoken (sha256 {R50K_SHA256}) to this machine and pass its path as"
        " data.tokenizer_path, or use tokenizer=char"
    )
