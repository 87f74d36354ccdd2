"""Text as people read it: numbers in a console line or a report, and generated tokens streamed as
whole characters."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def duration(seconds: float) -> str:
    """A wall time such as "45 s", "8 min 35 s" or "2 h 5 min"."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s" if minutes else f"{secs} s"


def short_count(n: float) -> str:
    """A count such as "950", "1.39M" or "6.14B"."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def byte_size(num_bytes: int) -> str:
    """A size such as "0.4 MB" or "12.3 GB"."""
    return f"{num_bytes / 1e9:,.1f} GB" if num_bytes >= 1e8 else f"{num_bytes / 1e6:,.1f} MB"


class TextStream:
    """Turns a stream of token ids into text pieces, holding back partial UTF-8 characters and,
    given stop strings, ending the text before the first of them.

    A BPE token can end in the middle of a multi-byte character; decoding it alone would print
    a replacement character, so text is released only once it decodes cleanly. Likewise text that
    may be the start of a stop string is held back until the tokens after it show it is not; once
    a stop string appears, `stopped` is set and nothing more is released.
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._emitted = 0
        self._stops = tuple(stop for stop in stops if stop)
        self.stopped = False
        """Whether a stop string has appeared."""

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self._ids.append(token)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        return self._release(text, final=False)

    def flush(self) -> str:
        """The text still held back, once no more tokens come."""
        return "" if self.stopped else self._release(self._decode(self._ids), final=True)

    def _release(self, text: str, final: bool) -> str:
        # No stop string starts in the text released so far: any end of it that could was held.
        pending = text[self._emitted :]
        cuts = [i for i in (pending.find(stop) for stop in self._stops) if i >= 0]
        if cuts:
            self.stopped = True
            return pending[: min(cuts)]
        piece = pending[: len(pending) - (0 if final else self._stop_start(pending))]
        self._emitted += len(piece)
        return piece

    def _stop_start(self, text: str) -> int:
        """Length of the longest end of `text` that a stop string starts with."""
        longest = max((len(stop) - 1 for stop in self._stops), default=0)
        for k in range(min(longest, len(text)), 0, -1):
            if any(stop.startswith(text[-k:]) for stop in self._stops):
                return k
        return 0
