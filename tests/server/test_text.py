"""A choice's text as tokens arrive: stop strings found across tokens, never shown in part."""

from __future__ import annotations

from minigpt.server.engine import ChoiceText


def chars(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def feed(text: ChoiceText, s: str) -> list[str]:
    return [text.push(ord(c)) for c in s]


def test_a_stop_string_across_tokens_is_held_back_then_cut() -> None:
    text = ChoiceText(chars, ["END"])
    assert feed(text, "abEN") == ["a", "b", "", ""]  # "EN" may begin "END": held back
    assert text.push(ord("D")) == "" and text.finish_reason == "stop"


def test_held_text_that_is_not_a_stop_after_all_is_released() -> None:
    text = ChoiceText(chars, ["END", "\n\n"])
    assert feed(text, "aEx\nb") == ["a", "", "Ex", "", "\nb"]
    assert feed(text, "E") == [""] and text.end("length") == "E" and text.finish_reason == "length"


def test_the_earliest_of_several_stops_wins() -> None:
    text = ChoiceText(chars, ["b", "ab"])
    assert feed(text, "ab") == ["", ""] and text.finish_reason == "stop"  # "a" held: it may begin "ab"
