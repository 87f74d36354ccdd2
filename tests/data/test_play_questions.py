"""Questions made from the plays: split by play, deterministic, four fair choices, read as
instruction rows; on a stand-in corpus with the 38 plays' openings, and on the real one."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from minigpt.cli.play_questions import play_questions_main
from minigpt.data import DataError
from minigpt.data import play_questions as module
from minigpt.data.instructions import read_conversations
from minigpt.data.play_questions import (
    PLAYS,
    SPLITS,
    TEST_PLAYS,
    play_speeches,
    prompt,
    question_splits,
    split_plays,
)

from .plays import SPEAKERS, speech_line, synthetic_corpus


@pytest.fixture(scope="module")
def corpus() -> str:
    return synthetic_corpus()


@pytest.fixture(scope="module")
def splits(corpus: str) -> dict[str, list[dict]]:
    return question_splits(corpus, seed=7)


def quoted(row: dict) -> str:
    """The lines a question quotes: between the question and the choices."""
    return row["instruction"].split("\n\n")[1]


def test_each_play_is_found_by_its_opening_and_nothing_is_lost(corpus: str) -> None:
    plays = split_plays(corpus)
    assert list(plays) == [title for title, _ in PLAYS]
    assert "".join(plays.values()) == corpus
    assert all(plays[title].startswith(opening) for title, opening in PLAYS)
    assert speech_line("Hamlet", "ANNA", 1) in plays["Hamlet"]
    assert speech_line("Hamlet", "ANNA", 1) not in plays["King Lear"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda text: text.replace("BERNARDO:\nWho's there?\n", ""), "opening of Hamlet"),
        (lambda text: text + "\n" + PLAYS[0][1], "opening of A Midsummer Night's Dream"),
        (lambda text: text[text.index(PLAYS[1][1]) :] + "\n" + text[: text.index(PLAYS[1][1])], "order"),
    ],
    ids=["a play missing", "an opening twice", "out of order"],
)
def test_another_corpus_is_refused(corpus: str, change, message: str) -> None:
    with pytest.raises(DataError, match=message):
        split_plays(change(corpus))


def test_a_test_play_is_asked_about_in_the_test_file_alone(splits: dict[str, list[dict]]) -> None:
    test_plays = set(TEST_PLAYS)
    assert {row["play"] for row in splits["test"]} == test_plays
    for name in ("train", "validation"):
        assert len({row["play"] for row in splits[name]}) == len(PLAYS) - len(TEST_PLAYS)
        assert not any(row["play"] in test_plays for row in splits[name])
        # Every quoted line names its play: none of train and validation comes from a test play.
        assert not any(f" in {title}\n" in quoted(row) for row in splits[name] for title in test_plays)
    assert all(f" in {row['play']}\n" in quoted(row) for rows in splits.values() for row in rows)
    seen = {quoted(row) for name in ("train", "validation") for row in splits[name]}
    assert len(seen) == len(splits["train"]) + len(splits["validation"])  # a speech is asked about once


def test_every_question_has_four_speakers_of_its_play_and_the_answer_among_them(
    splits: dict[str, list[dict]],
) -> None:
    choosable = {name for name, count in SPEAKERS.items() if count >= module.MIN_SPEECHES} - {"ALL"}
    for row in (row for rows in splits.values() for row in rows):
        choices = row["choices"]
        assert len(set(choices)) == 4 and set(choices) <= choosable
        assert choices[row["label"]] == row["output"]
        assert row["output"].title() in quoted(row)  # the speaker of the quoted lines
        assert not any(a != b and a.startswith(b) for a in choices for b in choices)
        assert row["instruction"] == prompt(row["play"], quoted(row), choices)
        assert row["instruction"].endswith("\nAnswer:")
        assert "My lord." not in quoted(row)  # too short to tell anyone apart


def test_the_names_alone_do_not_beat_chance(corpus: str, splits: dict[str, list[dict]]) -> None:
    # ANNA speaks most in every play; answers in proportion to speeches with distractors drawn
    # uniformly would make "choose ANNA when offered" right far more often than one time in four.
    rows = splits["train"]
    busiest = [max(row["choices"], key=lambda name: SPEAKERS[name]) == row["output"] for row in rows]
    assert sum(busiest) / len(rows) == pytest.approx(0.25, abs=0.04)
    assert Counter(row["label"] for row in rows).most_common()[-1][1] > 0.2 * len(rows)
    counts = Counter(speech.speaker for speech in play_speeches(split_plays(corpus)["Hamlet"]))
    assert counts["ANNA"] == SPEAKERS["ANNA"]


def test_the_questions_are_a_function_of_the_corpus_and_the_seed(corpus: str, splits) -> None:
    assert question_splits(corpus, seed=7) == splits
    other = question_splits(corpus, seed=8)
    assert other["test"] != splits["test"]
    assert {row["play"] for row in other["test"]} == set(TEST_PLAYS)


def test_the_command_writes_files_the_instruction_reader_reads(
    corpus: str, splits, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    source = tmp_path / "corpus.txt"
    source.write_text(corpus, encoding="utf-8")
    monkeypatch.setattr(module, "shakespeare_path", lambda: source)
    out = tmp_path / "questions"
    assert play_questions_main(["--out", str(out), "--seed", "7"]) == 0
    assert f"test.jsonl: {len(splits['test'])} questions on 6 plays" in capsys.readouterr().out
    written = {name: (out / f"{name}.jsonl").read_bytes() for name in SPLITS}
    rows = [json.loads(line) for line in written["test"].decode().splitlines()]
    assert rows == splits["test"]
    first = next(read_conversations(str(out / "train.jsonl")))
    assert [m["role"] for m in first.messages] == ["user", "assistant"]
    assert first.messages[1]["content"] in first.messages[0]["content"].split("Choices: ")[1]
    assert play_questions_main(["--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert play_questions_main(["--out", str(out), "--seed", "7", "--force"]) == 0
    assert {name: (out / f"{name}.jsonl").read_bytes() for name in SPLITS} == written


@pytest.mark.slow
@pytest.mark.network
def test_the_real_corpus_gives_every_play_and_the_held_out_tail() -> None:
    text = module.shakespeare_path().read_text(encoding="utf-8")
    plays = split_plays(text)
    splits = question_splits(text)
    assert Counter(row["play"] for row in splits["test"]) == {
        title: module.TEST_PER_PLAY for title in TEST_PLAYS
    }
    assert len(splits["validation"]) == module.VALIDATION_PER_PLAY * (len(PLAYS) - len(TEST_PLAYS))
    assert len(splits["train"]) > 15_000
    # small.yaml validates on the last tenth of the corpus: three test plays lie wholly inside it.
    assert text.index(plays["Othello"]) > 0.9 * len(text)
    assert all(
        row["output"] in {s.speaker for s in play_speeches(plays[row["play"]])} for row in splits["test"]
    )
