"""What the framework refuses on its own (bodies it cannot parse, routes, methods) is answered in
OpenAI's error shape, as the server's own refusals are: never FastAPI's `{"detail": ...}`."""

from __future__ import annotations

import httpx
import pytest

from minigpt.server.error_handlers import MAX_BODY_BYTES

from .conftest import NAME, Served

JSON = {"content-type": "application/json"}
DEEP = 100_000
"""Levels of nesting far beyond what Python's JSON parser recurses through."""


def openai_error(response: httpx.Response, status: int) -> dict:
    """The error of an answer that is exactly OpenAI's error object, with `status`."""
    body = response.json()
    assert response.status_code == status and list(body) == ["error"], (response.status_code, body)
    error = body["error"]
    assert sorted(error) == ["code", "message", "param", "type"], error
    assert isinstance(error["message"], str) and error["message"].strip() == error["message"] != ""
    assert "\n" not in error["message"] and error["type"] == "invalid_request_error", error
    return error


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "the request body is not valid JSON: Expecting property name"),
        (b'{"model": "tiny", "prompt": "x",}', "the request body is not valid JSON"),
        (b"\xff\xfe{", "the request body cannot be parsed"),
    ],
)
def test_a_body_that_is_not_json_is_refused_in_openais_error_shape(
    served: Served, body: bytes, message: str
) -> None:
    answer = httpx.post(f"{served.url}/v1/completions", content=body, headers=JSON)
    assert message in openai_error(answer, 400)["message"]


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"[1, 2]", JSON),
        (b"null", JSON),
        (b'"ROMEO:"', JSON),
        (b"", JSON),
        (f'{{"model": "{NAME}", "prompt": "x"}}'.encode(), {"content-type": "text/plain"}),
    ],
)
def test_json_that_is_not_an_object_is_refused_in_openais_error_shape(
    served: Served, body: bytes, headers: dict[str, str]
) -> None:
    for route in ("/v1/completions", "/v1/chat/completions", "/attention"):
        answer = httpx.post(f"{served.url}{route}", content=body, headers=headers)
        error = openai_error(answer, 400)
        assert error["message"] == "the request body must be a JSON object, sent as application/json"


def test_json_of_the_wrong_shape_is_refused_naming_the_field(served: Served) -> None:
    body = dict(model=NAME, messages={"role": "user", "content": "hi"})
    answer = httpx.post(f"{served.url}/v1/chat/completions", json=body)
    error = openai_error(answer, 400)
    assert error["param"] == "messages" and error["message"].startswith("messages: "), error


@pytest.mark.parametrize(
    "body",
    [
        "[" * DEEP + "]" * DEEP,
        '{"a": ' * DEEP + "{}" + "}" * DEEP,
        f'{{"model": "{NAME}", "prompt": ' + "[" * DEEP + "]" * DEEP + "}",
    ],
    ids=["arrays", "objects", "in-a-field"],
)
def test_a_body_nested_100000_deep_is_refused_in_openais_error_shape(served: Served, body: str) -> None:
    for route in ("/v1/completions", "/v1/chat/completions"):
        answer = httpx.post(f"{served.url}{route}", content=body, headers=JSON)
        assert openai_error(answer, 400)["message"] == "the request body is nested too deeply to parse"
    assert httpx.get(f"{served.url}/health").json()["status"] == "ok"


def test_an_unknown_route_is_refused_in_openais_error_shape(served: Served) -> None:
    for method, route in (("POST", "/v1/embeddings"), ("GET", "/v2/models"), ("GET", "/favicon.ico")):
        answer = httpx.request(method, f"{served.url}{route}", json={})
        assert openai_error(answer, 404)["message"] == f"there is no route {method} {route}"


def test_a_wrong_method_is_refused_in_openais_error_shape_naming_the_right_one(served: Served) -> None:
    for method, route, allowed in (
        ("GET", "/v1/completions", "POST"),
        ("DELETE", "/v1/chat/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("PUT", "/health", "GET"),
    ):
        answer = httpx.request(method, f"{served.url}{route}")
        error = openai_error(answer, 405)
        assert error["message"] == f"{method} {route} is not allowed; this route takes {allowed}"
        assert answer.headers["allow"] == allowed


@pytest.mark.parametrize("sent", ["with its length", "in chunks"])
def test_a_body_over_the_limit_is_refused_with_413_in_openais_error_shape(served: Served, sent: str) -> None:
    prompt = "x" * MAX_BODY_BYTES
    body = f'{{"model": "{NAME}", "prompt": "{prompt}", "max_tokens": 1}}'.encode()
    content = body if sent == "with its length" else iter([body[: len(body) // 2], body[len(body) // 2 :]])
    answer = httpx.post(f"{served.url}/v1/completions", content=content, headers=JSON)
    error = openai_error(answer, 413)
    assert (
        error["message"] == f"the request body is larger than the {MAX_BODY_BYTES:,} bytes this server reads"
    )


def test_a_body_under_the_limit_sent_in_chunks_is_read_whole(served: Served) -> None:
    body = f'{{"model": "{NAME}", "prompt": "ROMEO:", "max_tokens": 2}}'.encode()
    answer = httpx.post(f"{served.url}/v1/completions", content=iter([body[:9], body[9:]]), headers=JSON)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] is not None
