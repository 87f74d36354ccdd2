"""Tokenizers behind one small interface: GPT-2's BPE (through tiktoken) and a character vocabulary.

Every tokenizer can describe itself as a JSON-serialisable :meth:`Tokenizer.spec`; the spec is
stored with prepared data and in checkpoints so :func:`tokenizer_from_spec` rebuilds exactly the
tokenizer the model was trained with.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

import numpy as np
import tiktoken

from .errors import DataError
from .gpt2_encoding import N_VOCAB, R50K_SHA256, load_gpt2_encoding

TOKENIZER_NAMES = ("gpt2", "char")
GPT2_SPEC: dict[str, Any] = {
    "name": "gpt2",
    "encoding": "r50k_base",
    "n_vocab": N_VOCAB,
    "sha256": R50K_SHA256,
}

# A line break between two printable ASCII characters is always a boundary between GPT-2
# pre-tokens, and the pre-tokens on either side come out the same whether or not the text is cut
# there; cutting long texts at such breaks lets tiktoken encode the pieces on several threads.
_SAFE_CUT = re.compile(r"(?<=[!-~]\n)(?=[!-~])")


def available_cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@runtime_checkable
class Tokenizer(Protocol):
    """What the rest of minigpt needs from a tokenizer."""

    name: str
    """Registry name, ``"gpt2"`` or ``"char"``."""
    n_vocab: int
    """Number of token ids; every id is in ``[0, n_vocab)``."""
    eot_id: int | None
    """Id of the end-of-text token placed between documents, or None if the vocabulary has none."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; raises DataError if the text cannot be represented."""
        ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``[encode(t) for t in texts]``, faster."""
        ...

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """Like :meth:`encode_batch` but each result is a 1-D uint32 array (what the data pipeline uses)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; raises DataError for an id outside the vocabulary."""
        ...

    def spec(self) -> dict[str, Any]:
        """JSON-serialisable description from which :func:`tokenizer_from_spec` rebuilds this tokenizer."""
        ...


def _check_ids(ids: Sequence[int], n_vocab: int, name: str) -> list[int]:
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < n_vocab]
    if bad:
        raise DataError(f"token id {bad[0]} is outside the {name} vocabulary of {n_vocab} ids")
    return ids


class GPT2Tokenizer:
    """GPT-2's byte-level BPE: 50257 ids, ``<|endoftext|>`` = 50256, round-trips any string.

    Text is always encoded as ordinary text: a literal ``"<|endoftext|>"`` inside a document or a
    prompt becomes the ids of those 13 characters, never the special token. Only the data pipeline
    inserts :attr:`eot_id`, between documents, so user text can never forge a document boundary.
    """

    name = "gpt2"

    def __init__(
        self,
        encoding: tiktoken.Encoding | None = None,
        *,
        path: str | None = None,
        chunk_chars: int = 1 << 17,
        num_threads: int | None = None,
    ) -> None:
        """
        Args:
            encoding: A ready GPT-2 encoding; loaded with :func:`load_gpt2_encoding` when None.
            path: Ranks file for :func:`load_gpt2_encoding` (air-gapped machines).
            chunk_chars: Texts longer than this are cut at safe line breaks and encoded in parallel.
            num_threads: Encoding threads; defaults to the CPU cores this process may use.
        """
        self._encoding = encoding if encoding is not None else load_gpt2_encoding(path)
        self._chunk_chars = chunk_chars
        self._num_threads = num_threads or available_cores()
        self.n_vocab: int = self._encoding.n_vocab
        self.eot_id: int | None = self._encoding.eot_token

    def _pieces(self, text: str) -> list[str]:
        pieces, start = [], 0
        while len(text) - start > self._chunk_chars:
            cut = _SAFE_CUT.search(text, start + self._chunk_chars)
            if cut is None:
                break
            pieces.append(text[start : cut.start()])
            start = cut.start()
        pieces.append(text[start:])
        return pieces

    def _encode_piece(self, text: str) -> np.ndarray:
        # No special tokens allowed or disallowed: "<|endoftext|>" in the text is plain text.
        return self._encoding.encode_to_numpy(text, allowed_special=set(), disallowed_special=())

    def encode(self, text: str) -> list[int]:
        return self.encode_to_arrays([text])[0].tolist()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [ids.tolist() for ids in self.encode_to_arrays(texts)]

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        pieces_per_text = [self._pieces(text) for text in texts]
        flat = [piece for pieces in pieces_per_text for piece in pieces]
        if len(flat) == 1 or self._num_threads == 1:
            encoded = [self._encode_piece(piece) for piece in flat]
        else:
            # tiktoken releases the GIL while encoding to numpy, so threads use all cores.
            with ThreadPoolExecutor(min(self._num_threads, len(flat))) as pool:
                encoded = list(pool.map(self._encode_piece, flat))
        out, i = [], 0
        for pieces in pieces_per_text:
            parts = encoded[i : i + len(pieces)]
            out.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
            i += len(pieces)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self._encoding.decode(_check_ids(ids, self.n_vocab, self.name))

    def spec(self) -> dict[str, Any]:
        return dict(GPT2_SPEC)


class CharTokenizer:
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

    def encode(self, text: str) -> list[int]:
        return self._encode_array(text).tolist()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

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
        return "".join(self.chars[i] for i in _check_ids(ids, self.n_vocab, self.name))

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "chars": self.chars}


def tokenizer_from_spec(spec: dict[str, Any], tokenizer_path: str | None = None) -> Tokenizer:
    """Rebuild the tokenizer described by ``spec`` (from :meth:`Tokenizer.spec`).

    Args:
        spec: As stored in ``meta.json`` of prepared data or in a checkpoint.
        tokenizer_path: GPT-2 ranks file for air-gapped machines; the spec never stores a path.

    Raises:
        DataError: The spec is malformed or names an unknown tokenizer.
    """
    name = spec.get("name") if isinstance(spec, dict) else None
    if name == "gpt2":
        if spec != GPT2_SPEC:
            raise DataError(f"tokenizer spec describes a GPT-2 vocabulary this version does not know: {spec}")
        return GPT2Tokenizer(path=tokenizer_path)
    if name == "char":
        chars = spec.get("chars")
        if not isinstance(chars, str):
            raise DataError("char tokenizer spec has no 'chars' string")
        return CharTokenizer(chars)
    names = ", ".join(TOKENIZER_NAMES)
    raise DataError(f"tokenizer spec names unknown tokenizer {name!r}; valid names: {names}")


def build_tokenizer(
    name: str,
    *,
    tokenizer_path: str | None = None,
    texts: Iterable[str] | None = None,
    num_threads: int | None = None,
) -> Tokenizer:
    """A new tokenizer by name.

    Args:
        name: ``"gpt2"`` or ``"char"``.
        tokenizer_path: GPT-2 ranks file (only for ``"gpt2"``).
        texts: The corpus whose characters form the vocabulary (required for ``"char"``).
        num_threads: GPT-2 encoding threads per process (default: all available cores).

    Raises:
        DataError: Unknown name.
    """
    if name == "gpt2":
        return GPT2Tokenizer(path=tokenizer_path, num_threads=num_threads)
    if name == "char":
        if texts is None:
            raise ValueError("the char tokenizer is built from corpus text; pass texts=")
        return CharTokenizer.from_texts(texts)
    raise DataError(f"unknown tokenizer {name!r}; valid names: {', '.join(TOKENIZER_NAMES)}")
