"""Errors a client causes, each with the HTTP status and the OpenAI error type it is answered with."""

from __future__ import annotations


class ClientError(ValueError):
    """A request the server cannot serve as sent; the message is one line saying why."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        """A name for the error that clients can act on, as OpenAI's `code` (None: none)."""


class RequestError(ClientError):
    """A request beyond the model's or the server's limits, or malformed (400)."""


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
"""The code of a prompt longer than the model's context, OpenAI's name for it: the page's chat view
then leaves the oldest turns out and asks again."""


class UnknownModel(ClientError):
    """A request for a model this server does not serve (404)."""

    status = 404


class Overloaded(ClientError):
    """Every place in the queue is taken (503); the client may retry later."""

    status = 503
    type = "server_overloaded"


class Unauthorized(ClientError):
    """A missing or wrong API key, where the server was started with one (401)."""

    status = 401
