"""gpt2-compact: GPT-2's tokens renumbered over a corpus, closed under GPT-2's merges (the first
version: byte fallback), specs and errors."""

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
from minigpt.data.gpt2_encoding import R50K_PATTERN

CORPUS = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n"
)
BYTE_TOKENS = 256


OUTSIDE = [
    "xylophone",
    "🙂",
    "Speak, zephyrous 🦄 naïve 你好!",
    " unheard-of words\r\n\tend",
    "<|endoftext|>",
]
"""Texts with GPT-2 tokens the corpus lacks: new words, emoji, accents, CJK, line breaks, a literal
end-of-text."""


@pytest.fixture
def compact(gpt2: GPT2Tokenizer) -> CompactGPT2Tokenizer:
    """The current version: closed under GPT-2's merges."""
    return CompactGPT2Tokenizer.from_texts([CORPUS], gpt2)


@pytest.fixture
def first(gpt2: GPT2Tokenizer) -> CompactGPT2Tokenizer:
    """The first version: the corpus's tokens only, others spelled in bytes."""
    return CompactGPT2Tokenizer.from_texts([CORPUS], gpt2, closed=False)


def merged_on_the_way(token: bytes, encoding: tiktoken.Encoding) -> set[int]:
    """Every token GPT-2's BPE forms while merging `token`'s bytes into it, `token` included:
    merges taken one at a time, the lowest rank first, as tiktoken does."""
    ranks, parts, formed = encoding._mergeable_ranks, [bytes([b]) for b in token], set()
    while len(parts) > 1:
        pairs = [(ranks.get(parts[i] + parts[i + 1], 1 << 30), i) for i in range(len(parts) - 1)]
        _, i = min(pairs)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        formed.add(ranks[parts[i]])
    return formed


def test_vocabulary_is_the_corpus_tokens_those_merged_on_the_way_bytes_and_endoftext(
    compact: CompactGPT2Tokenizer, first: CompactGPT2Tokenizer, gpt2_encoding: tiktoken.Encoding
) -> None:
    used = set(gpt2_encoding.encode_ordinary(CORPUS))
    singles = {gpt2_encoding.encode_single_token(bytes([b])) for b in range(256)}
    assert first.gpt2_ids.tolist() == sorted(used | singles | {50256}) and not first.closed
    assert first.n_vocab == len(used - singles) + BYTE_TOKENS + 1
    on_the_way = set().union(
        *(merged_on_the_way(gpt2_encoding.decode_single_token_bytes(t), gpt2_encoding) for t in used)
    )
    assert on_the_way - used  # the corpus's words are merged through tokens it never has
    assert compact.gpt2_ids.tolist() == sorted(used | on_the_way | singles | {50256}) and compact.closed
    for tokenizer in (compact, first):
        assert tokenizer.eot_id == tokenizer.n_vocab - 1
        assert tokenizer.decode([tokenizer.eot_id]) == "<|endoftext|>"
        assert isinstance(tokenizer, Tokenizer) and tokenizer.name == "gpt2-compact"


@pytest.mark.parametrize("version", ["compact", "first"])
def test_corpus_text_gets_exactly_gpt2s_tokens(
    version: str, request: pytest.FixtureRequest, gpt2_encoding: tiktoken.Encoding
) -> None:
    compact = request.getfixturevalue(version)
    for text in (CORPUS, CORPUS.split("\n\n")[1], "Speak, speak."):  # made of corpus tokens
        ids = compact.encode(text)
        assert compact.gpt2_ids[ids].tolist() == gpt2_encoding.encode_ordinary(text)
        assert compact.decode(ids) == text
    arrays = compact.encode_to_arrays([CORPUS, ""])
    assert [a.dtype for a in arrays] == [np.uint32] * 2 and arrays[1].size == 0
    assert arrays[0].tolist() == compact.encode(CORPUS)


