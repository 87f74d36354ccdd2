"""The HTTP application: OpenAI's completions, chat and models routes, health, and the web page.

Every error a client can cause, the framework's own refusals included, is answered in OpenAI's
error shape (`{"error": {"message", "type", "param", "code"}}`) with a 4xx status, and a full queue
with 503; a request never sees a trace (see `error_handlers.py`).
Streamed answers are server-sent events, each `data:` a JSON chunk, ending with `data: [DONE]`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.sse import EventSourceResponse, format_sse_event
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Receive, Scope, Send

from .chat import ChatTemplate, reads_markers
from .engine import Engine, Sampling, Usage
from .error_handlers import BodyLimit, add_error_handlers
from .errors import Unauthorized, UnknownModel
from .protocol import ChatRequest, Common, CompletionRequest
from .responses import ChatShape, Choice, CompletionShape, Shape

PAGE = Path(__file__).with_name("page.html")
"""The web page served at `/`: one self-contained file, no other resources."""


class AttentionRequest(BaseModel):
    """`POST /attention`: the tokens so far; answered with how the last one attends to the others."""

    model_config = ConfigDict(extra="forbid", strict=True)
    token_ids: list[int] = Field(min_length=1)


class TurnStream(EventSourceResponse):
    """A streamed answer that waits for its turn on the model before it starts, and gives the
    turn back however it ends: finished, failed, or the client gone."""

    def __init__(self, engine: Engine, events: AsyncIterator[bytes]) -> None:
        super().__init__(events, headers={"Cache-Control": "no-cache"})
        self._engine = engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with self._engine.admission.turn():
                await super().__call__(scope, receive, send)
        finally:
            # A client gone mid-stream leaves the events suspended: close them now, and with them
            # the model's generation, rather than whenever the garbage collector finds them.
            await self.body_iterator.aclose()  # type: ignore[union-attr]


def create_app(engine: Engine, chat: ChatTemplate, api_key: str | None = None) -> FastAPI:
    """The server's application around a loaded model, its chat template and an optional key."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.close()

    app = FastAPI(
        title="minigpt", summary="An OpenAI-compatible server for a minigpt model", lifespan=lifespan
    )

    add_error_handlers(app)
    app.add_middleware(BodyLimit)

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        # The scheme is case-insensitive (RFC 7235: "bearer" is "Bearer"); the key is not.
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), api_key.encode()):
            raise Unauthorized("a valid API key is needed: send it as 'Authorization: Bearer <key>'")

    def check_model(request: Common) -> None:
        if request.model != engine.name:
            raise UnknownModel(
                f"the model {request.model!r} does not exist; this server serves {engine.name!r}", "model"
            )

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        admission = engine.admission
        return dict(
            status="ok",
            model=engine.name,
            context_length=engine.context_length,
            chat_tuned=reads_markers(engine.tokenizer),
            running=admission.busy,
            waiting=admission.inside - admission.busy,
            max_tokens=engine.limits.max_tokens,
            max_logprobs=engine.limits.max_logprobs,
        )

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        card = dict(id=engine.name, object="model", created=0, owned_by="minigpt")
        return dict(object="list", data=[card | {"max_model_len": engine.context_length}])

    @app.post("/v1/completions", dependencies=[Depends(authorized)], response_model=None)
    async def completions(request: CompletionRequest) -> JSONResponse | TurnStream:
        check_model(request)
        ids = engine.prompt_ids(request.prompt)
        sampling = request.sampling(engine.limits, request.max_tokens or 0, request.logprobs)
        echo = (
            (request.prompt if isinstance(request.prompt, str) else engine.tokenizer.decode(ids))
            if request.echo
            else ""
        )
        shape = CompletionShape(
            engine.name, request.logprobs is not None, ids if request.return_token_ids else None, echo
        )
        return await answer(ids, sampling, shape, request)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)], response_model=None)
    async def chat_completions(request: ChatRequest) -> JSONResponse | TurnStream:
        check_model(request)
        prompt = chat.prompt(request.conversation(), engine.tokenizer)
        ids = engine.prompt_ids(prompt.ids)
        k = (request.top_logprobs or 0) if request.logprobs else None
        budget = request.token_budget(engine.limits)
        sampling = request.sampling(engine.limits, budget, k, prompt.stop, prompt.stop_ids)
        shape = ChatShape(engine.name, request.logprobs, ids if request.return_token_ids else None)
        return await answer(ids, sampling, shape, request)

    @app.post("/attention", dependencies=[Depends(authorized)])
    async def attention(request: AttentionRequest) -> dict[str, Any]:
        ids = request.token_ids[-engine.context_length :]
        engine.prompt_ids(ids)  # checks the ids
        engine.admission.reserve()
        async with engine.admission.turn():
            result = await engine.run(engine.attention, request.token_ids)
        return result  # type: ignore[return-value]

    async def answer(
        ids: list[int], sampling: Sampling, shape: Shape, request: Common
    ) -> JSONResponse | TurnStream:
        engine.admission.reserve()  # 503 at once when the queue is full
        usage = Usage(prompt_tokens=len(ids))
        if request.stream:
            return TurnStream(engine, events(ids, sampling, shape, usage, request.include_usage))
        choices = [Choice() for _ in range(sampling.n)]
        async with engine.admission.turn():
            async with aclosing(engine.generate(ids, sampling, usage)) as steps:
                async for step in steps:
                    for item in step:
                        choices[item.index].add(item)
        return JSONResponse(shape.whole(choices, usage))

    async def events(
        ids: list[int], sampling: Sampling, shape: Shape, usage: Usage, include_usage: bool
    ) -> AsyncIterator[bytes]:
        first = True
        async with aclosing(engine.generate(ids, sampling, usage)) as steps:
            async for step in steps:
                if step:
                    yield format_sse_event(data_str=json.dumps(shape.chunk(step, first)))
                    first = False
        if include_usage:
            yield format_sse_event(data_str=json.dumps(shape.usage_chunk(usage)))
        yield format_sse_event(data_str="[DONE]")

    return app
