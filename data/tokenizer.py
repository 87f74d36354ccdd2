"""Tokenizers behind one small interface: GPT-2's BPE (through tiktoken), the same BPE renumbered over
the tokens a corpus uses, and a character vocabulary.

Every tokenizer can describe itself as a JSON-serialisable :meth:`Tokenizer.spec`; the spec is
stored with prepared data and in checkpoints so :func:`tokenizer_from_spec` rebuilds exactly the
tokenizer the model was trained with.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

import numpy as np
import tiktoken

from .errors import DataError
from .gpt2_encoding import ENDOFTEXT_ID, N_VOCAB, R50K_SHA256, load_gpt2_encoding

TOKENIZER_NAMES = ("gpt2", "gpt2-compact", "char")
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
    """Registry name, one of :data:`TOKENIZER_NAMES`."""
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


class CompactGPT2Tokenizer:
    """GPT-2's BPE with the ids renumbered densely over the GPT-2 tokens a corpus uses.

    The vocabulary is every GPT-2 token that occurs in the corpus, the 256 single-byte tokens and
    ``<|endoftext|>``, numbered in GPT-2 id order (so :attr:`eot_id` is the last id). Text made of
    vocabulary tokens encodes to exactly GPT-2's tokens, renumbered. Any other GPT-2 token (a new
    word in a prompt, an emoji) is spelled with the single-byte tokens of its bytes, so every text
    still encodes, and ``decode(encode(text)) == text``. A corpus the size of Shakespeare uses
    under 19k GPT-2 tokens, which makes the embedding and the LM head over 2.5 times smaller.
    Like :class:`GPT2Tokenizer`, a literal ``"<|endoftext|>"`` in text is plain text.
    """

    name = "gpt2-compact"

    def __init__(self, gpt2_ids: Sequence[int] | np.ndarray, gpt2: GPT2Tokenizer) -> None:
        """
        Args:
            gpt2_ids: The vocabulary: GPT-2 ids in increasing order, including the 256 single-byte
                tokens and ``<|endoftext|>``; compact id ``i`` is GPT-2 id ``gpt2_ids[i]``.
            gpt2: GPT-2's tokenizer, which does the BPE work.

        Raises:
            DataError: ``gpt2_ids`` is not such a vocabulary.
        """
        ids = np.asarray(gpt2_ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise DataError("a gpt2-compact vocabulary is a 1-D sequence of GPT-2 ids")
        ids = ids.astype(np.int64)
        if ids.size and (ids[0] < 0 or ids[-1] >= N_VOCAB or np.any(np.diff(ids) <= 0)):
            raise DataError(f"gpt2-compact ids must increase strictly within 0..{N_VOCAB - 1}")
        self._gpt2 = gpt2
        self._encoding = gpt2._encoding
        self.gpt2_ids = ids
        """``(n_vocab,)`` int64: the GPT-2 id of each compact id."""
        self.n_vocab: int = len(ids)
        # GPT-2 id -> compact id; n_vocab marks GPT-2 tokens outside the vocabulary.
        self._compact_by_gpt2 = np.full(N_VOCAB, self.n_vocab, dtype=np.uint32)
        self._compact_by_gpt2[ids] = np.arange(self.n_vocab, dtype=np.uint32)
        self._byte_ids = self._compact_by_gpt2[_byte_token_ids(self._encoding)]
        if np.any(self._byte_ids == self.n_vocab) or self._compact_by_gpt2[ENDOFTEXT_ID] == self.n_vocab:
            raise DataError(
                "a gpt2-compact vocabulary must hold the 256 single-byte tokens and <|endoftext|>"
            )
        self.eot_id: int | None = int(self._compact_by_gpt2[ENDOFTEXT_ID])

    @classmethod
    def from_gpt2_tokens(
        cls, token_arrays: Iterable[np.ndarray], gpt2: GPT2Tokenizer
    ) -> CompactGPT2Tokenizer:
        """Vocabulary of the GPT-2 ids in ``token_arrays`` (a tokenized corpus), plus the bytes and
        ``<|endoftext|>``."""
        used = np.zeros(N_VOCAB, dtype=bool)
        used[_byte_token_ids(gpt2._encoding)] = True
        used[ENDOFTEXT_ID] = True
        for tokens in token_arrays:
            used[tokens] = True
        return cls(np.flatnonzero(used), gpt2)

    @classmethod
    def from_texts(
        cls, texts: Iterable[str], gpt2: GPT2Tokenizer, batch_size: int = 1000
    ) -> CompactGPT2Tokenizer:
        """Vocabulary of the GPT-2 tokens of ``texts``, plus the bytes and ``<|endoftext|>``."""
        batch: list[str] = []

        def token_arrays() -> Iterable[np.ndarray]:
            for text in texts:
                batch.append(text)
                if len(batch) == batch_size:
                    yield from gpt2.encode_to_arrays(batch)
                    batch.clear()
            yield from gpt2.encode_to_arrays(batch)

        return cls.from_gpt2_tokens(token_arrays(), gpt2)

    def to_compact(self, gpt2_tokens: np.ndarray) -> np.ndarray:
        """Compact ids (1-D uint32) of a GPT-2 token sequence, spelling unknown tokens in bytes."""
        ids = self._compact_by_gpt2[gpt2_tokens]
        unknown = np.flatnonzero(ids == self.n_vocab)
        if not unknown.size:
            return ids
        spelled = [self._encoding.decode_single_token_bytes(int(t)) for t in gpt2_tokens[unknown]]
        widths = np.ones(len(ids), dtype=np.int64)
        widths[unknown] = [len(piece) for piece in spelled]
        out = np.repeat(ids, widths)
        # Slots of the spelled bytes in `out`: each unknown token's first slot, plus 0, 1, ...
        first = (np.cumsum(widths) - widths)[unknown]
        lengths = widths[unknown]
        within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[np.repeat(first, lengths) + within] = self._byte_ids[np.frombuffer(b"".join(spelled), np.uint8)]
        return out

    def encode(self, text: str) -> list[int]:
        return self.encode_to_arrays([text])[0].tolist()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [ids.tolist() for ids in self.encode_to_arrays(texts)]

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return [self.to_compact(tokens) for tokens in self._gpt2.encode_to_arrays(texts)]

    def decode(self, ids: Sequence[int]) -> str:
        compact = np.array(_check_ids(ids, self.n_vocab, self.name), dtype=np.int64)
        return self._encoding.decode(self.gpt2_ids[compact].tolist())

    def spec(self) -> dict[str, Any]:
        packed = self.gpt2_ids.astype("<u2").tobytes()
        return {
            "name": self.name,
            "gpt2": dict(GPT2_SPEC),
            "n_vocab": self.n_vocab,
            "gpt2_ids": base64.b64encode(packed).decode("ascii"),
        }


def _byte_token_ids(encoding: tiktoken.Encoding) -> np.ndarray:
    """``(256,)`` GPT-2 id of the single-byte token of each byte value."""
    return np.array([encoding.encode_single_token(bytes([b])) for b in range(256)], dtype=np.int64)


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
    if name == "gpt2-compact":
        return _compact_from_spec(spec, tokenizer_path)
    if name == "char":
        chars = spec.get("chars")
        if not isinstance(chars, str):
            raise DataError("char tokenizer spec has no 'chars' string")
        return CharTokenizer(chars)
    names = ", ".join(TOKENIZER_NAMES)
    raise DataError(f"tokenizer spec names unknown tokenizer {name!r}; valid names: {names}")


def _compact_from_spec(spec: dict[str, Any], tokenizer_path: str | None) -> CompactGPT2Tokenizer:
    if spec.get("gpt2") != GPT2_SPEC:
        raise DataError(
            f"gpt2-compact spec is not based on the GPT-2 vocabulary this version knows: {spec.get('gpt2')}"
        )
    packed = spec.get("gpt2_ids")
    try:
        raw = base64.b64decode(packed.encode("ascii"), validate=True) if isinstance(packed, str) else None
    except (binascii.Error, UnicodeEncodeError):
        raw = None
    if raw is None or len(raw) % 2:
        raise DataError("gpt2-compact spec has no valid 'gpt2_ids' (base64 of little-endian uint16)")
    ids = np.frombuffer(raw, dtype="<u2")
    if spec.get("n_vocab") != len(ids):
        raise DataError(f"gpt2-compact spec says n_vocab {spec.get('n_vocab')} but lists {len(ids)} ids")
    return CompactGPT2Tokenizer(ids, GPT2Tokenizer(path=tokenizer_path))


def build_tokenizer(
    name: str,
    *,
    tokenizer_path: str | None = None,
    texts: Iterable[str] | None = None,
    num_threads: int | None = None,
) -> Tokenizer:
    """A new tokenizer by name.

    Args:
        name: One of :data:`TOKENIZER_NAMES`.
        tokenizer_path: GPT-2 ranks file (for the GPT-2 tokenizers).
        texts: The corpus whose characters (``"char"``) or GPT-2 tokens (``"gpt2-compact"``) form
            the vocabulary; required for those two.
        num_threads: GPT-2 encoding threads per process (default: all available cores).

    Raises:
        DataError: Unknown name.
    """
    if name == "gpt2":
        return GPT2Tokenizer(path=tokenizer_path, num_threads=num_threads)
    if name in ("char", "gpt2-compact") and texts is None:
        raise ValueError(f"the {name} tokenizer is built from corpus text; pass texts=")
    if name == "gpt2-compact":
        gpt2 = GPT2Tokenizer(path=tokenizer_path, num_threads=num_threads)
        return CompactGPT2Tokenizer.from_texts(texts, gpt2)
    if name == "char":
        return CharTokenizer.from_texts(texts)
    raise DataError(f"unknown tokenizer {name!r}; valid names: {', '.join(TOKENIZER_NAMES)}")