def varied_texts(seed: int, count: int, length: int) -> list[str]:
    """Random texts over letters, spaces, punctuation, digits, line breaks, accents, CJK and emoji:
    GPT-2 pre-tokens of every kind, and many merges."""
    alphabet = list("abcdefghijklmnopqrstuvwxyz     THE.,;:'!?-\n\t0123\r") + list("éàöñß—日本語你好😀🦄")
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(alphabet, length)) for _ in range(count)]


def test_a_corpus_encodes_through_the_closed_bpe_exactly_as_through_gpt2s(gpt2: GPT2Tokenizer) -> None:
    """The closed BPE lacks only merges that never applied in the corpus, so on its text it gives
    GPT-2's tokens (through tiktoken, as prepare writes them), renumbered."""
    corpus = [CORPUS, *varied_texts(0, 8, 400)]
    compact = CompactGPT2Tokenizer.from_texts(corpus, gpt2)
    through_gpt2 = [compact.to_compact(tokens).tolist() for tokens in gpt2.encode_to_arrays(corpus)]
    assert [ids.tolist() for ids in compact.encode_to_arrays(corpus)] == through_gpt2
    assert compact.decode(through_gpt2[1]) == corpus[1]


def restricted_gpt2(compact: CompactGPT2Tokenizer, encoding: tiktoken.Encoding) -> tiktoken.Encoding:
    """GPT-2's BPE in tiktoken with only the vocabulary's tokens: the merges that make them."""
    ranks = {encoding.decode_single_token_bytes(int(t)): int(t) for t in compact.gpt2_ids[:-1]}
    return tiktoken.Encoding("restricted", pat_str=R50K_PATTERN, mergeable_ranks=ranks, special_tokens={})


@pytest.mark.parametrize("text", [*OUTSIDE, *varied_texts(1, 2, 200)])
def test_other_text_gets_gpt2s_merges_that_make_vocabulary_tokens(
    compact: CompactGPT2Tokenizer, gpt2_encoding: tiktoken.Encoding, text: str
) -> None:
    ids = compact.encode(text)
    assert compact.decode(ids) == text
    assert all(0 <= i < compact.n_vocab for i in ids) and compact.eot_id not in ids
    expected = restricted_gpt2(compact, gpt2_encoding).encode_ordinary(text)
    assert compact.gpt2_ids[ids].tolist() == expected


def test_other_words_stop_at_tokens_merged_on_the_way(
    compact: CompactGPT2Tokenizer, first: CompactGPT2Tokenizer
) -> None:
    """GPT-2 makes " Citizens" from " Citizen" (a corpus token) and "s", and " resolve" through
    " res" and "ol" (on the way to " resolved"): the closed version stops there, where the first
    version spells GPT-2's token in its bytes."""
    assert [compact.decode([i]) for i in compact.encode(" Citizens")] == [" Citizen", "s"]
    assert [compact.decode([i]) for i in compact.encode(" resolve")] == [" res", "ol", "v", "e"]
    assert [first.decode([i]) for i in first.encode(" resolve")] == list(" resolve")


def test_the_closed_version_maps_only_its_own_gpt2_tokens(
    compact: CompactGPT2Tokenizer, gpt2_encoding: tiktoken.Encoding
) -> None:
    """Outside its vocabulary a GPT-2 token has no compact spelling of its own: the split depends
    on the text around it."""
    (xylophone,) = [t for t in gpt2_encoding.encode_ordinary(" xylophone") if t not in compact.gpt2_ids][:1]
    with pytest.raises(DataError, match=f"GPT-2 token {xylophone} is not in this gpt2-compact vocabulary"):
        compact.to_compact(np.array([xylophone], dtype=np.uint32))


@pytest.mark.parametrize("text", OUTSIDE)
def test_the_first_version_spells_unknown_tokens_in_bytes_and_round_trips(
    first: CompactGPT2Tokenizer, gpt2_encoding: tiktoken.Encoding, text: str
) -> None:
    ids = first.encode(text)
    assert first.decode(ids) == text
    assert all(0 <= i < first.n_vocab for i in ids) and first.eot_id not in ids
    assert first.gpt2_ids[ids].tolist() == byte_fallback(first, gpt2_encoding, text)


