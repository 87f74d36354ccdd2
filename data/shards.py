"""Writing a token stream into fixed-size shard files, resumably, and one preparer per folder.

A shard is written under a temporary name, flushed to disk and renamed when it holds
``shard_tokens`` tokens; only then does ``progress.json`` (written atomically) move past it. The
progress says where in the corpus the next shard starts: after ``documents`` whole documents and
``skip_tokens`` tokens of the next one, since a document's tokens may straddle two shards. An
interrupted preparation therefore resumes after its last finished shard, and a half-written shard
is never mistaken for a finished one.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from minigpt.common import atomic_write

PROGRESS_FILE = "progress.json"


def raw_shard(folder: Path, index: int) -> Path:
    """The ``index``-th shard as the corpus encoder wrote it."""
    return folder / f"raw-{index:05d}.bin"


@dataclass
class Progress:
    """How far a preparation got; saved after every finished shard."""

    shard_tokens: list[int] = field(default_factory=list)
    """Tokens in each finished shard."""
    documents: int = 0
    """Documents whose tokens all lie in finished shards."""
    skip_tokens: int = 0
    """Tokens of the next document (its end-of-text included) already in finished shards."""
    text_bytes: int = 0
    """UTF-8 bytes of those ``documents`` (of every document read, once complete)."""
    complete: bool = False
    """The corpus (or the budget) is exhausted and every shard is finished."""
    tokenizer: dict[str, Any] | None = None
    """The final tokenizer's spec, once the vocabulary has been read off the shards."""

    @property
    def tokens(self) -> int:
        return sum(self.shard_tokens)

    @classmethod
    def load(cls, folder: Path) -> Progress:
        """The saved progress of ``folder``; a fresh start when there is none."""
        path = folder / PROGRESS_FILE
        return cls(**json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else cls()

    def save(self, folder: Path) -> None:
        with atomic_write(folder / PROGRESS_FILE) as tmp:
            tmp.write_text(json.dumps(asdict(self)) + "\n", encoding="utf-8")


class ShardWriter:
    """Appends token ids to ``raw-NNNNN.bin`` files of ``shard_tokens`` tokens each in ``folder``."""

    def __init__(self, folder: Path, dtype: np.dtype, shard_tokens: int, progress: Progress) -> None:
        self.folder = folder
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.progress = progress
        self._file: BinaryIO | None = None
        self._in_shard = 0
        self._stream_end = progress.tokens  # stream position of the end of the written tokens
        self._bytes_end = progress.text_bytes
        self._documents_end = progress.documents

    def _open(self) -> BinaryIO:
        if self._file is None:
            self._file = open(self._partial(), "wb")  # truncates what a killed run left
            self._in_shard = 0
        return self._file

    def _partial(self) -> Path:
        return raw_shard(self.folder, len(self.progress.shard_tokens)).with_suffix(".bin.tmp")

    def write_tokens(self, file: BinaryIO, tokens: np.ndarray) -> None:
        """Append ``tokens`` to the open shard file (a seam for tests that fill the disk)."""
        file.write(tokens.astype(self.dtype, copy=False).tobytes())

    def add(self, tokens: np.ndarray, ends: np.ndarray, byte_ends: np.ndarray, first_document: int) -> None:
        """Append one batch of documents.

        Args:
            tokens: The batch's token ids, every document's (with its end-of-text) back to back.
            ends: ``(documents,)`` stream position where each document's tokens end.
            byte_ends: ``(documents,)`` bytes of text read up to the end of each document.
            first_document: Index in the corpus of the batch's first document.
        """
        start_bytes = self._bytes_end
        self._documents_end = first_document + len(ends)
        self._bytes_end = int(byte_ends[-1]) if len(byte_ends) else start_bytes
        start = self._stream_end
        self._stream_end += len(tokens)
        done = 0
        while done < len(tokens):
            file = self._open()
            take = min(self.shard_tokens - self._in_shard, len(tokens) - done)
            self.write_tokens(file, tokens[done : done + take])
            done += take
            self._in_shard += take
            if self._in_shard == self.shard_tokens:
                position = start + done
                finished = int(np.searchsorted(ends, position, side="right"))  # documents ending by here
                next_start = int(ends[finished - 1]) if finished else start  # where the next one begins
                self.progress.text_bytes = int(byte_ends[finished - 1]) if finished else start_bytes
                self._finish_shard(first_document + finished, position - next_start)

    def _finish_shard(self, documents: int, skip_tokens: int) -> None:
        file = self._file
        assert file is not None
        file.flush()
        os.fsync(file.fileno())
        file.close()
        self._file = None
        os.replace(self._partial(), raw_shard(self.folder, len(self.progress.shard_tokens)))
        self.progress.shard_tokens.append(self._in_shard)
        self.progress.documents, self.progress.skip_tokens = documents, skip_tokens
        self.progress.save(self.folder)

    def close(self) -> None:
        """Finish the last, shorter shard and mark the stream complete."""
        if self._file is not None and self._in_shard:
            self._finish_shard(self.progress.documents, self.progress.skip_tokens)
        self.abort()
        self.progress.text_bytes, self.progress.documents = self._bytes_end, self._documents_end
        self.progress.complete = True
        self.progress.save(self.folder)

    def abort(self) -> None:
        """Drop the unfinished shard, if any: it is never published."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._partial().unlink(missing_ok=True)


def iter_chunks(path: Path, dtype: str | np.dtype, chunk: int = 1 << 24) -> Iterator[np.ndarray]:
    """A token file's ids in pieces of ``chunk`` tokens, read through a memory map."""
    tokens = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)
    for begin in range(0, len(tokens), chunk):
        yield np.asarray(tokens[begin : begin + chunk])


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created if needed): a second process that asks for
    it waits until the first is done, so two processes never prepare the same folder at once."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
