"""Instruction and chat data for fine-tuning: rows of a file or hub dataset, as conversations.

Two kinds of row are read, each into a list of messages (``{"role": ..., "content": ...}``):

* Alpaca's ``{"instruction", "input", "output"}``: the user asks the instruction, followed by the
  input after a blank line when there is one, and the assistant answers the output.
* A chat, ``{"messages": [{"role", "content"}, ...]}``, roles among :data:`~.chat.ROLES`.

A row holding ``messages`` is a chat, any other an instruction. The source is resolved as a
corpus is (:func:`~.corpus.resolve_corpus`): a ``.jsonl``, ``.json`` (an array of rows) or
``.parquet`` file, a folder of them, or a dataset on the Hugging Face hub, all read through
``datasets``. A row a user got wrong is a DataError of one line that names the file and the row
(counted from 1 over the rows of that file; blank lines are not rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from minigpt.common import one_line

from ..corpus import Corpus, resolve_corpus
from ..errors import DataError
from .template import ROLES

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Conversation:
    """One row of instruction or chat data, as messages."""

    where: str
    """The file (or hub dataset) and the row, for messages about it."""
    messages: Messages
    """Each ``{"role": ..., "content": ...}``, in order."""


def instruction_messages(row: dict[str, Any], where: str) -> Messages:
    """The messages of an Alpaca row: the instruction (and input) asked, the output answered.

    Raises:
        DataError: ``instruction`` or ``output`` is missing or not text, or ``input`` is not text.
    """
    for field in ("instruction", "output"):
        if not isinstance(row.get(field), str):
            raise DataError(f"{where} has no {field!r} text (an instruction row has instruction and output)")
    extra = row.get("input")
    if not isinstance(extra, str | None):
        raise DataError(f"{where}: 'input' holds {type(extra).__name__}, not text")
    question = f"{row['instruction']}\n\n{extra}" if extra else row["instruction"]
    return [{"role": "user", "content": question}, {"role": "assistant", "content": row["output"]}]


def chat_messages(row: dict[str, Any], where: str) -> Messages:
    """The messages of a chat row, checked.

    Raises:
        DataError: ``messages`` is not a list of messages with a known role and text, or it has no
            assistant message (nothing to learn from).
    """
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list of {{role, content}}")
    checked = [checked_message(message, f"message {i}", where) for i, message in enumerate(messages, start=1)]
    if not any(m["role"] == "assistant" for m in checked):
        raise DataError(f"{where} has no assistant message, so nothing to learn")
    return checked


def checked_message(message: Any, name: str, where: str) -> dict[str, str]:
    """One ``{role, content}`` message, checked: `name` says which in an error (``message 2``).

    Raises:
        DataError: ``message`` is not a mapping, its role is not one of :data:`~.template.ROLES`, or
            it has no text.
    """
    if not isinstance(message, dict):
        raise DataError(f"{where}: {name} is {type(message).__name__}, not {{role, content}}")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise DataError(f"{where}: {name} has role {role!r}; roles are {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise DataError(f"{where}: {name} has no 'content' text")
    return {"role": role, "content": content}


def row_messages(row: dict[str, Any], where: str) -> Messages:
    """The messages of a chat row or an instruction row (see the module)."""
    if row.get("messages") is not None:
        return chat_messages(row, where)
    if "instruction" in row or "output" in row:
        return instruction_messages(row, where)
    columns = ", ".join(name for name, value in row.items() if value is not None)
    raise DataError(
        f"{where} has neither 'messages' nor 'instruction' and 'output' (columns: {columns or 'none'})"
    )


def _tables(corpus: Corpus, what: str) -> list[tuple[str, Callable[[], Iterable[dict[str, Any]]]]]:
    """``(name, rows)`` of each file of a local corpus, or of the hub dataset; ``rows`` opens it."""
    import datasets

    if corpus.hub_dataset is not None:
        return [(corpus.description, lambda: corpus.hub_dataset)]
    if corpus.builder not in ("json", "parquet"):
        raise DataError(f"{corpus.description} is not {what} (.jsonl, .json, .parquet)")
    return [
        (
            str(path),
            partial(
                datasets.load_dataset, corpus.builder, data_files=[str(path)], split="train", streaming=True
            ),
        )
        for path in corpus.files
        if path.stat().st_size  # datasets cannot open an empty file; it holds no rows
    ]


def read_rows(
    source: str,
    split: str = "train",
    subset: str | None = None,
    streaming: bool = False,
    what: str = "instruction or chat data",
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every row of ``source`` with where it is (``"<file>, row <n>"``), in order, read lazily.

    Args:
        source: A ``.jsonl``/``.json``/``.parquet`` file or folder, or a hub dataset name.
        split: Split of a hub dataset.
        subset: Named configuration of a hub dataset.
        streaming: Stream a hub dataset rather than download it whole.
        what: What the rows are, for the message about a source of another kind.

    Raises:
        DataError: The source cannot be found or read, or holds no rows.
    """
    try:
        corpus = resolve_corpus(source, split=split, subset=subset, streaming=streaming)
    except DataError as err:
        if Path(source).parent.name == "play_questions" and not Path(source).exists():
            raise DataError(f"{err}: `python play_questions.py` writes the questions on the plays") from None
        raise
    seen = 0
    for name, rows in _tables(corpus, what):
        number = 0
        try:
            for number, row in enumerate(rows(), start=1):
                yield f"{name}, row {number}", row
        except DataError:
            raise
        except Exception as error:  # datasets and pyarrow raise many kinds for a malformed file
            after = f" after row {number}" if number else ""
            raise DataError(f"could not read {name}{after}: {one_line(error, root_cause=True)}") from None
        seen += number
    if seen == 0:
        raise DataError(f"{corpus.description} has no rows")


def read_conversations(
    source: str, split: str = "train", subset: str | None = None, streaming: bool = False
) -> Iterator[Conversation]:
    """Every row of ``source`` as a conversation, in order, read lazily (``read_rows``' arguments).

    Raises:
        DataError: The source cannot be found or read, or a row is not instruction or chat data.
    """
    for where, row in read_rows(source, split, subset, streaming):
        yield Conversation(where, row_messages(row, where))
