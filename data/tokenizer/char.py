"""One id per character of the corpus, as in nanoGPT's ``shakespeare_char``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from .base import BaseTokenizer, IdMap, Tokenizer, require_texts
from .hf_json import char_tokenizer_json, chars_of_tokenizer_json
from .registry import register_tokenizer

_CODE_POINTS = 0x110000


@register_tokenizer
class CharTokenizer(BaseTokenizer):
    """One id per Unicode character, ids in code-point order of a fixed character set.

    The set is built from the whole corpus (train and validation), as in nanoGPT's
    ``shakespeare_char``, so validation text never contains an unknown character. A prompt may:
    encoding it raises DataError naming the character. There is no end-of-text token.

    ``prepare`` reads the corpus once: it writes code points (:class:`CodePoints`), then reads the
    character set off them and renumbers them, so a streamed corpus is never read twice.
    """

    name = "char"
    eot_id: int | None = None

    def __init__(self, chars: str) -> None:
        """
        Args:
            chars: The vocabulary, sorted by code point without repeats; id ``i`` is ``chars[i]``.
        """
        if not chars:
            raise DataError("the char tokenizer needs at least one character; the corpus is empty")
        if list(chars) != sorted(set(chars)):
            raise DataError("char tokenizer vocabulary must be sorted and free of repeats")
        self.chars = chars
        self.n_vocab: int = len(chars)
        # Code point -> id table; n_vocab marks characters outside the vocabulary, and the last
        # slot stands for every code point above the largest known one.
        codes = np.array([ord(c) for c in chars], dtype=np.int64)
        self._ids_by_code = np.full(int(codes[-1]) + 2, self.n_vocab, dtype=np.uint32)
        self._ids_by_code[codes] = np.arange(self.n_vocab, dtype=np.uint32)

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> CharTokenizer:
        """Vocabulary of every character that occurs in ``texts``."""
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        return cls("".join(sorted(seen)))

    @classmethod
    def build(
        cls, texts: Iterable[str] | None, *, tokenizer_path: str | None = None, num_threads: int | None = None
    ) -> CharTokenizer:
        """The characters of ``texts``, the whole corpus."""
        return cls.from_texts(require_texts(texts, cls.name))

    @classmethod
    def corpus_encoder(
        cls, texts: Iterable[str], *, tokenizer_path: str | None = None, num_threads: int | None = None
    ) -> CodePoints:
        return CodePoints()

    @classmethod
    def from_corpus_tokens(
        cls, encoder: Tokenizer, token_arrays: Iterator[np.ndarray]
    ) -> tuple[CharTokenizer, IdMap]:
        used = np.zeros(_CODE_POINTS, dtype=bool)
        for codes in token_arrays:
            used[codes] = True
        tokenizer = cls("".join(map(chr, np.flatnonzero(used).tolist())))
        return tokenizer, tokenizer.from_code_points

    def from_code_points(self, codes: np.ndarray) -> np.ndarray:
        """Ids (1-D uint32) of code points, every one of which is in the vocabulary."""
        return self._ids_by_code[np.minimum(codes, len(self._ids_by_code) - 1)]

    @classmethod
    def from_spec(cls, spec: dict[str, Any], tokenizer_path: str | None = None) -> CharTokenizer:
        chars = spec.get("chars")
        if not isinstance(chars, str):
            raise DataError("char tokenizer spec has no 'chars' string")
        return cls(chars)

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return [self._encode_array(text) for text in texts]

    def _encode_array(self, text: str) -> np.ndarray:
        ids = self.from_code_points(_code_points(text))
        unknown = ids == self.n_vocab
        if unknown.any():
            position = int(np.argmax(unknown))
            char = text[position]
            raise DataError(
                f"character {char!r} (U+{ord(char):04X}) at position {position} is not in the char"
                f" tokenizer's vocabulary of {self.n_vocab} characters from the training corpus"
            )
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in self._checked_ids(ids))

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "chars": self.chars}

    @classmethod
    def spec_from_hf_tokenizer_json(
        cls, hf_json: dict[str, Any], n_vocab: int, tokenizer_path: str | None = None
    ) -> dict[str, Any] | None:
        chars = chars_of_tokenizer_json(hf_json)
        if chars is None or len(chars) > n_vocab:
            return None
        return cls(chars).spec()

    def hf_tokenizer_json(self) -> str:
        """One token per character, an unknown character an error, as here (no end-of-text token)."""
        return char_tokenizer_json(self.chars)

    def byte_lengths(self) -> np.ndarray:
        """Bytes per id: the UTF-8 length of its character (1 for ASCII, up to 4)."""
        return np.array([len(c.encode("utf-8", "surrogatepass")) for c in self.chars], dtype=np.int64)


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


class CodePoints:
    """What ``prepare`` encodes a ``char`` corpus with: each character's Unicode code point."""

    name = "char"
    n_vocab = _CODE_POINTS
    eot_id: int | None = None

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return [_code_points(text).astype(np.uint32) for text in texts]
