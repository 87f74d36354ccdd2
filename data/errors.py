"""The one exception type the data package raises for problems a user can cause."""


class DataError(ValueError):
    """A user-fixable data problem: a missing file, a bad option, a corpus that is too small.

    The message is a single line that names the problem and, where possible, the fix, so a
    command-line entry point can print ``str(error)`` alone and exit non-zero.
    """
