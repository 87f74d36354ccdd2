"""The requests of OpenAI's completions and chat completions APIs, as typed models.

pydantic checks every field's type and range; a request that fails is answered 400 with the
first problem (see `app.py`). Fields of the API that the server cannot honour are accepted only
at their neutral value (a `presence_penalty` of 0, an empty `logit_bias`), so no client is ever
silently served something other than what it asked for. Two extensions, as vLLM has them:
`top_k`, and `return_token_ids`, which adds the prompt's and each choice's token ids (the web
page uses them to ask for a token's attention).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from minigpt.model import ConfigError, check_sampling

from .engine import Limits, Sampling
from .errors import RequestError

MAX_STOPS = 4
"""Stop strings one request may give, as in OpenAI's API."""


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Request):
    include_usage: bool = False
    """Send the usage in one last chunk, with no choices."""


class Common(Request):
    """The fields both APIs share."""

    model: str
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    return_token_ids: bool = False

    @model_validator(mode="after")
    def _only_neutral_unsupported(self) -> Common:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                raise ValueError(f"{name} is not supported: leave it out or send 0")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported: leave it out or send {}")
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOPS:
            raise ValueError(f"stop takes at most {MAX_STOPS} strings, got {len(self.stop)}")
        return self

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def sampling(
        self,
        limits: Limits,
        max_tokens: int,
        logprobs: int | None,
        extra_stops: tuple[str, ...] = (),
        stop_ids: tuple[int, ...] = (),
    ) -> Sampling:
        """The sampling this request asks for, checked against the server's `limits` (400 beyond)."""
        if max_tokens > limits.max_tokens:
            raise RequestError(
                f"max_tokens is {max_tokens}; this server generates at most {limits.max_tokens} per request",
                "max_tokens",
            )
        if self.n > limits.max_n:
            raise RequestError(f"n is {self.n}; this server gives at most {limits.max_n} choices", "n")
        if logprobs is not None and logprobs > limits.max_logprobs:
            raise RequestError(
                f"{logprobs} alternatives per token asked; this server gives at most {limits.max_logprobs}",
                "logprobs",
            )
        temperature = 1.0 if self.temperature is None else self.temperature
        try:
            check_sampling(temperature, self.top_k, self.top_p)  # the project's one rule for these
        except ConfigError as err:
            raise RequestError(str(err)) from None
        return Sampling(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            n=self.n,
            seed=self.seed,
            stop=self.stops() + extra_stops,
            stop_ids=stop_ids,
            logprobs=logprobs,
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(Common):
    """`POST /v1/completions`: continue a prompt (text, or token ids)."""

    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(default=16, ge=0)
    """OpenAI's default for this API: 16."""
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise ValueError("send one prompt per request (a list of several prompts is not supported)")
            self.prompt = self.prompt[0]
        if self.best_of not in (None, self.n):
            raise ValueError("best_of is not supported: leave it out or make it equal to n")
        if self.suffix:
            raise ValueError("suffix is not supported: leave it out")
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo with logprobs is not supported: the prompt's log-probabilities are not computed"
            )
        return self


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """One message of a conversation; fields other than role and content (a name, an assistant's
    refusal) are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatRequest(Common):
    """`POST /v1/chat/completions`: continue a conversation, rendered by the chat template."""

    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    """The newer name of max_tokens; either may be sent."""
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _text_only(self) -> ChatRequest:
        if self.response_format not in (None, {"type": "text"}):
            raise ValueError('response_format is not supported: leave it out or send {"type": "text"}')
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def token_budget(self, limits: Limits) -> int:
        """max_completion_tokens, else max_tokens, else the server's cap."""
        for value in (self.max_completion_tokens, self.max_tokens):
            if value is not None:
                return value
        return limits.max_tokens

    def conversation(self) -> list[dict[str, str]]:
        """The messages as the chat template reads them: role and content, as text."""
        return [{"role": m.role, "content": m.text()} for m in self.messages]
