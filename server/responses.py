"""The answers of OpenAI's completions and chat completions APIs, whole or as stream chunks.

Both APIs answer with the same pieces in different wrappers: a completion's choice holds `text`
and its log-probabilities as parallel lists; a chat choice holds a `message` (a `delta` when
streamed) and its log-probabilities as one entry per token. `Shape` is what they share; the two
subclasses are the wrappers.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .engine import ChoiceStep, Token, Usage


@dataclass
class Choice:
    """One choice as its steps arrive: its text, kept tokens and how it ended."""

    text: str = ""
    tokens: list[Token] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, step: ChoiceStep) -> None:
        if step.token is not None:
            self.tokens.append(step.token)
            self.offsets.append(len(self.text))
        self.text += step.text
        self.finish_reason = step.finish_reason or self.finish_reason


class Shape:
    """One response's id, time and model, and how its choices are written."""

    object = ""
    chunk_object = ""
    prefix = ""

    def __init__(self, model: str, logprobs: bool, token_ids: list[int] | None) -> None:
        self.model = model
        self.logprobs = logprobs
        self.prompt_token_ids = token_ids
        """The prompt's ids, sent back when the request asked for token ids."""
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict[str, Any]], usage: Usage | None) -> dict[str, Any]:
        body = dict(id=self.id, object=obj, created=self.created, model=self.model, choices=choices)
        if usage is not None:
            body["usage"] = usage.as_dict()
        return body

    def whole(self, choices: list[Choice], usage: Usage) -> dict[str, Any]:
        """The non-streamed answer."""
        return self._envelope(self.object, [self._whole_choice(i, c) for i, c in enumerate(choices)], usage)

    def chunk(self, steps: list[ChoiceStep], first: bool) -> dict[str, Any]:
        """One streamed chunk: what one step added to each choice."""
        return self._envelope(self.chunk_object, [self._chunk_choice(s, first) for s in steps], None)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The last streamed chunk, with no choices, when the client asked for the usage."""
        return self._envelope(self.chunk_object, [], usage)

    def _ids(self, choice: dict[str, Any], tokens: list[Token], first: bool) -> dict[str, Any]:
        if self.prompt_token_ids is not None:
            choice["token_ids"] = [t.id for t in tokens]
            if first:
                choice["prompt_token_ids"] = self.prompt_token_ids
        return choice

    def _whole_choice(self, index: int, choice: Choice) -> dict[str, Any]:
        raise NotImplementedError

    def _chunk_choice(self, step: ChoiceStep, first: bool) -> dict[str, Any]:
        raise NotImplementedError


class CompletionShape(Shape):
    object = chunk_object = "text_completion"
    prefix = "cmpl"

    def __init__(self, model: str, logprobs: bool, token_ids: list[int] | None, echo: str = "") -> None:
        super().__init__(model, logprobs, token_ids)
        self.echo = echo
        """The prompt, when the request asked for it to be echoed before the completion."""

    def _logprobs(self, tokens: list[Token], offsets: list[int]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return dict(
            tokens=[t.text for t in tokens],
            token_logprobs=[t.logprob for t in tokens],
            top_logprobs=[_by_text(t.top) for t in tokens],
            text_offset=offsets,
        )

    def _whole_choice(self, index: int, choice: Choice) -> dict[str, Any]:
        offsets = [len(self.echo) + o for o in choice.offsets]
        body = dict(
            index=index,
            text=self.echo + choice.text,
            logprobs=self._logprobs(choice.tokens, offsets),
            finish_reason=choice.finish_reason,
        )
        return self._ids(body, choice.tokens, True)

    def _chunk_choice(self, step: ChoiceStep, first: bool) -> dict[str, Any]:
        tokens = [step.token] if step.token is not None else []
        body = dict(
            index=step.index,
            text=(self.echo if first else "") + step.text,
            logprobs=self._logprobs(tokens, [0] * len(tokens)),
            finish_reason=step.finish_reason,
        )
        return self._ids(body, tokens, first)


def _by_text(top: tuple[tuple[int, str, float], ...]) -> dict[str, float]:
    """Alternatives keyed by their text, most likely first; of two tokens that read the same (two
    pieces of one character, say) the likelier is kept, as a JSON object cannot hold both."""
    by_text: dict[str, float] = {}
    for _, text, logprob in top:
        by_text.setdefault(text, logprob)
    return by_text


def _chat_token(text: str, logprob: float) -> dict[str, Any]:
    return dict(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))


class ChatShape(Shape):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    prefix = "chatcmpl"

    def _logprobs(self, tokens: list[Token]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        content = [
            _chat_token(t.text, t.logprob)
            | {"top_logprobs": [_chat_token(text, lp) for _, text, lp in t.top]}
            for t in tokens
            if t.logprob is not None
        ]
        return {"content": content}

    def _whole_choice(self, index: int, choice: Choice) -> dict[str, Any]:
        body = dict(
            index=index,
            message=dict(role="assistant", content=choice.text),
            logprobs=self._logprobs(choice.tokens),
            finish_reason=choice.finish_reason,
        )
        return self._ids(body, choice.tokens, True)

    def _chunk_choice(self, step: ChoiceStep, first: bool) -> dict[str, Any]:
        tokens = [step.token] if step.token is not None else []
        delta = dict(role="assistant", content=step.text) if first else dict(content=step.text)
        body = dict(
            index=step.index, delta=delta, logprobs=self._logprobs(tokens), finish_reason=step.finish_reason
        )
        return self._ids(body, tokens, first)
