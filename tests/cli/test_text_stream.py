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
