"""gpt2-compact: GPT-2's tokens renumbered over a corpus, byte fallback, specs and errors."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import tiktoken

from minigpt.data import (
    CompactGPT2Tokenizer,
    DataConfig,
    DataError,
    GPT2Tokenizer,
    Tokenizer,
    build_tokenizer,
    tokenizer_from_spec,
)

CORPUS = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n"
)
BYTE_TOKENS = 256


@pytest.fixture
def compact(gpt2: GPT2Tokenizer) -> CompactGPT2Tokenizer:
    return CompactGPT2Tokenizer.from_texts([CORPUS], gpt2)


def test_vocabulary_is_the_corpus_tokens_bytes_and_endoftext(
    compact: CompactGPT2Tokenizer, gpt2_encoding: tiktoken.Encoding
) -> None:
    used = set(gpt2_encoding.encode_ordinary(CORPUS))
    singles = {gpt2_encoding.encode_single_token(bytes([b])) for b in range(256)}
    assert compact.gpt2_ids.tolist() == sorted(used | singles | {50256})
    assert compact.n_vocab == len(used - singles) + BYTE_TOKENS + 1
    assert compact.eot_id == compact.n_vocab - 1 and compact.decode([compact.eot_id]) == "<|endoftext|>"
    assert isinstance(compact, Tokenizer) and compact.name == "gpt2-compact"


def test_corpus_text_gets_exactly_gpt2s_tokens(
    compact: CompactGPT2Tokenizer, gpt2_encoding: tiktoken.Encoding
) -> None:
    for text in (CORPUS, CORPUS.split("\n\n")[1], "Speak, speak."):  # made of corpus tokens
        ids = compact.encode(text)
        assert compact.gpt2_ids[ids].tolist() == gpt2_encoding.encode_ordinary(text)
        assert compact.decode(ids) == text
    arrays = compact.encode_to_arrays([CORPUS, ""])
    assert [a.dtype for a in arrays] == [np.uint32] * 2 and arrays[1].size == 0
    assert arrays[0].tolist() == compact.encode(CORPUS)


@pytest.mark.parametrize(
    "text",
    ["xylophone", "🙂", "Speak, zephyrous 🦄 naïve 你好!", " unheard-of words\r\n\tend", "<|endoftext|>"],
)
def test_unknown_tokens_fall_back_to_bytes_and_round_trip(
    compact: CompactGPT2Tokenizer, gpt2_encoding: tiktoken.Encoding, text: str
) -> None:
    ids = compact.encode(text)
    assert compact.decode(ids) == text
    assert all(0 <= i < compact.n_vocab for i in ids) and compact.eot_id not in ids
    # Each GPT-2 token is either kept (when in the vocabulary) or spelled with its bytes.
    expected = []
    for token in gpt2_encoding.encode_ordinary(text):
        if token in compact.gpt2_ids:
            expected.append(token)
        else:
            expected += [
                gpt2_encoding.encode_single_token(bytes([b]))
                for b in gpt2_encoding.decode_single_token_bytes(token)
            ]
    assert compact.gpt2_ids[ids].tolist() == expected


def test_byte_fallback_matches_a_token_by_token_reference(gpt2: GPT2Tokenizer) -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50256, size=3000).astype(np.uint32)
    small = CompactGPT2Tokenizer.from_gpt2_tokens([tokens[::3]], gpt2)
    encoding = gpt2._encoding
    reference = []
    for token in tokens.tolist():
        if token in small.gpt2_ids:
            reference.append(int(np.searchsorted(small.gpt2_ids, token)))
        else:
            for b in encoding.decode_single_token_bytes(token):
                reference.append(
                    int(np.searchsorted(small.gpt2_ids, encoding.encode_single_token(bytes([b]))))
                )
    assert small.to_compact(tokens).tolist() == reference


def test_spec_rebuilds_the_same_tokenizer(compact: CompactGPT2Tokenizer, gpt2: GPT2Tokenizer) -> None:
    spec = json.loads(json.dumps(compact.spec()))
    assert spec["gpt2"] == gpt2.spec()  # names GPT-2's ranks by their sha256
    assert len(base64.b64decode(spec["gpt2_ids"])) == 2 * compact.n_vocab
    rebuilt = tokenizer_from_spec(spec)
    assert isinstance(rebuilt, CompactGPT2Tokenizer)
    assert rebuilt.gpt2_ids.tolist() == compact.gpt2_ids.tolist() and rebuilt.spec() == spec
    assert rebuilt.encode(CORPUS + "🙂") == compact.encode(CORPUS + "🙂")


def _spec_with(compact: CompactGPT2Tokenizer, **changes: object) -> dict:
    return {**compact.spec(), **changes}


def _packed(ids: list[int]) -> str:
    return base64.b64encode(np.array(ids, dtype="<u2").tobytes()).decode()


def test_bad_specs_are_data_errors(compact: CompactGPT2Tokenizer) -> None:
    ids = compact.gpt2_ids.tolist()
    bad = [
        (_spec_with(compact, gpt2={**compact.spec()["gpt2"], "sha256": "0" * 64}), "GPT-2 vocabulary"),
        (_spec_with(compact, gpt2_ids="not base64!"), "no valid 'gpt2_ids'"),
        (_spec_with(compact, gpt2_ids=123), "no valid 'gpt2_ids'"),
        (_spec_with(compact, gpt2_ids=base64.b64encode(b"abc").decode()), "no valid 'gpt2_ids'"),
        (_spec_with(compact, n_vocab=5), "says n_vocab 5 but lists"),
        (_spec_with(compact, gpt2_ids=_packed(ids[::-1])), "must increase strictly"),
        (_spec_with(compact, gpt2_ids=_packed(ids[1:]), n_vocab=len(ids) - 1), "256 single-byte tokens"),
        (_spec_with(compact, gpt2_ids=_packed(ids[:-1]), n_vocab=len(ids) - 1), "<|endoftext|>"),
        (_spec_with(compact, gpt2_ids=_packed([*ids, 60000]), n_vocab=len(ids) + 1), "within 0..50256"),
    ]
    for spec, message in bad:
        with pytest.raises(DataError, match=message.replace("|", r"\|")):
            tokenizer_from_spec(spec)


def test_decode_rejects_an_id_outside_the_vocabulary(compact: CompactGPT2Tokenizer) -> None:
    with pytest.raises(DataError, match=f"{compact.n_vocab} is outside the gpt2-compact vocabulary"):
        compact.decode([0, compact.n_vocab])


def test_build_by_name(gpt2_encoding: tiktoken.Encoding) -> None:
    built = build_tokenizer("gpt2-compact", texts=iter([CORPUS, "more text"]))
    assert isinstance(built, CompactGPT2Tokenizer)
    assert built.gpt2_ids[built.encode("more text")].tolist() == gpt2_encoding.encode_ordinary("more text")
    assert DataConfig(tokenizer="gpt2-compact").tokenizer == "gpt2-compact"
    with pytest.raises(ValueError, match="built from corpus text"):
        build_tokenizer("gpt2-compact")
