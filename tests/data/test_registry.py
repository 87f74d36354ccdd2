"""A tokenizer defined outside the package is one class plus one registration line away from ``prepare``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from minigpt.data import (
    BaseTokenizer,
    DataConfig,
    DataError,
    GPT2Tokenizer,
    PreparedData,
    build_tokenizer,
    prepare,
    register_tokenizer,
    tokenizer_from_spec,
)
from minigpt.data.tokenizer import TOKENIZERS, IdMap, Tokenizer

DOCS = ["The first story.\nIt ends here.", "A second, shorter one 🙂", "Naïve third: <|endoftext|>"]


class ByteTokenizer(BaseTokenizer):
    """One id per UTF-8 byte: the id is the byte value; no end-of-text token, nothing read off the corpus."""

    name = "test-bytes"
    n_vocab = 256
    eot_id = None

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(text.encode(), dtype=np.uint8).astype(np.uint32) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(self._checked_ids(ids)).decode(errors="replace")

    def spec(self) -> dict[str, Any]:
        return {"name": self.name}

    @classmethod
    def from_spec(cls, spec: dict[str, Any], tokenizer_path: str | None = None) -> ByteTokenizer:
        return cls()

    @classmethod
    def build(
        cls, texts: Iterable[str] | None, *, tokenizer_path: str | None = None, num_threads: int | None = None
    ) -> ByteTokenizer:
        return cls()


class CorpusBytesTokenizer(BaseTokenizer):
    """The byte values a corpus uses, numbered densely: ``prepare`` encodes with :class:`ByteTokenizer`,
    reads the vocabulary off its ids and renumbers them, the way gpt2-compact does with GPT-2's."""

    name = "test-corpus-bytes"
    eot_id = None

    def __init__(self, byte_values: Sequence[int] | np.ndarray) -> None:
        self.byte_values = np.asarray(byte_values, dtype=np.uint8)
        self.n_vocab = len(self.byte_values)
        self._ids_by_byte = np.full(256, self.n_vocab, dtype=np.uint32)
        self._ids_by_byte[self.byte_values] = np.arange(self.n_vocab, dtype=np.uint32)

    def renumber(self, byte_ids: np.ndarray) -> np.ndarray:
        ids = self._ids_by_byte[byte_ids]
        if np.any(ids == self.n_vocab):
            raise DataError("text holds a byte outside the vocabulary")
        return ids

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return [self.renumber(ids) for ids in ByteTokenizer().encode_to_arrays(texts)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.byte_values[self._checked_ids(ids)].tobytes().decode(errors="replace")

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.byte_values.tolist()}

    @classmethod
    def from_spec(cls, spec: dict[str, Any], tokenizer_path: str | None = None) -> CorpusBytesTokenizer:
        return cls(spec["bytes"])

    @classmethod
    def build(
        cls, texts: Iterable[str] | None, *, tokenizer_path: str | None = None, num_threads: int | None = None
    ) -> CorpusBytesTokenizer:
        return cls(sorted({byte for text in texts or () for byte in text.encode()}))

    @classmethod
    def corpus_encoder(
        cls, texts: Iterable[str], *, tokenizer_path: str | None = None, num_threads: int | None = None
    ) -> Tokenizer:
        return ByteTokenizer()

    @classmethod
    def from_corpus_tokens(
        cls, encoder: Tokenizer, token_arrays: Iterator[np.ndarray]
    ) -> tuple[Tokenizer, IdMap | None]:
        used = np.zeros(256, dtype=bool)
        for byte_ids in token_arrays:
            used[byte_ids] = True
        tokenizer = cls(np.flatnonzero(used))
        return tokenizer, tokenizer.renumber


@pytest.fixture
def registered() -> Iterator[None]:
    """The two test tokenizers, registered for one test only."""
    try:
        register_tokenizer(ByteTokenizer)  # all that adding a tokenizer takes, besides the class
        register_tokenizer(CorpusBytesTokenizer)
        yield
    finally:
        TOKENIZERS.pop(ByteTokenizer.name, None)
        TOKENIZERS.pop(CorpusBytesTokenizer.name, None)


def _jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


def _all_tokens(prepared: PreparedData) -> np.ndarray:
    return np.concatenate([prepared.tokens("train"), prepared.tokens("val")])


def test_prepare_writes_a_registered_tokenizers_ids(
    tmp_path: Path, data_cache: Path, registered: None
) -> None:
    config = DataConfig(
        source=str(_jsonl(tmp_path / "d.jsonl", DOCS)), tokenizer="test-bytes", val_fraction=0.25
    )
    prepared = prepare(config)
    text = "".join(DOCS)  # no end-of-text id, so documents simply follow each other
    tokens = _all_tokens(prepared)
    assert tokens.dtype == np.uint16 and tokens.tolist() == list(text.encode())
    assert prepared.num_tokens("val") == round(len(text.encode()) * 0.25)
    assert "-test-bytes-" in prepared.directory.name
    rebuilt = tokenizer_from_spec(json.loads(json.dumps(prepared.meta["tokenizer"])))
    assert isinstance(rebuilt, ByteTokenizer) and rebuilt.decode(tokens.tolist()) == text
    assert isinstance(prepared.tokenizer(), ByteTokenizer)
    assert prepare(config).directory == prepared.directory  # the cache key works for it too


def test_prepare_derives_a_registered_tokenizer_from_the_corpus_tokens(
    tmp_path: Path, data_cache: Path, registered: None
) -> None:
    source = str(_jsonl(tmp_path / "d.jsonl", DOCS))
    prepared = prepare(DataConfig(source=source, tokenizer="test-corpus-bytes", val_fraction=0.25))
    text = "".join(DOCS)
    tokenizer = tokenizer_from_spec(prepared.meta["tokenizer"])
    assert isinstance(tokenizer, CorpusBytesTokenizer)
    assert tokenizer.byte_values.tolist() == sorted(set(text.encode()))
    tokens = _all_tokens(prepared)
    assert tokens.max() == tokenizer.n_vocab - 1 and tokenizer.decode(tokens.tolist()) == text
    assert tokens.tolist() == tokenizer.encode(text)
    assert prepared.meta["tokenizer"] == build_tokenizer("test-corpus-bytes", texts=DOCS).spec()


def test_names_and_messages_come_from_the_registry(registered: None) -> None:
    assert DataConfig(tokenizer="test-bytes").tokenizer == "test-bytes"
    assert isinstance(build_tokenizer("test-bytes"), ByteTokenizer)
    valid = "valid names: gpt2, gpt2-compact, char, bpe, test-bytes, test-corpus-bytes"
    with pytest.raises(DataError, match=valid):
        DataConfig(tokenizer="wordpiece")
    with pytest.raises(DataError, match=valid):
        tokenizer_from_spec({"name": "wordpiece"})


def test_a_name_is_registered_once() -> None:
    class Impostor(ByteTokenizer):
        name = "gpt2"

    with pytest.raises(ValueError, match="'gpt2' is already taken by GPT2Tokenizer"):
        register_tokenizer(Impostor)
    assert register_tokenizer(GPT2Tokenizer) is GPT2Tokenizer  # registering the same class again is harmless
    assert TOKENIZERS["gpt2"] is GPT2Tokenizer


def test_registration_ends_with_its_test() -> None:
    assert list(TOKENIZERS) == ["gpt2", "gpt2-compact", "char", "bpe"]
    with pytest.raises(
        DataError, match="unknown tokenizer 'test-bytes'; valid names: gpt2, gpt2-compact, char, bpe$"
    ):
        DataConfig(tokenizer="test-bytes")
