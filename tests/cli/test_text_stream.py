from minigpt.cli.generate import TextStream


def test_partial_utf8_characters_are_held_back() -> None:
    # A byte-level decoder: the snowman is three bytes, delivered one token at a time.
    data = "a☃b".encode()

    def decode(ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    stream = TextStream(decode)
    pieces = [stream.push(b) for b in data]
    assert pieces == ["a", "", "", "☃", "b"]
    assert stream.flush() == ""


def test_flush_releases_an_unfinished_tail() -> None:
    stream = TextStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    assert stream.push(0xE2) == ""
    assert stream.flush() == "\ufffd"
