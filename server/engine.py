"""The model behind the server: the project's generation steps, one worker thread, bounded turns.

Every forward pass runs on one worker thread, so the model is never used by two requests at
once; requests that are generating take turns step by step (each token of each request is one
job in the thread's queue), so a long request does not hold the others back until it ends. At
most `max_running` requests generate at a time and `max_waiting` more wait for a turn; beyond
that a request is refused at once (`Overloaded`), so a burst of clients never piles up work or
memory. Each request draws from its own seeded `torch.Generator`: its tokens do not depend on
what else runs beside it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import torch

from minigpt.common.text import TextStream
from minigpt.data import Tokenizer
from minigpt.model import GPT, generate_steps
from minigpt.viz.attention import token_labels

from .errors import CONTEXT_LENGTH_EXCEEDED, Overloaded, RequestError


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how many requests the server holds at once."""

    max_tokens: int = 256
    """The most tokens one request may generate per choice."""
    max_n: int = 4
    """The most choices (`n`) one request may ask for."""
    max_logprobs: int = 20
    """The most alternatives per token a request may ask for."""
    max_running: int = 4
    """Requests generating at once (they take turns on the model, a token at a time)."""
    max_waiting: int = 32
    """Requests waiting for a turn; more are refused with 503."""


@dataclass(frozen=True)
class Sampling:
    """How one request chooses its tokens."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] = ()
    """Token ids that end a choice besides end-of-text (a chat-tuned model's markers); like
    end-of-text, none of them is part of the choice."""
    logprobs: int | None = None
    """Alternatives to report per token (0: only the chosen token's log-probability; None: none)."""


@dataclass(frozen=True)
class Token:
    """One generated token of one choice."""

    id: int
    text: str
    """The token decoded alone (may be part of a character)."""
    logprob: float | None = None
    """Its log-probability under the model's distribution (before temperature and filtering)."""
    top: tuple[tuple[int, str, float], ...] = ()
    """The most likely tokens at this step, (id, text, log-probability), most likely first."""


@dataclass(frozen=True)
class ChoiceStep:
    """What one step added to one choice: text now final, the token, and whether it ended."""

    index: int
    text: str
    token: Token | None
    finish_reason: str | None = None


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return dict(
            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens, total_tokens=total
        )


class ChoiceText:
    """The text of one choice as its tokens arrive: partial UTF-8 characters and anything that may
    be the start of a stop string are held back, and the text ends before the first stop string."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str]) -> None:
        self._stream = TextStream(decode)
        self._stops = [stop for stop in stops if stop]
        self._held = ""
        self.finish_reason: str | None = None

    def push(self, token: int) -> str:
        """Text released by one more token ("" while held back)."""
        return self._release(self._held + self._stream.push(token), final=False)

    def end(self, reason: str) -> str:
        """The rest of the text, once no more tokens come; `reason` unless a stop string ends it."""
        text = self._release(self._held + self._stream.flush(), final=True)
        self.finish_reason = self.finish_reason or reason
        return text

    def _release(self, text: str, final: bool) -> str:
        cuts = [i for i in (text.find(stop) for stop in self._stops) if i >= 0]
        if cuts:
            self.finish_reason, self._held = "stop", ""
            return text[: min(cuts)]
        keep = 0 if final else self._partial_stop(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def _partial_stop(self, text: str) -> int:
        """Length of the longest end of `text` that a stop string starts with."""
        longest = max((len(stop) - 1 for stop in self._stops), default=0)
        for k in range(min(longest, len(text)), 0, -1):
            if any(stop.startswith(text[-k:]) for stop in self._stops):
                return k
        return 0


@dataclass
class Admission:
    """Up to `running` requests at work and `waiting` more in line; beyond that, `Overloaded`."""

    running: int
    waiting: int
    inside: int = 0
    """Requests holding a place: running or waiting."""
    busy: int = 0
    """Requests running now."""
    _slots: asyncio.Semaphore | None = field(default=None, repr=False)

    def reserve(self) -> None:
        """Take a place, or refuse the request at once when every place is taken."""
        if self.inside >= self.running + self.waiting:
            raise Overloaded(
                f"the server is busy: {self.running} requests running and {self.waiting} waiting; retry later"
            )
        self.inside += 1

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait for a running slot with a place `reserve` took; the place is given back after."""
        if self._slots is None:  # made here, inside the server's event loop
            self._slots = asyncio.Semaphore(self.running)
        try:
            async with self._slots:
                self.busy += 1
                try:
                    yield
                finally:
                    self.busy -= 1
        finally:
            self.inside -= 1


class Engine:
    """A loaded model and its tokenizer, serving generation and attention requests."""

    def __init__(self, model: GPT, tokenizer: Tokenizer, name: str, limits: Limits) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.limits = limits
        self.admission = Admission(limits.max_running, limits.max_waiting)
        self._device = model.lm_head.weight.device
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minigpt-model")

    @property
    def context_length(self) -> int:
        return self.model.config.context_length

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """The prompt's token ids, checked to fit the model; `RequestError` (400) otherwise."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            vocab = self.model.config.vocab_size
            bad = next((i for i in prompt if not 0 <= i < vocab), None)
            if bad is not None:
                raise RequestError(
                    f"prompt token id {bad} is not in the vocabulary (0 to {vocab - 1})", "prompt"
                )
            ids = list(prompt)
        if not ids:
            raise RequestError("the prompt is empty: send at least one token of text", "prompt")
        if len(ids) > self.context_length:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; this model's context is {self.context_length} tokens",
                "prompt",
                CONTEXT_LENGTH_EXCEEDED,
            )
        return ids

    async def run(self, fn: Callable[..., object], *args: object) -> object:
        """`fn(*args)` on the model's worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def generate(
        self, ids: list[int], sampling: Sampling, usage: Usage
    ) -> AsyncIterator[list[ChoiceStep]]:
        """What each step adds to the choices, computed a step at a time on the worker thread."""
        steps = self._steps(ids, sampling, usage)
        try:
            while (step := await self.run(next, steps, None)) is not None:
                yield step  # type: ignore[misc]
        finally:
            await self.run(steps.close)

    def _steps(self, ids: list[int], s: Sampling, usage: Usage) -> Iterator[list[ChoiceStep]]:
        seed = s.seed if s.seed is not None else secrets.randbits(63)
        generator = torch.Generator(device=self._device).manual_seed(seed % 2**64)
        prompt = torch.tensor([ids] * s.n, device=self._device)  # (n, T): the choices as one batch
        texts = [ChoiceText(self.tokenizer.decode, s.stop) for _ in range(s.n)]
        sample = dict(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, generator=generator)
        ends = {self.tokenizer.eot_id, *s.stop_ids}
        for next_ids, logits in generate_steps(self.model, prompt, s.max_tokens, **sample):
            tops = self._alternatives(logits, next_ids, s.logprobs) if s.logprobs is not None else None
            step = []
            for i, token in enumerate(next_ids[:, 0].tolist()):
                if texts[i].finish_reason is None:
                    usage.completion_tokens += 1
                    step.append(self._advance(i, texts[i], token, tops[i] if tops else (None, ()), ends))
            yield step
            if all(text.finish_reason is not None for text in texts):
                return
        yield [
            ChoiceStep(i, t.end("length"), None, t.finish_reason)
            for i, t in enumerate(texts)
            if t.finish_reason is None
        ]

    def _advance(
        self,
        index: int,
        text: ChoiceText,
        token: int,
        scores: tuple[float | None, tuple],
        ends: set[int | None],
    ) -> ChoiceStep:
        """One choice's step: one of the `ends` ids (end-of-text, the sampling's stop ids) ends it,
        a stop string may; the token that ends it is not part of the choice."""
        if token in ends:
            return ChoiceStep(index, text.end("stop"), None, text.finish_reason)
        piece = text.push(token)
        if text.finish_reason is not None:
            return ChoiceStep(index, piece, None, text.finish_reason)
        return ChoiceStep(index, piece, Token(token, self.tokenizer.decode([token]), *scores))

    def _alternatives(
        self, logits: torch.Tensor, chosen: torch.Tensor, k: int
    ) -> list[tuple[float, tuple[tuple[int, str, float], ...]]]:
        """Per row: the chosen token's log-probability and the k most likely (id, text, logprob)."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # (n, V)
        own = logprobs.gather(1, chosen).squeeze(1).tolist()
        values, indices = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        decode = self.tokenizer.decode
        return [
            (
                own[row],
                tuple(
                    (i, decode([i]), v)
                    for i, v in zip(indices[row].tolist(), values[row].tolist(), strict=True)
                ),
            )
            for row in range(logprobs.shape[0])
        ]

    def attention(self, ids: list[int]) -> dict[str, object]:
        """How the last of `ids` attends to the tokens before it, in every layer and head, from
        `GPT.attention_weights` (the path the attention pictures use). A sequence longer than the
        context keeps its last `context_length` tokens, the window the model saw."""
        window = ids[-self.context_length :]
        weights = self.model.attention_weights(torch.tensor([window], device=self._device))
        rows = [layer[0, :, -1, :].float().cpu() for layer in weights]  # each (n_head, T)
        return {
            "start": len(ids) - len(window),
            "tokens": token_labels(self.tokenizer, window),
            "weights": [[[round(w, 5) for w in head.tolist()] for head in layer] for layer in rows],
        }

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)
