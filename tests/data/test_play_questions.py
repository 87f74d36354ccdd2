"""Questions made from the plays, of both kinds (who speaks, which line comes next): split by play,
deterministic, four fair choices, read as instruction rows; on a stand-in corpus with the 38
plays' openings, and on the real one."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from minigpt.cli.play_questions import play_questions_main
from minigpt.data import DataError
from minigpt.data.chat.instructions import read_conversations
from minigpt.data.questions import make as module
from minigpt.data.questions.make import KINDS, SPLITS, next_line_prompt, prompt, question_splits
from minigpt.data.questions.plays import PLAYS, TEST_PLAYS, play_speeches, split_plays

from .plays import SPEAKERS, speech_line, synthetic_corpus


@pytest.fixture(scope="module")
def corpus() -> str:
    return synthetic_corpus()


@pytest.fixture(scope="module")
def splits(corpus: str) -> dict[str, list[dict]]:
    return question_splits(corpus, seed=7)


def quoted(row: dict) -> str:
    """The lines a question quotes: between the question and the choices (or the cue)."""
    return row["instruction"].split("\n\n")[1]


def of_kind(rows: list[dict], kind: str) -> list[dict]:
    return [row for row in rows if row["kind"] == kind]


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
    for kind in KINDS:
        assert {row["play"] for row in of_kind(splits["test"], kind)} == test_plays
    for name in ("train", "validation"):
        for kind in KINDS:
            rows = of_kind(splits[name], kind)
            assert len({row["play"] for row in rows}) == len(PLAYS) - len(TEST_PLAYS)
        assert not any(row["play"] in test_plays for row in splits[name])
        # Every quoted line names its play: none of train and validation comes from a test play.
        assert not any(f" in {title}\n" in quoted(row) for row in splits[name] for title in test_plays)
    speakers = [row for rows in splits.values() for row in of_kind(rows, "speaker")]
    assert all(f" in {row['play']}\n" in quoted(row) for row in speakers)
    seen = {quoted(row) for name in ("train", "validation") for row in of_kind(splits[name], "speaker")}
    trained = of_kind(splits["train"] + splits["validation"], "speaker")
    assert len(seen) == len(trained)  # a speech is asked about once


def test_no_line_of_a_next_line_question_in_training_comes_from_a_test_play(splits) -> None:
    # Every line of the stand-in names its play: the quoted lines, the answer and the distractors.
    for name in SPLITS:
        for row in of_kind(splits[name], "next_line"):
            lines = [*quoted(row).split("\n"), *row["choices"]]
            assert all(line.endswith(f" in {row['play']}") for line in lines)
            assert (row["play"] in TEST_PLAYS) == (name == "test")


def test_every_question_has_four_speakers_of_its_play_and_the_answer_among_them(
    splits: dict[str, list[dict]],
) -> None:
    choosable = {name for name, count in SPEAKERS.items() if count >= module.MIN_SPEECHES} - {"ALL"}
    for row in (row for rows in splits.values() for row in of_kind(rows, "speaker")):
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
    rows = of_kind(splits["train"], "speaker")
    busiest = [max(row["choices"], key=lambda name: SPEAKERS[name]) == row["output"] for row in rows]
    assert sum(busiest) / len(rows) == pytest.approx(0.25, abs=0.04)
    assert Counter(row["label"] for row in rows).most_common()[-1][1] > 0.2 * len(rows)
    counts = Counter(speech.speaker for speech in play_speeches(split_plays(corpus)["Hamlet"]))
    assert counts["ANNA"] == SPEAKERS["ANNA"]


def test_a_next_line_question_offers_its_speech_s_next_line_and_three_others(corpus: str, splits) -> None:
    plays = {title: play_speeches(text) for title, text in split_plays(corpus).items()}
    where = {  # every line of the stand-in is unique: its play's line number, and its speech's
        line: (at, speech_at)
        for speeches in plays.values()
        for at, (speech_at, line) in enumerate(
            (speech_at, line) for speech_at, speech in enumerate(speeches) for line in speech.lines
        )
    }
    rows = [row for rows in splits.values() for row in of_kind(rows, "next_line")]
    assert len(rows) > 1000
    for row in rows:
        lines, choices, answer = quoted(row).split("\n"), row["choices"], row["output"]
        assert 1 <= len(lines) <= module.CONTEXT_LINES
        assert row["instruction"] == next_line_prompt(row["play"], quoted(row))
        assert choices[row["label"]] == answer and len(set(choices)) == 4
        # The quoted lines and the answer follow one another in one speech.
        assert [where[line] for line in [*lines, answer]] == [
            (where[lines[0]][0] + i, where[lines[0]][1]) for i in range(len(lines) + 1)
        ]
        for other in choices[: row["label"]] + choices[row["label"] + 1 :]:
            assert abs(where[other][0] - where[answer][0]) > module.NEAR_LINES
            assert abs(len(other) - len(answer)) <= module.LENGTH_SLACK * len(answer) + 0.5
        assert not any(a != b and a.startswith(b) for a in choices for b in choices)


def test_a_next_line_answer_is_told_by_neither_its_place_nor_its_length_nor_its_look(splits) -> None:
    rows = of_kind(splits["train"], "next_line")
    places = Counter(row["label"] for row in rows)
    ranks = Counter(sorted(map(len, row["choices"])).index(len(row["output"])) for row in rows)
    for counts in (places, ranks):
        assert sorted(counts) == [0, 1, 2, 3] and min(counts.values()) > 0.21 * len(rows)

    # Half the stand-in's lines that continue a speech start lowercase; a speech's first line never
    # does, so a distractor drawn from every line would start lowercase less often than the answer.
    def lowercase(lines: list[str]) -> float:
        return sum(line[0].islower() for line in lines) / len(lines)

    others = [c for row in rows for i, c in enumerate(row["choices"]) if i != row["label"]]
    assert lowercase(others) == pytest.approx(lowercase([row["output"] for row in rows]), abs=0.04)


def test_training_reads_both_kinds_mixed(splits: dict[str, list[dict]]) -> None:
    first = splits["train"][:50]
    assert {row["kind"] for row in first} == set(KINDS)
    for name in SPLITS:
        assert {row["kind"] for row in splits[name]} == set(KINDS)


def test_the_questions_are_a_function_of_the_corpus_and_the_seed(corpus: str, splits) -> None:
    assert question_splits(corpus, seed=7) == splits
    other = question_splits(corpus, seed=8)
    for kind in KINDS:
        assert of_kind(other["test"], kind) != of_kind(splits["test"], kind)
        assert {row["play"] for row in of_kind(other["test"], kind)} == set(TEST_PLAYS)


def test_the_command_writes_files_the_instruction_reader_reads(
    corpus: str, splits, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    source = tmp_path / "corpus.txt"
    source.write_text(corpus, encoding="utf-8")
    monkeypatch.setattr(module, "shakespeare_path", lambda: source)
    out = tmp_path / "questions"
    assert play_questions_main(["--out", str(out), "--seed", "7"]) == 0
    kinds = Counter(row["kind"] for row in splits["test"])
    said = f"test.jsonl: {len(splits['test']):,} questions on 6 plays ({kinds['speaker']:,} speaker, "
    assert said + f"{kinds['next_line']:,} next_line)" in capsys.readouterr().out
    written = {name: (out / f"{name}.jsonl").read_bytes() for name in SPLITS}
    rows = [json.loads(line) for line in written["test"].decode().splitlines()]
    assert rows == splits["test"]
    first = next(read_conversations(str(out / "train.jsonl")))
    row = splits["train"][0]
    assert first.messages == [
        {"role": "user", "content": row["instruction"]},
        {"role": "assistant", "content": row["output"]},
    ]
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
    for kind in KINDS:
        assert Counter(row["play"] for row in of_kind(splits["test"], kind)) == {
            title: module.TEST_PER_PLAY for title in TEST_PLAYS
        }
        validation = of_kind(splits["validation"], kind)
        assert len(validation) == module.VALIDATION_PER_PLAY * (len(PLAYS) - len(TEST_PLAYS))
        assert len(of_kind(splits["train"], kind)) > 15_000
    # small.yaml validates on the last tenth of the corpus: three test plays lie wholly inside it.
    assert text.index(plays["Othello"]) > 0.9 * len(text)
    assert all(
        row["output"] in {s.speaker for s in play_speeches(plays[row["play"]])}
        for row in of_kind(splits["test"], "speaker")
    )
