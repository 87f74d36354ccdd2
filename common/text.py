"""Text as people read it: numbers in a console line or a report, and generated tokens streamed as
whole characters."""

from __future__ import annotations

from collections.abc import Callable


def duration(seconds: float) -> str:
    """A wall time such as "45 s", "8 min 35 s" or "2 h 5 min"."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s" if minutes else f"{secs} s"


class TextStream:
    """Turns a stream of token ids into text pieces, holding back partial UTF-8 characters.

    A BPE token can end in the middle of a multi-byte character; decoding it alone would print
    a replacement character, so text is released only once it decodes cleanly.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._emitted = 0

    def push(self, token: int) -> str:
        self._ids.append(token)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self._emitted = text[self._emitted :], len(text)
        return piece

    def flush(self) -> str:
        text = self._decode(self._ids)
        return text[self._emitted :]
