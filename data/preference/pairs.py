"""Preference rows: a prompt, the answer preferred (chosen) and one not (rejected), as messages.

Three kinds of row are read, each into a :class:`Pair` of message lists:

* Text: ``{"prompt": str, "chosen": str, "rejected": str}``. The prompt is the user's message and
  each answer the assistant's reply, so that every pair goes through the one chat template.
* Messages: ``{"prompt": [{"role", "content"}, ...], "chosen": [...], "rejected": [...]}``, the
  answers one assistant message each; or without ``prompt``, ``chosen`` and ``rejected`` whole
  conversations that differ only in their last (assistant) message, which is the answer.
* A play question (``python play_questions.py``): ``instruction``, ``output``, ``choices`` and
  ``label``. The question is the prompt, the right choice chosen and one wrong choice rejected
  (drawn by the row's number, so the same in every run).

Sources are read as chat data is (:func:`~minigpt.data.chat.instructions.read_rows`): a local
``.jsonl``/``.json``/``.parquet`` file or folder, or a hub dataset through ``datasets``. A row a
user got wrong is a DataError of one line naming the file and the row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..chat.instructions import Messages, checked_message, read_rows
from ..errors import DataError


@dataclass(frozen=True)
class Pair:
    """One preference row: the prompt's messages, and the two answers to it."""

    where: str
    """The file (or hub dataset) and the row, for messages about it."""
    prompt: Messages
    chosen: str
    """The preferred answer: the assistant's reply to ``prompt``."""
    rejected: str
    """The answer not preferred."""


def _messages(value: Any, field: str, where: str) -> Messages:
    """``value`` checked as a non-empty list of ``{role, content}`` messages."""
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: {field!r} must be text or a non-empty list of {{role, content}}")
    return [checked_message(m, f"{field} message {i}", where) for i, m in enumerate(value, start=1)]


def _answer(value: Any, field: str, where: str) -> str:
    """The text of an answer: text, or one assistant message."""
    if isinstance(value, str):
        return value
    messages = _messages(value, field, where)
    if len(messages) != 1 or messages[0]["role"] != "assistant":
        raise DataError(f"{where}: {field!r} must be one assistant message (the answer), got {len(messages)}")
    return messages[0]["content"]


def _question_pair(row: dict[str, Any], where: str, number: int) -> Pair:
    choices, label = row.get("choices"), row.get("label")
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices) or len(choices) < 2:
        raise DataError(f"{where}: 'choices' must be a list of at least two texts")
    if not isinstance(label, int) or not 0 <= label < len(choices):
        raise DataError(f"{where}: 'label' must be the index of the answer among the {len(choices)} choices")
    if not isinstance(row.get("instruction"), str):
        raise DataError(f"{where} has no 'instruction' text (the question)")
    wrong = [choice for i, choice in enumerate(choices) if i != label]
    prompt = [{"role": "user", "content": row["instruction"]}]
    return Pair(where, prompt, choices[label], wrong[number % len(wrong)])


def row_pair(row: dict[str, Any], where: str, number: int = 1) -> Pair:
    """The pair of a preference row or a play question (see the module); ``number`` is the row's.

    Raises:
        DataError: The row is of no kind above, or a field of it is wrong.
    """
    if row.get("choices") is not None and row.get("chosen") is None:
        return _question_pair(row, where, number)
    for field in ("chosen", "rejected"):
        if row.get(field) is None:
            columns = ", ".join(name for name, value in row.items() if value is not None)
            raise DataError(
                f"{where} has no {field!r} (a preference row has prompt, chosen and rejected; "
                f"columns: {columns or 'none'})"
            )
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return Pair(where, [{"role": "user", "content": prompt}], *_answers(row, where))
    if prompt is not None:
        return Pair(where, _messages(prompt, "prompt", where), *_answers(row, where))
    # No prompt: two conversations, alike but for their last message.
    chosen = _messages(row["chosen"], "chosen", where)
    rejected = _messages(row["rejected"], "rejected", where)
    if chosen[:-1] != rejected[:-1] or len(chosen) < 2:
        raise DataError(
            f"{where}: without 'prompt', chosen and rejected must share all but their last message"
        )
    if chosen[-1]["role"] != "assistant" or rejected[-1]["role"] != "assistant":
        raise DataError(f"{where}: the last message of chosen and of rejected must be the assistant's")
    return Pair(where, chosen[:-1], chosen[-1]["content"], rejected[-1]["content"])


def _answers(row: dict[str, Any], where: str) -> tuple[str, str]:
    return _answer(row["chosen"], "chosen", where), _answer(row["rejected"], "rejected", where)


def read_pairs(
    source: str, split: str = "train", subset: str | None = None, streaming: bool = False
) -> Iterator[Pair]:
    """Every row of ``source`` as a pair, in order, read lazily (``read_rows``' arguments).

    Raises:
        DataError: The source cannot be found or read, or a row is not a preference row.
    """
    rows = read_rows(source, split, subset, streaming, what="preference data")
    for number, (where, row) in enumerate(rows, start=1):
        yield row_pair(row, where, number)