def byte_fallback(first: CompactGPT2Tokenizer, encoding: tiktoken.Encoding, text: str) -> list[int]:
    """The first version's GPT-2 tokens of `text`: each GPT-2 token kept when in the vocabulary,
    else spelled with its bytes."""
    expected = []
    for token in encoding.encode_ordinary(text):
        if token in first.gpt2_ids:
            expected.append(token)
        else:
            expected += [
                encoding.encode_single_token(bytes([b])) for b in encoding.decode_single_token_bytes(token)
            ]
    return expected


def test_byte_fallback_matches_a_token_by_token_reference(gpt2: GPT2Tokenizer) -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50256, size=3000).astype(np.uint32)
    small = CompactGPT2Tokenizer.from_gpt2_tokens([tokens[::3]], gpt2, closed=False)
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
    assert spec["merges"] == "closed"  # the version: a first-version spec has no "merges"
    assert len(base64.b64decode(spec["gpt2_ids"])) == 2 * compact.n_vocab
    rebuilt = tokenizer_from_spec(spec)
    assert isinstance(rebuilt, CompactGPT2Tokenizer) and rebuilt.closed
    assert rebuilt.gpt2_ids.tolist() == compact.gpt2_ids.tolist() and rebuilt.spec() == spec
    assert rebuilt.encode(CORPUS + " furry🙂") == compact.encode(CORPUS + " furry🙂")


def test_a_first_version_spec_still_rebuilds_the_first_version(
    first: CompactGPT2Tokenizer, gpt2_encoding: tiktoken.Encoding
) -> None:
    """Checkpoints and prepared data from before the closed version keep their vocabulary and
    their spelling of other text."""
    used = set(gpt2_encoding.encode_ordinary(CORPUS)) | set(range(256)) | {50256}
    spec = {
        "name": "gpt2-compact",
        "gpt2": {
            "name": "gpt2",
            "encoding": "r50k_base",
            "n_vocab": 50257,
            "sha256": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        },
        "n_vocab": len(used),
        "gpt2_ids": _packed(sorted(used)),
    }
    old = tokenizer_from_spec(spec)
    assert isinstance(old, CompactGPT2Tokenizer) and not old.closed and old.spec() == spec
    assert old.spec() == first.spec()
    for text in [CORPUS, *OUTSIDE, " furry"]:
        assert old.gpt2_ids[old.encode(text)].tolist() == byte_fallback(old, gpt2_encoding, text)


def _spec_with(compact: CompactGPT2Tokenizer, **changes: object) -> dict:
    return {**compact.spec(), **changes}


def _packed(ids: list[int]) -> str:
    return base64.b64encode(np.array(ids, dtype="<u2").tobytes()).decode()


def test_bad_specs_are_data_errors(compact: CompactGPT2Tokenizer, first: CompactGPT2Tokenizer) -> None:
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
        (_spec_with(compact, merges="all"), "has merges 'all'; this version knows 'closed'"),
        (_spec_with(first, merges="closed"), "must hold the two tokens GPT-2 merges into each"),
    ]
    for spec, message in bad:
        with pytest.raises(DataError, match=message.replace("|", r"\|")):
            tokenizer_from_spec(spec)


def test_decode_rejects_an_id_outside_the_vocabulary(compact: CompactGPT2Tokenizer) -> None:
    with pytest.raises(DataError, match=f"{compact.n_vocab} is outside the gpt2-compact vocabulary"):
        compact.decode([0, compact.n_vocab])


def test_build_by_name(gpt2_encoding: tiktoken.Encoding) -> None:
    built = build_tokenizer("gpt2-compact", texts=iter([CORPUS, "more text"]))
    assert isinstance(built, CompactGPT2Tokenizer) and built.closed
    assert built.gpt2_ids[built.encode("more text")].tolist() == gpt2_encoding.encode_ordinary("more text")
    assert DataConfig(tokenizer="gpt2-compact").tokenizer == "gpt2-compact"
    with pytest.raises(ValueError, match="built from corpus text"):
        build_tokenizer("gpt2-compact")
