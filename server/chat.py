"""The chat template: how a conversation becomes the prompt the model continues.

A Jinja template, as Hugging Face's tokenizers hold theirs, rendered in Jinja's sandbox by
`minigpt.data.chat.template`, the code fine-tuning reads conversations with. The default,
`data/chat/chat_template.jinja` beside that code, has two forms, and the model's tokenizer picks one:

- A base model: each message as a speaker's turn in plain text. The stop strings end the
  assistant's turn, since a base model has no end-of-turn token of its own.
- A model fine-tuned on conversations (its tokenizer a `ChatTokenizer`): each message between its
  role's marker and the end marker. The prompt's ids are those fine-tuning trained on
  (`ChatEncoder.prompt_ids`): the template's markers as their ids, each message's text encoded as
  plain text, so no message can forge a turn. The assistant's turn ends at a marker's id.

Pass another file to the server to replace the template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeGuard

from minigpt.common import UsageError
from minigpt.data import DataError, Tokenizer
from minigpt.data.chat.template import (
    BASE_MODEL_STOP,
    CHAT_TEMPLATE,
    ChatPrompt,
    ChatTemplateText,
    chat_prompt,
)
from minigpt.data.tokenizer import ChatTokenizer

from .errors import RequestError

DEFAULT_TEMPLATE = CHAT_TEMPLATE
"""The template for base and chat-tuned models alike."""
DEFAULT_STOP = BASE_MODEL_STOP
"""Where the default template's assistant turn ends for a base model: the blank line after a speech."""


class ChatTemplate:
    """A conversation to the model's prompt, and what ends the model's turn."""

    def __init__(
        self, source: str, stop: tuple[str, ...] = DEFAULT_STOP, name: str = "chat template"
    ) -> None:
        try:
            self.text = ChatTemplateText(source, name)
        except DataError as err:
            raise UsageError(str(err)) from None
        self.stop = stop
        """The stop strings of a base model's turn."""

    @classmethod
    def load(cls, path: str | Path | None = None, stop: tuple[str, ...] = DEFAULT_STOP) -> ChatTemplate:
        """The template in the file `path` (None: the default one)."""
        path = Path(path) if path is not None else DEFAULT_TEMPLATE
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read the chat template {path}: {err}") from None
        return cls(source, stop, name=str(path))

    def prompt(self, messages: Sequence[Mapping[str, str]], tokenizer: Tokenizer) -> ChatPrompt:
        """The prompt for `messages` in the form `tokenizer` reads (`minigpt.data.chat.chat_prompt`):
        with markers for a chat-tuned model, plain text ending at the stop strings for a base one."""
        try:
            return chat_prompt(messages, tokenizer, self.text, base_stop=self.stop)
        except DataError as err:
            raise RequestError(str(err), "messages") from None


def reads_markers(tokenizer: Tokenizer) -> TypeGuard[ChatTokenizer]:
    """Whether the model was fine-tuned on conversations: its tokenizer has the chat markers."""
    return isinstance(tokenizer, ChatTokenizer)
