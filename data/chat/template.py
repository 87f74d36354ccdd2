"""A conversation to token ids through the chat template, with the ids the model learns to write.

The template (``chat_template.jinja`` beside this file) is the server's, rendered as it renders it:
in Jinja's sandbox, with ``messages``, ``add_generation_prompt`` and the tokenizer's markers as
``chat_tokens``. Training therefore reads conversations in exactly the form the server prompts with.

The text of messages never passes through :meth:`ChatTokenizer.encode_markup`: the template is
rendered with a placeholder for each message's content, the template's own text is read with its
markers, and each content is encoded as plain text in its place. A marker's spelling typed in a
message is text, never a turn.

The trained ids are those of the assistant's turns: what rendering a message adds after the
generation prompt that comes before it (its text and the end marker). The template must render
a conversation turn by turn (each shorter conversation's text, then the generation prompt's, a
prefix of the longer one's), as the shipped one does.

:func:`chat_prompt` is how a model is asked for its next turn, in the server and in ``chat.py``:
with the markers for a model fine-tuned on conversations, as plain speaker turns for a base model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import DataError
from ..tokenizer import ChatTokenizer, Tokenizer

CHAT_TEMPLATE = Path(__file__).with_name("chat_template.jinja")
"""The one chat template, which the server applies too."""
ROLES = ("system", "user", "assistant")
"""The roles a message may have."""
BASE_MODEL_STOP = ("\n\n",)
"""Where a base model's turn ends in the template's plain form: the blank line after a speech."""

_PLACEHOLDER = re.compile("\ue000(\\d+)\ue001")  # private-use characters: no template writes them


def _raise(message: str) -> None:
    """``raise_exception(...)``, which templates call to refuse a conversation."""
    raise TemplateError(message)


def sandboxed_template(source: str) -> Template:
    """``source`` compiled in Jinja's sandbox, with ``raise_exception`` for templates to refuse a
    conversation; the one way training and the server read a chat template.

    Raises:
        TemplateError: ``source`` is not a valid template.
    """
    environment = ImmutableSandboxedEnvironment(keep_trailing_newline=True)
    environment.globals["raise_exception"] = _raise
    return environment.from_string(source)


class ChatTemplateText:
    """The chat template, rendered as the server renders it (``minigpt.server.ChatTemplate``)."""

    def __init__(self, source: str, name: str = "chat template") -> None:
        try:
            self._template = sandboxed_template(source)
        except TemplateError as error:
            raise DataError(f"{name} is not a valid Jinja template: {error}") from None
        self.name = name

    @classmethod
    def load(cls, path: str | Path = CHAT_TEMPLATE) -> ChatTemplateText:
        """The template in the file ``path`` (by default the one the server ships)."""
        try:
            return cls(Path(path).read_text(encoding="utf-8"), name=str(path))
        except (OSError, UnicodeDecodeError) as error:
            raise DataError(f"cannot read the chat template {path}: {error}") from None

    def render(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool,
        chat_tokens: Mapping[str, str] | None = None,
    ) -> str:
        """The text of ``messages``; with ``add_generation_prompt``, up to where the reply begins."""
        return self._template.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, chat_tokens=chat_tokens
        )


class ChatEncoder:
    """Conversations to ids with a :class:`ChatTokenizer` and the chat template."""

    def __init__(self, tokenizer: ChatTokenizer, template: ChatTemplateText | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = template or ChatTemplateText.load()

    def encode(self, messages: Sequence[Mapping[str, str]]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of a whole conversation, ``(N,)`` uint32, and which of them the model learns to
        write, ``(N,)`` bool: those of the assistant's turns.

        Raises:
            DataError: The template refuses the conversation or does not render it turn by turn,
                or a message holds text the tokenizer cannot encode.
        """
        stand_ins = [{"role": m["role"], "content": f"\ue000{i}\ue001"} for i, m in enumerate(messages)]
        text = self._render(stand_ins, add_generation_prompt=False)
        trained = []  # (start, end) character spans of the assistant's turns in `text`
        for i, message in enumerate(stand_ins):
            if message["role"] == "assistant":
                prompt = self._render(stand_ins[:i], add_generation_prompt=True)
                turn = self._render(stand_ins[: i + 1], add_generation_prompt=False)
                if not (turn.startswith(prompt) and text.startswith(turn)):
                    raise DataError(f"{self.template.name} does not render a conversation turn by turn")
                trained.append((len(prompt), len(turn)))
        return self._ids(text, [m["content"] for m in messages], trained)

    def prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The ids that prompt the model for the assistant's reply to ``messages``."""
        stand_ins = [{"role": m["role"], "content": f"\ue000{i}\ue001"} for i, m in enumerate(messages)]
        text = self._render(stand_ins, add_generation_prompt=True)
        return self._ids(text, [m["content"] for m in messages], [])[0].tolist()

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        try:
            return self.template.render(messages, add_generation_prompt, self.tokenizer.markers)
        except TemplateError as error:
            raise DataError(f"{self.template.name} cannot render the conversation: {error}") from None

    def _ids(
        self, text: str, contents: list[str], trained: list[tuple[int, int]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ids of ``text`` (the template's text with placeholders for ``contents``) and whether each
        falls in a ``trained`` span: the text is cut at every placeholder and every span's ends."""
        cuts = {0, len(text)} | {i for span in trained for i in span}
        placed: dict[int, int] = {}  # placeholder start -> message index
        for match in _PLACEHOLDER.finditer(text):
            cuts |= {match.start(), match.end()}
            placed[match.start()] = int(match.group(1))
        if sorted(placed.values()) != list(range(len(contents))):
            raise DataError(f"{self.template.name} must write every message's content once, as it is")
        bounds = sorted(cuts)
        pieces = list(zip(bounds, bounds[1:], strict=False))
        markup = [text[a:b] for a, b in pieces if a not in placed]
        plain = [contents[placed[a]] for a, _ in pieces if a in placed]
        markup_ids = iter(self.tokenizer.encode_markup(markup))
        plain_ids = iter(self.tokenizer.encode_to_arrays(plain))
        ids, learn = [], []
        for a, _ in pieces:
            piece = next(plain_ids) if a in placed else next(markup_ids)
            ids.append(piece)
            learn.append(np.full(len(piece), any(s <= a < e for s, e in trained)))
        if not ids:
            return np.zeros(0, np.uint32), np.zeros(0, bool)
        return np.concatenate(ids).astype(np.uint32, copy=False), np.concatenate(learn)


@dataclass(frozen=True)
class ChatPrompt:
    """What a conversation asks of a model: the prompt's ids, and what ends the model's turn."""

    ids: list[int]
    stop: tuple[str, ...] = ()
    """Strings that end the turn (a base model's)."""
    stop_ids: tuple[int, ...] = ()
    """Token ids that end the turn: end of text, and a chat-tuned model's markers."""


def chat_prompt(
    messages: Sequence[Mapping[str, str]],
    tokenizer: Tokenizer,
    template: ChatTemplateText,
    base_stop: tuple[str, ...] = BASE_MODEL_STOP,
) -> ChatPrompt:
    """The prompt for the assistant's reply to ``messages``, in the form ``tokenizer``'s model reads.

    A model fine-tuned on conversations (its tokenizer a :class:`ChatTokenizer`) gets the ids it
    was trained on (:meth:`ChatEncoder.prompt_ids`), and its turn ends at any marker: it learned to
    end with the end marker, and an answer's text never holds a marker's id. A base model gets the
    template's plain text, and its turn ends at ``base_stop``.

    Raises:
        DataError: The template refuses or cannot render the conversation, or a message holds
            text the tokenizer cannot encode.
    """
    ends = () if tokenizer.eot_id is None else (tokenizer.eot_id,)
    if isinstance(tokenizer, ChatTokenizer):
        ids = ChatEncoder(tokenizer, template).prompt_ids(messages)
        return ChatPrompt(ids, stop_ids=(*ends, *sorted(tokenizer.ids.values())))
    try:
        text = template.render(messages, add_generation_prompt=True)
    except TemplateError as error:
        raise DataError(f"{template.name} cannot render the conversation: {error}") from None
    return ChatPrompt(tokenizer.encode(text), stop=base_stop, stop_ids=ends)
