"""Error text for command lines, which print every user-caused error as one line."""

from __future__ import annotations


def one_line(error: BaseException, *, root_cause: bool = False, with_type: bool = False) -> str:
    """The error's message folded onto one line.

    Args:
        error: The exception to describe.
        root_cause: Describe the innermost `__cause__` instead: libraries such as `datasets` wrap
            the informative error in a generic one.
        with_type: Prefix the exception's class name, for errors from code we do not own, whose
            message alone may not say what went wrong (e.g. a bare "timed out").
    """
    if root_cause:
        while error.__cause__ is not None:
            error = error.__cause__
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if not text:
        return type(error).__name__
    return f"{type(error).__name__}: {text}" if with_type else text


class UsageError(ValueError):
    """A command line or setting that cannot be run as given; the message is one line saying why."""
