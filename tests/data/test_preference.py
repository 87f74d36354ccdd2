"""Preference data: TRL's row shapes and play questions read into pairs, one-line errors naming the
file and the row, and windows whose targets are the answer's ids alone."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from minigpt.data import DataError
from minigpt.data.chat.conversations import IGNORE_INDEX
from minigpt.data.chat.template import ChatEncoder
from minigpt.data.preference.datamodule import PreferenceDataConfig, PreferenceDataModule
from minigpt.data.preference.examples import PairWindows, encode_pairs
from minigpt.data.preference.pairs import read_pairs
from minigpt.data.tokenizer import CharTokenizer, with_chat_tokens

CHARS = CharTokenizer.from_texts(["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789?.,:+=\n"])
USER = [{"role": "user", "content": "Hi?"}]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_every_row_shape_reads_into_the_same_pair(tmp_path: Path) -> None:
    rows = [
        {"prompt": "Hi?", "chosen": "Hello.", "rejected": "Go."},
        {
            "prompt": USER,
            "chosen": [{"role": "assistant", "content": "Hello."}],
            "rejected": [{"role": "assistant", "content": "Go."}],
        },
        {
            "chosen": [*USER, {"role": "assistant", "content": "Hello."}],
            "rejected": [*USER, {"role": "assistant", "content": "Go."}],
        },
    ]
    pairs = list(read_pairs(str(write_jsonl(tmp_path / "p.jsonl", rows))))
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [(USER, "Hello.", "Go.")] * 3
    assert pairs[2].where == f"{tmp_path / 'p.jsonl'}, row 3"
    table = pa.Table.from_pylist([{"prompt": "Hi?", "chosen": "Hello.", "rejected": "Go."}])
    pq.write_table(table, tmp_path / "p.parquet")
    (pair,) = read_pairs(str(tmp_path / "p.parquet"))
    assert (pair.prompt, pair.chosen, pair.rejected) == (USER, "Hello.", "Go.")


def test_a_play_question_prefers_its_answer_over_a_wrong_choice(tmp_path: Path) -> None:
    question = {"instruction": "Who? Answer:", "output": "B", "choices": ["A", "B", "C", "D"], "label": 1}
    pairs = list(read_pairs(str(write_jsonl(tmp_path / "q.jsonl", [question] * 6))))
    assert {p.chosen for p in pairs} == {"B"} and {p.rejected for p in pairs} == {"A", "C", "D"}
    assert pairs[0].prompt == [{"role": "user", "content": "Who? Answer:"}]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "Hi?", "chosen": "Hello."}, "row 2 has no 'rejected'"),
        ({"prompt": "Hi?", "chosen": "Hello.", "rejected": 3}, "row 2: 'rejected' must be text"),
        (
            {"prompt": [{"role": "robot", "content": "x"}], "chosen": "a", "rejected": "b"},
            "row 2: prompt message 1 has role 'robot'",
        ),
        (
            {"prompt": "Hi?", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"},
            "row 2: 'chosen' must be one assistant message",
        ),
        (
            {
                "chosen": [*USER, {"role": "assistant", "content": "a"}],
                "rejected": [{"role": "assistant", "content": "b"}],
            },
            "row 2: without 'prompt', chosen and rejected must share all but their last message",
        ),
        ({"instruction": "Q", "choices": ["a", "b"], "label": 5}, "row 2: 'label' must be the index"),
    ],
)
def test_a_bad_row_is_one_line_naming_the_file_and_the_row(tmp_path: Path, row: dict, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "Hi?", "chosen": "a", "rejected": "b"}, row])
    with pytest.raises(DataError) as caught:
        list(read_pairs(str(path)))
    text = str(caught.value)
    assert "\n" not in text and text.startswith(str(path)) and message in text


def test_a_missing_or_other_source_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found|does not exist|no such"):
        list(read_pairs(str(tmp_path / "none.jsonl")))
    (tmp_path / "pairs.txt").write_text("just text\n")
    with pytest.raises(DataError, match="is not preference data"):
        list(read_pairs(str(tmp_path / "pairs.txt")))


def test_the_windows_target_the_answer_and_its_end_marker_alone(tmp_path: Path) -> None:
    tokenizer = with_chat_tokens(CHARS)
    encoder = ChatEncoder(tokenizer)
    prompt = [{"role": "system", "content": "Be brief."}, *USER, {"role": "assistant", "content": "Yes?"}]
    rows = [{"prompt": [*prompt, {"role": "user", "content": "Sum?"}], "chosen": "4", "rejected": "52"}]
    examples = encode_pairs(read_pairs(str(write_jsonl(tmp_path / "p.jsonl", rows))), encoder, 64)
    x, y, index = PairWindows(examples, 64, pad_id=tokenizer.end_id)[0]
    assert x.shape == y.shape == (2, 64) and index == 0
    for row, answer in enumerate(("4", "52")):
        targets = y[row][y[row] != IGNORE_INDEX].tolist()  # not the earlier assistant turn's "Yes?"
        assert targets == tokenizer.encode(answer) + [tokenizer.end_id]
        whole, _ = encoder.encode([*rows[0]["prompt"], {"role": "assistant", "content": answer}])
        assert x[row, : len(whole) - 1].tolist() == whole[:-1].tolist()  # the prompt is read, not scored


def test_the_datamodule_holds_out_pairs_and_draws_max_pairs(tmp_path: Path) -> None:
    rows = [{"prompt": f"{i}?", "chosen": "yes", "rejected": "no"} for i in range(30)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    data = PreferenceDataModule(PreferenceDataConfig(str(path), max_pairs=20, val_fraction=0.1), 32)
    data.use_tokenizer(CHARS.spec())
    data.setup()
    assert len(data.windows("train")) == 18 and len(data.windows("val")) == 2
    x, y, index = next(iter(torch.utils.data.DataLoader(data.windows("train"), batch_size=4)))
    assert x.shape == (4, 2, 32) and index.tolist() == [0, 1, 2, 3]
    # What the run's summary counts a batch as: both windows of each pair.
    batch = data.config.batch_size
    assert data.micro_batch() == (2 * batch * 32, f"{batch} pairs x 2 windows x 32 tokens")
    with pytest.raises(DataError, match="max_pairs must be at least 2"):
        PreferenceDataConfig(str(path), max_pairs=1)
    unread = PreferenceDataModule(PreferenceDataConfig(str(path)), 32)
    with pytest.raises(DataError, match="set --model.init_from"):
        unread.setup()
