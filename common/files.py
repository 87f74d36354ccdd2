"""Writing files so that a crash never leaves a half-written one, saying in one line why a write
failed and what to do, and hashing files of any size."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import UsageError
from .text import byte_size


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
    file it writes to), or one a library written in Rust names in its message (safetensors says
    "I/O error: ... (os error 28)"); None if there is none."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in WRITE_FAILURES:
            return current
        named = None if isinstance(current, OSError) else _RUST_OS_ERROR.search(str(current))
        if named is not None and int(named[1]) in WRITE_FAILURES:
            return OSError(int(named[1]), os.strerror(int(named[1])))
        current = current.__cause__ or current.__context__
    return None


_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


_WHAT_TO_DO = {
    errno.ENOSPC: "free some space there",
    errno.EDQUOT: "free some space there",
    errno.EACCES: "make the folder writable",
    errno.EPERM: "make the folder writable",
    errno.EROFS: "mount it writable",
}


class WriteError(UsageError):
    """A file or folder could not be written for a reason the user can fix: one line naming it,
    why, the space free there and what the write needed where known, and what to do. A UsageError,
    so every command prints it as one line; the file there before, if any, is as it was.

    Args:
        path: What was not written.
        failure: The OSError of one of WRITE_FAILURES' kinds that stopped it.
        size: Bytes the write needed, where known.
        option: The option that writes elsewhere, named in the advice (`another_folder_with`
            names it where the caller knows it and the writer does not).
        note: What else the user should know, such as how to resume.
    """

    def __init__(
        self,
        path: str | Path,
        failure: OSError,
        size: int | None = None,
        option: str | None = None,
        note: str | None = None,
    ) -> None:
        super().__init__(path, failure)  # what pickling rebuilds it from; the rest is in __dict__
        self.path = Path(path)
        self.errno = failure.errno
        self.free = free_space(path) if failure.errno == errno.ENOSPC else None
        self.size = size
        self.option = option
        self.note = note
        self.at = _failed_above(self.path, failure)

    def __str__(self) -> str:
        sizes = [f"{byte_size(self.free)} free there"] if self.free is not None else []
        sizes += [f"it needs about {byte_size(self.size)}"] if self.size and self.errno in _NO_ROOM else []
        detail = f" ({', '.join(sizes)})" if sizes else ""
        at = f" at {self.at}" if self.at is not None else ""
        elsewhere = f" or choose another folder with {self.option}" if self.option else ""
        note = f"; {self.note}" if self.note else ""
        return (
            f"cannot write {self.path}: {WRITE_FAILURES[self.errno]}{detail}{at}; "
            f"{_WHAT_TO_DO[self.errno]}{elsewhere}{note}"
        )


_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def _failed_above(path: Path, failure: OSError) -> Path | None:
    """The folder above `path` the failure names (a parent that could not be created); None when it
    names `path`, a file beside it or nothing."""
    if failure.filename is None:
        return None
    failed = Path(os.fsdecode(failure.filename))
    above = failed.absolute() != path.absolute() and path.absolute().is_relative_to(failed.absolute())
    return failed if above else None


@contextmanager
def reporting_write_failures(
    path: str | Path, size: int | None = None, option: str | None = None
) -> Iterator[None]:
    """Raise a write failure in the block (a full disk, a folder not the user's) as WriteError for
    `path`; any other error as it is. Given `size`, a write larger than the free space there is
    refused before the block runs."""
    if size and (free := free_space(path)) is not None and size > free:
        raise WriteError(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), size, option)
    try:
        yield
    except ValueError:  # a one-line error already (WriteError among them), saying what it means
        raise
    except Exception as error:  # torch raises RuntimeErrors over OSErrors, safetensors its own
        failure = write_failure(error)
        if failure is None:
            raise
        raise WriteError(path, failure, size, option) from error


@contextmanager
def safe_write(path: str | Path, size: int | None = None, option: str | None = None) -> Iterator[Path]:
    """`atomic_write` that raises a failure the user can fix as WriteError
    (`reporting_write_failures`): one line, no partial file, the earlier file as it was."""
    with reporting_write_failures(path, size, option), atomic_write(path) as tmp:
        yield tmp


@contextmanager
def appending(path: str | Path) -> Iterator[None]:
    """Cut `path` back to what it held before the block if the block raises: an append that fails
    part-way (a full disk) leaves no partial line, and a file the block created goes. Cutting back
    needs no room, as rewriting would."""
    path = Path(path)
    size = path.stat().st_size if path.is_file() else None
    try:
        yield
    except BaseException:
        try:
            if size is None:
                path.unlink(missing_ok=True)
            else:
                os.truncate(path, size)
        except OSError:
            pass  # the block's own error says what went wrong
        raise


@contextmanager
def another_folder_with(option: str) -> Iterator[None]:
    """Name `option`, a command's way to write elsewhere, in the advice of a WriteError the block
    raises without one."""
    try:
        yield
    except WriteError as error:
        error.option = error.option or option
        raise


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
