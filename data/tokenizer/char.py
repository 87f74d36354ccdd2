"""One id per character of the corpus, as in nanoGPT's ``shakespeare_char``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from .base import BaseTokenizer, register_tokenizer, require_texts


@register_tokenizer
class CharTokenizer(BaseTokenizer):
    """One id per Unicode character, ids in code-point order of a fixed character set.

    The set is built from the whole corpus (train and validation), as in nanoGPT's
    ``shakespeare_char``, so validation text never contains an unknown character. A prompt may:
    encoding it raises DataError naming the character. There is no end-of-text token.
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
    def from_spec(cls, spec: dict[str, Any], tokenizer_path: str | None = None) -> CharTokenizer:
        chars = spec.get("chars")
        if not isinstance(chars, str):
            raise DataError("char tokenizer spec has no 'chars' string")
        return cls(chars)

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return [self._encode_array(text) for text in texts]

    def _encode_array(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        ids = self._ids_by_code[np.minimum(codes, len(self._ids_by_code) - 1)]
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
