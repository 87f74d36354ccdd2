"""The chat template: how a conversation becomes the text a base model continues.

A Jinja template, as Hugging Face's tokenizers hold theirs, rendered in Jinja's sandbox with
`messages` (each a dict of `role` and `content`) and `add_generation_prompt`. The default,
`chat_template.jinja` beside this file, writes each message as a speaker's turn; pass another
file to the server to replace it. Its stop strings end the assistant's turn, since a base model
has no end-of-turn token of its own.
"""

from __future__ import annotations

from pathlib import Path

from jinja2 import TemplateError

from minigpt.common import UsageError
from minigpt.data.chat import sandboxed_template

from .errors import RequestError

DEFAULT_TEMPLATE = Path(__file__).with_name("chat_template.jinja")
"""The plain template for base models."""
DEFAULT_STOP = ("\n\n",)
"""Where the default template's assistant turn ends: the blank line after a speech."""


class ChatTemplate:
    """A conversation to prompt text, and the strings that end the model's turn."""

    def __init__(
        self, source: str, stop: tuple[str, ...] = DEFAULT_STOP, name: str = "chat template"
    ) -> None:
        try:
            self._template = sandboxed_template(source)
        except TemplateError as err:
            raise UsageError(f"{name} is not a valid Jinja template: {err}") from None
        self.stop = stop

    @classmethod
    def load(cls, path: str | Path | None = None, stop: tuple[str, ...] = DEFAULT_STOP) -> ChatTemplate:
        """The template in the file `path` (None: the default one)."""
        path = Path(path) if path is not None else DEFAULT_TEMPLATE
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read the chat template {path}: {err}") from None
        return cls(source, stop, name=str(path))

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt for `messages`, ending where the assistant's reply begins."""
        try:
            return self._template.render(messages=messages, add_generation_prompt=True)
        except TemplateError as err:
            raise RequestError(f"the chat template cannot render these messages: {err}", "messages") from None
