"""Every error, the framework's own included, answered in OpenAI's error shape.

FastAPI and Starlette answer what they refuse themselves (a body that cannot be parsed, an unknown
route, a wrong method) with `{"detail": ...}`; OpenAI's clients read `{"error": {"message", "type",
"param", "code"}}`. The handlers here answer both kinds in OpenAI's shape, each with one line
saying why and the status the framework chose, so a client never sees another shape or a trace.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from minigpt.common import one_line
from minigpt.data import DataError

from .errors import ClientError

UNION_MEMBERS = {"str", "int", "float", "bool", "list", "dict"}
"""Type names pydantic puts in an error's location when a field may be of several types."""

NOT_AN_OBJECT = {"missing", "model_attributes_type"}
"""pydantic's error types for a body that is no JSON object at all: empty, an array, a number, or
JSON sent as another content type (read as bytes)."""


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    """The first problem pydantic found, as one line naming the field, and the field."""
    first = err.errors()[0]
    loc = tuple(first.get("loc", ()))
    message = first.get("msg", "invalid request").removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", message)
        return f"the request body is not valid JSON: {reason} at character {loc[-1]}", None
    if loc == ("body",) and first.get("type") in NOT_AN_OBJECT:
        return "the request body must be a JSON object, sent as application/json", None
    # The location holds the union member that was tried ("str", "list[int]"): leave those out.
    where = [
        str(part)
        for part in loc[1:]
        if isinstance(part, int) or (str(part).isidentifier() and part not in UNION_MEMBERS)
    ]
    return (f"{'.'.join(where)}: {message}" if where else message), (where[0] if where else None)


def http_message(request: Request, err: HTTPException) -> str:
    """One line for a refusal of the framework's own: a route, a method, or a body it could not parse."""
    where = f"{request.method} {request.url.path}"
    if err.status_code == 404:
        return f"there is no route {where}"
    if err.status_code == 405:
        return f"{where} is not allowed; this route takes {(err.headers or {}).get('Allow', 'other methods')}"
    if err.status_code == 400 and err.__cause__ is not None:
        # FastAPI wraps what its parsing raised in "There was an error parsing the body": say what.
        if isinstance(err.__cause__, RecursionError):
            return "the request body is nested too deeply to parse"
        return f"the request body cannot be parsed: {one_line(err.__cause__)}"
    return str(err.detail)  # the status's own phrase, such as "Content Too Large"


def add_error_handlers(app: FastAPI) -> None:
    """Answer every exception a request can raise in OpenAI's error shape: 4xx for the client's
    errors (400 for any body that is not a valid request, as OpenAI does), 500 for the server's."""

    @app.exception_handler(ClientError)
    async def client_error(request: Request, err: ClientError) -> JSONResponse:
        return JSONResponse(error_body(str(err), err.type, err.param, err.code), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        message, field = validation_message(err)
        return JSONResponse(error_body(message, "invalid_request_error", field), status_code=400)

    @app.exception_handler(HTTPException)
    async def refused(request: Request, err: HTTPException) -> JSONResponse:
        type_ = "invalid_request_error" if err.status_code < 500 else "server_error"
        body = error_body(http_message(request, err), type_)
        return JSONResponse(body, status_code=err.status_code, headers=err.headers)

    @app.exception_handler(DataError)
    async def unencodable(request: Request, err: DataError) -> JSONResponse:
        return JSONResponse(error_body(one_line(err), "invalid_request_error", "prompt"), status_code=400)

    @app.exception_handler(Exception)
    async def internal(request: Request, err: Exception) -> JSONResponse:
        return JSONResponse(error_body(one_line(err, with_type=True), "server_error"), status_code=500)


MAX_BODY_BYTES = 1 << 20
"""The largest request body the server reads: far more than any prompt a context holds."""


class BodyLimit:
    """Refuse a request body over `max_bytes` with 413 in OpenAI's error shape, before the route
    reads it: by its Content-Length where it has one, else as its chunks arrive."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self.refuse(scope, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the app see it
                return await self.app(scope, _replay([message], receive), send)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self.refuse(scope, send)
            more = message.get("more_body", False)
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def refuse(self, scope: dict[str, Any], send: Any) -> None:
        message = f"the request body is larger than the {self.max_bytes:,} bytes this server reads"
        response = JSONResponse(error_body(message, "invalid_request_error"), status_code=413)
        await response(scope, None, send)


def _replay(messages: list[dict[str, Any]], receive: Any) -> Any:
    """`receive` that hands out `messages` first: the body read already, then what comes after
    (a disconnect, which a streamed answer waits for)."""

    async def replayed() -> dict[str, Any]:
        return messages.pop(0) if messages else await receive()

    return replayed
