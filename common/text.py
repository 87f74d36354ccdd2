"""Numbers as people read them in a console line or a report."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """A wall time such as "45 s", "8 min 35 s" or "2 h 5 min"."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s" if minutes else f"{secs} s"
