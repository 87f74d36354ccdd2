"""Tokenizers: exact GPT-2 ids, round trips, errors a user can hit, and specs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str

from minigpt.data import (
    CharTokenizer,
    DataError,
    GPT2Tokenizer,
    Tokenizer,
    build_tokenizer,
    tokenizer_from_spec,
)
from minigpt.data.gpt2_encoding import R50K_PATTERN, encoding_from_ranks
from minigpt.data.tokenizer.pretokens import split_at_safe_breaks

TRICKY = "Hello, wörld! 你好 🙂\n\n\tTabs  and   spaces   \r\nend's we'll 1234567 <|endoftext|> x  \n"


def test_gpt2_known_ids(gpt2: GPT2Tokenizer) -> None:
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" the") == [262]
    assert (gpt2.n_vocab, gpt2.eot_id) == (50257, 50256)


def test_gpt2_round_trip_tricky_text(gpt2: GPT2Tokenizer) -> None:
    ids = gpt2.encode(TRICKY)
    assert gpt2.decode(ids) == TRICKY
    assert all(0 <= i < gpt2.n_vocab for i in ids)


def test_gpt2_treats_endoftext_in_text_as_plain_text(gpt2: GPT2Tokenizer) -> None:
    ids = gpt2.encode("a<|endoftext|>b")
    assert gpt2.eot_id not in ids
    assert gpt2.decode(ids) == "a<|endoftext|>b"
    assert gpt2.decode([gpt2.eot_id]) == "<|endoftext|>"


def test_gpt2_parallel_chunks_equal_one_pass(gpt2_encoding: tiktoken.Encoding) -> None:
    text = (
        "First Citizen:\nBefore we proceed any further, hear me speak.  \n\nAll:\nSpeak, speak.\n" * 200
    ) + TRICKY
    chunked = GPT2Tokenizer(gpt2_encoding, chunk_chars=64, num_threads=2)
    assert len(split_at_safe_breaks(text, 64)) > 10
    assert chunked.encode(text) == gpt2_encoding.encode_ordinary(text)
    batch = chunked.encode_to_arrays([text, "", "x"])
    assert [a.dtype for a in batch] == [np.uint32] * 3
    assert [a.tolist() for a in batch] == [gpt2_encoding.encode_ordinary(t) for t in (text, "", "x")]


def test_our_pattern_matches_tiktoken_r50k(ranks_bytes: bytes) -> None:
    """Our regex is spelled for older tiktoken; it must split exactly like the installed one."""
    ours = encoding_from_ranks(ranks_bytes, "test")
    assert ours._pat_str == R50K_PATTERN
    theirs = tiktoken.Encoding(
        "theirs", pat_str=r50k_pat_str, mergeable_ranks=ours._mergeable_ranks, special_tokens={}
    )
    samples = [
        TRICKY,
        "  leading",
        "trailing   ",
        "a \n\n b",
        "x\u00a0y\u2003z",
        "I'M he's THEY'LL",
        "3.14e10",
    ]
    for text in samples:
        assert ours.encode_ordinary(text) == theirs.encode_ordinary(text), text


def test_gpt2_decode_rejects_unknown_id(gpt2: GPT2Tokenizer) -> None:
    with pytest.raises(DataError, match="50300 is outside the gpt2 vocabulary"):
        gpt2.decode([1, 50300])


def test_char_round_trip_and_vocab() -> None:
    text = "hello world\nÄpfel 🙂"
    tok = CharTokenizer.from_texts([text, "zz"])
    assert tok.chars == "".join(sorted(set(text + "zz")))
    assert tok.eot_id is None and tok.n_vocab == len(tok.chars)
    ids = tok.encode(text)
    assert ids == [tok.chars.index(c) for c in text]
    assert tok.decode(ids) == text
    assert [a.tolist() for a in tok.encode_to_arrays([text, ""])] == [ids, []]


def test_char_unknown_character_is_a_clear_error() -> None:
    tok = CharTokenizer.from_texts(["abc"])
    with pytest.raises(DataError, match=r"character 'x' \(U\+0078\) at position 1 is not in"):
        tok.encode("axb")


def test_char_rejects_unsorted_vocab() -> None:
    with pytest.raises(DataError, match="sorted"):
        CharTokenizer("ba")


@pytest.mark.parametrize("name", [pytest.param("gpt2", marks=pytest.mark.gpt2_ranks), "char"])
def test_spec_round_trip(name: str, request: pytest.FixtureRequest) -> None:
    # GPT-2's tokenizer only for its own case: the char case needs no network.
    original: Tokenizer = (
        request.getfixturevalue("gpt2")
        if name == "gpt2"
        else CharTokenizer.from_texts(["To be, or not to be"])
    )
    spec = json.loads(json.dumps(original.spec()))  # must survive JSON
    rebuilt = tokenizer_from_spec(spec)
    assert isinstance(rebuilt, type(original))
    assert rebuilt.spec() == original.spec()
    assert rebuilt.encode("to be or not") == original.encode("to be or not")


def test_bad_specs_and_names_raise_data_error() -> None:
    with pytest.raises(DataError, match="valid names: gpt2, gpt2-compact, char"):
        tokenizer_from_spec({"name": "sentencepiece"})
    with pytest.raises(DataError, match="does not know"):
        tokenizer_from_spec({"name": "gpt2", "n_vocab": 50304})
    with pytest.raises(DataError, match="valid names: gpt2, gpt2-compact, char, bpe"):
        build_tokenizer("wordpiece")
    assert isinstance(build_tokenizer("char", texts=["ab"]), CharTokenizer)
