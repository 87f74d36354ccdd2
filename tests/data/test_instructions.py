"""Reading instruction (Alpaca) and chat rows from local files, and the rows a user can get wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from minigpt.data import DataError
from minigpt.data.chat.instructions import read_conversations

ALPACA = [
    {"instruction": "Name a colour.", "input": "", "output": "Blue."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Say hi.", "output": "Hi."},  # no input at all
]
CHATS = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
        ]
    },
    {"messages": [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye!"}]},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _messages(source: Path) -> list[list[dict[str, str]]]:
    return [conversation.messages for conversation in read_conversations(str(source))]


def test_alpaca_rows_are_a_question_and_its_answer(tmp_path: Path) -> None:
    expected = [
        [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
        [{"role": "user", "content": "Add the numbers.\n\n2 and 3"}, {"role": "assistant", "content": "5"}],
        [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}],
    ]
    assert _messages(_jsonl(tmp_path / "alpaca.jsonl", ALPACA)) == expected
    (tmp_path / "alpaca.json").write_text(json.dumps(ALPACA), encoding="utf-8")  # one JSON array
    assert _messages(tmp_path / "alpaca.json") == expected


def test_chat_rows_are_their_messages(tmp_path: Path) -> None:
    assert _messages(_jsonl(tmp_path / "chats.jsonl", CHATS)) == [row["messages"] for row in CHATS]
    pq.write_table(pa.Table.from_pylist(CHATS), tmp_path / "chats.parquet")
    assert _messages(tmp_path / "chats.parquet") == [row["messages"] for row in CHATS]


def test_a_folder_names_each_file_and_row(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    _jsonl(tmp_path / "data" / "a.jsonl", ALPACA[:2])
    _jsonl(tmp_path / "data" / "b.jsonl", CHATS)
    where = [conversation.where for conversation in read_conversations(str(tmp_path / "data"))]
    a, b = tmp_path / "data" / "a.jsonl", tmp_path / "data" / "b.jsonl"
    assert where == [f"{a}, row 1", f"{a}, row 2", f"{b}, row 1", f"{b}, row 2"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"instruction": "Say hi."},
            r"row 2 has no 'output' text \(an instruction row has instruction and output\)",
        ),
        ({"input": "x", "output": "y"}, "row 2 has no 'instruction' text"),
        ({"text": "plain"}, r"row 2 has neither 'messages' nor 'instruction' and 'output' \(columns: text\)"),
        (
            {"messages": [{"role": "bot", "content": "x"}]},
            "row 2: message 1 has role 'bot'; roles are system, user, assistant",
        ),
        ({"messages": [{"role": "user"}]}, "row 2: message 1 has no 'content' text"),
        (
            {"messages": [{"role": "user", "content": "x"}]},
            "row 2 has no assistant message, so nothing to learn",
        ),
        ({"messages": []}, "row 2: 'messages' must be a non-empty list"),
    ],
)
def test_a_wrong_row_is_one_line_naming_the_file_and_row(tmp_path: Path, row: dict, message: str) -> None:
    path = _jsonl(tmp_path / "data.jsonl", [CHATS[1], row])
    with pytest.raises(DataError, match=message) as error:
        _messages(path)
    assert str(error.value).startswith(f"{path}, row 2") and "\n" not in str(error.value)


def test_unreadable_and_unusable_sources(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(CHATS[1]) + '\n{"messages": [\n', encoding="utf-8")
    with pytest.raises(DataError, match=f"could not read {broken}"):
        _messages(broken)
    (tmp_path / "story.txt").write_text("Once upon a time.", encoding="utf-8")
    with pytest.raises(DataError, match=r"is not instruction or chat data \(.jsonl, .json, .parquet\)"):
        _messages(tmp_path / "story.txt")
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="has no rows"):
        _messages(tmp_path / "empty.jsonl")
    with pytest.raises(DataError, match="does not exist"):
        _messages(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match=r"does not exist: `python play_questions.py` writes"):
        _messages(tmp_path / "play_questions" / "train.jsonl")  # sft.yaml's default, not written yet
