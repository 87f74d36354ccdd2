"""Writing files so that a crash never leaves a half-written one, saying why a write failed, and
hashing files of any size."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write `path`'s new contents to; publish it when the block ends.

    The temporary file sits beside `path` (same filesystem). When the block finishes, the file is
    flushed to disk and renamed over `path`, so readers see the old file or the complete new one,
    never a truncated one, even if the process is killed or the machine loses power mid-write. If
    the block raises, the temporary file is removed and `path` is untouched.

        with atomic_write("model.safetensors") as tmp:
            save_file(tensors, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # the writer may have replaced the file: sync what is there now
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes files private; caches and runs may be shared by a team
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


WRITE_FAILURES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only filesystem",
}
"""Why a write failed, by errno, for the failures a user fixes (a full disk, a folder not theirs)."""


def write_failure(error: BaseException) -> OSError | None:
    """The OSError of one of WRITE_FAILURES' kinds behind `error`: `error` itself, or one it was
    raised from or while handling (torch's zip writer raises a RuntimeError over the OSError of the
    file it writes to); None if there is none."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in WRITE_FAILURES:
            return current
        current = current.__cause__ or current.__context__
    return None


def free_space(path: str | Path) -> int | None:
    """Bytes free on the filesystem that holds `path` (or its nearest existing folder); None where
    the system does not say."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def sha256_file(
    path: str | Path, inspect: Callable[[bytes], None] | None = None, chunk_size: int = 1 << 22
) -> str:
    """Hex sha256 of a file, read in chunks so that large corpora never sit in memory whole.

    Args:
        path: The file.
        inspect: Called with every chunk in order, then once with `b""` at the end of the file,
            so a caller can check the bytes (e.g. that they are UTF-8) in the same single read.
        chunk_size: Bytes per read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
            if inspect is not None:
                inspect(chunk)
    if inspect is not None:
        inspect(b"")
    return digest.hexdigest()
