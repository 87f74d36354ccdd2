from minigpt.common.text import TextStream
from minigpt.data import CompactGPT2Tokenizer, GPT2Tokenizer


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


def test_a_real_bpe_decoder_streams_whole_characters(gpt2: GPT2Tokenizer) -> None:
    # Characters the corpus never used are spelled as GPT-2's byte tokens, one byte per token.
    compact = CompactGPT2Tokenizer.from_texts(
        ["ROMEO:\nBut soft, what light through yonder window breaks?\n"], gpt2
    )
    text = "ROMEO: naïve — “soft” 🙂 light"
    ids = compact.encode(text)
    stream = TextStream(compact.decode)
    pieces = [stream.push(token) for token in ids]
    assert "".join(pieces) + stream.flush() == text
    assert not any("\ufffd" in piece for piece in pieces)
    assert pieces.count("") >= 6  # the bytes of ï, —, “, ”, 🙂 were held back until complete


def test_text_ends_before_a_stop_string_and_what_may_start_one_is_held_back() -> None:
    pieces = ["Ay", "\n", "me", "\n", "\nROMEO", ":"]
    stream = TextStream(lambda ids: "".join(pieces[i] for i in ids), stops=["\n\n"])
    released = [stream.push(i) for i in range(4)]
    assert released == ["Ay", "", "\nme", ""]  # each line break held until the next token
    assert not stream.stopped
    assert stream.push(4) == "" and stream.stopped  # the held break starts the stop: nothing more
    assert stream.push(5) == "" and stream.flush() == ""


def test_a_stop_string_inside_one_token_cuts_it_and_an_unfinished_one_is_released_at_the_end() -> None:
    stream = TextStream(lambda ids: "so\n\nthen", stops=["\n\n", "END"])
    assert stream.push(0) == "so" and stream.stopped
    stream = TextStream(lambda ids: "to\n", stops=["\n\n"])
    assert stream.push(0) == "to" and stream.flush() == "\n"
