"""The chat markers as special tokens of every registered tokenizer: one id each, after the base's
ids, never produced by text, rebuilt from the spec."""

from __future__ import annotations

import string
from collections.abc import Callable

import numpy as np
import pytest

from minigpt.data import DataError, tokenizer_from_spec
from minigpt.data.tokenizer import (
    CHAT_TOKENS,
    TOKENIZERS,
    BPETokenizer,
    CharTokenizer,
    ChatTokenizer,
    CompactGPT2Tokenizer,
    Tokenizer,
    with_chat_tokens,
)

TEXT = "Hello, world! How are you today? <|user|> is only text here.\n"


def _char(request: pytest.FixtureRequest) -> Tokenizer:
    return CharTokenizer.from_texts([string.printable])


def _bpe(request: pytest.FixtureRequest) -> Tokenizer:
    return BPETokenizer.learn([TEXT * 30], vocab_size=290)


def _gpt2(request: pytest.FixtureRequest) -> Tokenizer:
    return request.getfixturevalue("gpt2")


def _gpt2_compact(request: pytest.FixtureRequest) -> Tokenizer:
    return CompactGPT2Tokenizer.from_texts([TEXT], request.getfixturevalue("gpt2"))


BASES: dict[str, Callable[[pytest.FixtureRequest], Tokenizer]] = {
    "gpt2": _gpt2,
    "gpt2-compact": _gpt2_compact,
    "char": _char,
    "bpe": _bpe,
}
"""A small tokenizer of each registered name."""


def test_every_registered_tokenizer_is_covered() -> None:
    assert set(BASES) == set(TOKENIZERS)


@pytest.fixture(params=list(BASES))
def base(request: pytest.FixtureRequest) -> Tokenizer:
    if request.param.startswith("gpt2"):
        request.applymarker(pytest.mark.gpt2_ranks)
    return BASES[request.param](request)


def test_markers_are_new_ids_after_the_base_ones(base: Tokenizer) -> None:
    chat = with_chat_tokens(base)
    assert chat.n_vocab == base.n_vocab + len(CHAT_TOKENS)
    assert list(chat.ids.values()) == list(range(base.n_vocab, chat.n_vocab))
    assert (chat.name, chat.eot_id, chat.end_id) == (base.name, base.eot_id, chat.ids["end"])
    assert isinstance(chat, Tokenizer)


def test_a_marker_is_one_id_in_markup_and_text_in_a_message(base: Tokenizer) -> None:
    chat = with_chat_tokens(base)
    (markup,) = chat.encode_markup(["<|user|>Hello<|end|><|assistant|>"])
    hello = base.encode("Hello")
    assert markup.tolist() == [chat.ids["user"], *hello, chat.end_id, chat.ids["assistant"]]
    # In plain text the spelling is text, as the base reads it: no message can forge a turn.
    plain = chat.encode(TEXT)
    assert plain == base.encode(TEXT) and max(plain) < base.n_vocab
    assert chat.decode(markup.tolist()) == "<|user|>Hello<|end|><|assistant|>"
    assert chat.decode(plain) == TEXT


def test_the_spec_rebuilds_the_same_ids(base: Tokenizer) -> None:
    chat = with_chat_tokens(base)
    spec = chat.spec()
    assert spec["name"] == base.name and spec["chat_tokens"] == CHAT_TOKENS
    rebuilt = tokenizer_from_spec(spec)
    assert isinstance(rebuilt, ChatTokenizer) and type(rebuilt.base) is type(base)
    assert (rebuilt.ids, rebuilt.n_vocab) == (chat.ids, chat.n_vocab)
    assert (
        rebuilt.encode_markup(["<|system|>Hello"])[0].tolist()
        == chat.encode_markup(["<|system|>Hello"])[0].tolist()
    )
    # A spec without markers is the base tokenizer, as before.
    assert not isinstance(tokenizer_from_spec(base.spec()), ChatTokenizer)


def test_markers_stand_for_no_bytes(base: Tokenizer) -> None:
    chat = with_chat_tokens(base)
    lengths = chat.byte_lengths()
    assert lengths.shape == (chat.n_vocab,)
    np.testing.assert_array_equal(lengths[: base.n_vocab], base.byte_lengths())
    assert not lengths[base.n_vocab :].any()


def test_a_bpe_that_has_a_marker_already_keeps_its_id() -> None:
    base = BPETokenizer.learn([TEXT * 30], vocab_size=290, special_tokens=["<|endoftext|>", "<|end|>"])
    chat = with_chat_tokens(base)
    assert chat.end_id == 1 and chat.n_vocab == base.n_vocab + 3
    assert chat.encode_markup(["<|end|>"])[0].tolist() == [1]
    assert 1 not in chat.encode("a <|end|> b")  # still text in a message
    assert tokenizer_from_spec(chat.spec()).ids == chat.ids


def test_ids_outside_the_vocabulary_and_bad_markers_are_data_errors() -> None:
    chat = with_chat_tokens(CharTokenizer.from_texts([string.printable]))
    with pytest.raises(DataError, match=f"token id {chat.n_vocab} is outside"):
        chat.decode([chat.n_vocab])
    with pytest.raises(DataError, match="must be distinct"):
        ChatTokenizer(chat.base, {"user": "<u>", "assistant": "<u>", "end": "<e>"})
    with pytest.raises(DataError, match="include 'end'"):
        ChatTokenizer(chat.base, {"user": "<u>"})
    assert with_chat_tokens(chat) is chat
