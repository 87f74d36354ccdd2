"""The exception for model files a user points at that cannot be used."""


class CheckpointError(ValueError):
    """A model file cannot be used; the message is one line naming the file and the problem."""
