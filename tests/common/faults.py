"""A full disk, or a folder the user may not write, made to happen under one folder.

The tests run as root, whom chmod does not stop, and no disk can be filled here; so the calls that
write are patched instead. Permission denied (EACCES): creating a file or folder under the folder,
or opening one there to write, is refused. A full disk (ENOSPC): a file opens, and a write puts
down half its bytes and fails, as on a disk that fills part-way; so does flushing a file to disk
(`os.fsync`), which catches writers that do not go through Python's `open` (safetensors' Rust).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from minigpt.common import sha256_file

WRITE_MODES = frozenset("wax+")

FAULTS = [
    pytest.param(errno.ENOSPC, "no space left on device", id="full-disk"),
    pytest.param(errno.EACCES, "permission denied", id="permission-denied"),
]
"""(errno, the reason the one line gives) of the two faults every write site meets."""


class DiskFault:
    """Writes under `folder` fail with `error`, for the files named in `names` (None: every file;
    the temporary file `atomic_write` makes for one counts as it), once `skip` files have been
    written there. `before` holds the sha256 of every file under `folder` as the first failure
    came; `hits` the paths that failed."""

    def __init__(self, folder: Path, error: int, names: set[str] | None = None, skip: int = 0) -> None:
        self.folder = folder.absolute()
        self.error = error
        self.names = names
        self.skip = skip
        self.before: dict[Path, str] | None = None
        self.hits: list[Path] = []
        self._doomed: dict[Path, bool] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> DiskFault:
        real_open, real_os_open, real_mkdir, real_fsync = builtins.open, os.open, os.mkdir, os.fsync
        full = self.error == errno.ENOSPC

        def fake_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, int) or not WRITE_MODES & set(mode) or not self._doomed_file(file):
                return real_open(file, mode, *args, **kwargs)
            if not full:
                self._raise(file)
            return HalfWritten(real_open(file, mode, *args, **kwargs), self)

        def fake_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            creates = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if creates and self._doomed_file(path) and not full:
                self._raise(path)
            return real_os_open(path, flags, *args, **kwargs)

        def fake_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
            folder = Path(os.fsdecode(path))  # made only in a folder there, as mkdir does
            if not full and folder.parent.is_dir() and not folder.exists() and self._doomed_file(path):
                self._raise(path)
            return real_mkdir(path, *args, **kwargs)

        def fake_fsync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if full and self._doomed_file(path):
                self._raise(path)
            return real_fsync(fd)

        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(io, "open", fake_open)  # what pathlib's write_text calls
        monkeypatch.setattr(os, "open", fake_os_open)  # what tempfile calls
        monkeypatch.setattr(os, "mkdir", fake_mkdir)
        monkeypatch.setattr(os, "fsync", fake_fsync)
        return self

    def _doomed_file(self, path: Any) -> bool:
        """Whether writing `path` fails, decided when it is first touched."""
        target = Path(os.fsdecode(path)).absolute()
        if target in self._doomed:
            return self._doomed[target]
        if not target.is_relative_to(self.folder):
            return False
        if self.names is not None and not any(_is_or_beside(target.name, name) for name in self.names):
            return False
        doomed = self._doomed[target] = not self.skip
        self.skip = max(0, self.skip - 1)
        if doomed and self.before is None:
            self.before = hashes(self.folder)
        return doomed

    def _raise(self, path: Any) -> None:
        self.hits.append(Path(os.fsdecode(path)))
        raise OSError(self.error, os.strerror(self.error), os.fsdecode(path))


def _is_or_beside(file_name: str, name: str) -> bool:
    """Whether `file_name` is `name` or `atomic_write`'s temporary file for it."""
    return file_name == name or file_name.startswith(f".{name}.")


class HalfWritten:
    """A file open for writing whose writes put down half their bytes, then fail for want of room."""

    def __init__(self, file: Any, fault: DiskFault) -> None:
        self._file = file
        self._fault = fault

    def write(self, data: Any) -> int:
        self._file.write(data[: len(data) // 2])
        self._file.flush()
        self._fault._raise(self._file.name)
        return 0

    def writelines(self, lines: Any) -> None:
        self.write("".join(lines) if isinstance(self._file, io.TextIOBase) else b"".join(lines))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> HalfWritten:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def hashes(folder: Path) -> dict[Path, str]:
    """The sha256 of every file under `folder`, by path: a temporary file left behind shows too."""
    if not folder.exists():
        return {}
    return {path: sha256_file(path) for path in sorted(folder.rglob("*")) if path.is_file()}


def run_under(
    fault: DiskFault, command: Callable[[list[str]], int], args: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """Run `command` in this process under `fault`: its exit code and the last line of its stderr.
    Fails if the fault never came (nothing would have been tested)."""
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        fault.install(patch)
        code = command(args)
    assert fault.hits, "the fault never came: nothing was tested"
    return code, error_line(capsys.readouterr().err)


def assert_says(line: str, path: Path, why: str, error: int, option: str | None = None) -> None:
    """The one line names `path` and `why`, the space free there where the disk is full, and the
    option that writes elsewhere, if the command has one."""
    assert line.startswith(f"error: cannot write {path}: {why}"), line
    assert ("free there" in line) == (error == errno.ENOSPC), line
    if option is not None:
        assert line.endswith(f"or choose another folder with {option}"), line


def error_line(stderr: str) -> str:
    """The last line a command printed to stderr, which must hold no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    return stderr.strip().splitlines()[-1]
