"""GPT-2's BPE renumbered densely over the GPT-2 tokens a corpus uses."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import tiktoken

from ..errors import DataError
from ..gpt2_encoding import ENDOFTEXT, ENDOFTEXT_ID, N_VOCAB
from .base import BaseTokenizer, IdMap, Tokenizer, register_tokenizer, require_texts
from .gpt2 import GPT2_SPEC, GPT2Tokenizer
from .hf_json import byte_level_bpe_json, byte_level_vocabulary


@register_tokenizer
class CompactGPT2Tokenizer(BaseTokenizer):
    """GPT-2's BPE with the ids renumbered densely over the GPT-2 tokens a corpus uses.

    The vocabulary is every GPT-2 token that occurs in the corpus, the 256 single-byte tokens and
    ``<|endoftext|>``, numbered in GPT-2 id order (so :attr:`eot_id` is the last id). Text made of
    vocabulary tokens encodes to exactly GPT-2's tokens, renumbered. Any other GPT-2 token (a new
    word in a prompt, an emoji) is spelled with the single-byte tokens of its bytes, so every text
    still encodes, and ``decode(encode(text)) == text``. A corpus the size of Shakespeare uses
    under 19k GPT-2 tokens, which makes the embedding and the LM head over 2.5 times smaller.
    Like :class:`GPT2Tokenizer`, a literal ``"<|endoftext|>"`` in text is plain text.

    ``prepare`` runs the corpus through GPT-2's BPE once: :meth:`corpus_encoder` is GPT-2's
    tokenizer, :meth:`from_corpus_tokens` reads the vocabulary off its tokens and renumbers them
    with :meth:`to_compact` as the splits are written.
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

    @classmethod
    def build(
        cls, texts: Iterable[str] | None, *, tokenizer_path: str | None = None, num_threads: int | None = None
    ) -> CompactGPT2Tokenizer:
        """Vocabulary of the GPT-2 tokens of ``texts``, the whole corpus."""
        texts = require_texts(texts, cls.name)
        return cls.from_texts(texts, GPT2Tokenizer(path=tokenizer_path, num_threads=num_threads))

    @classmethod
    def corpus_encoder(
        cls, texts: Iterable[str], *, tokenizer_path: str | None = None, num_threads: int | None = None
    ) -> GPT2Tokenizer:
        return GPT2Tokenizer(path=tokenizer_path, num_threads=num_threads)

    @classmethod
    def from_corpus_tokens(
        cls, encoder: Tokenizer, token_arrays: Iterator[np.ndarray]
    ) -> tuple[CompactGPT2Tokenizer, IdMap]:
        if not isinstance(encoder, GPT2Tokenizer):
            raise TypeError(f"gpt2-compact is read off GPT-2's tokens, not {type(encoder).__name__}'s")
        compact = cls.from_gpt2_tokens(token_arrays, encoder)
        # Every corpus token is in the vocabulary, so the renumbering is one id for one id.
        return compact, compact.to_compact

    @classmethod
    def from_spec(cls, spec: dict[str, Any], tokenizer_path: str | None = None) -> CompactGPT2Tokenizer:
        if spec.get("gpt2") != GPT2_SPEC:
            raise DataError(
                "gpt2-compact spec is not based on the GPT-2 vocabulary this version knows:"
                f" {spec.get('gpt2')}"
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
        return cls(ids, GPT2Tokenizer(path=tokenizer_path))

    @classmethod
    def cache_key(cls) -> dict[str, Any]:
        # The vocabulary follows from the corpus and GPT-2's ranks, which GPT2_SPEC names by hash.
        return {"name": cls.name, "gpt2": dict(GPT2_SPEC)}

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

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return [self.to_compact(tokens) for tokens in self._gpt2.encode_to_arrays(texts)]

    def decode(self, ids: Sequence[int]) -> str:
        compact = np.array(self._checked_ids(ids), dtype=np.int64)
        return self._encoding.decode(self.gpt2_ids[compact].tolist())

    @classmethod
    def spec_from_hf_tokenizer_json(
        cls, hf_json: dict[str, Any], n_vocab: int, tokenizer_path: str | None = None
    ) -> dict[str, Any] | None:
        """The vocabulary is every GPT-2 token at an id below the model's ``n_vocab``; the file
        :meth:`hf_tokenizer_json` writes holds all of GPT-2's tokens and ``<|endoftext|>``."""
        vocabulary = byte_level_vocabulary(hf_json)
        if vocabulary is None:
            return None
        tokens, special = vocabulary
        if len(tokens) + len(special) != N_VOCAB or special.get(ENDOFTEXT, n_vocab) >= n_vocab:
            return None
        gpt2 = GPT2Tokenizer(path=tokenizer_path)
        ranks = {token: i for i, token in enumerate(gpt2.token_bytes())}
        if any(token not in ranks for token in tokens.values()):
            return None
        ids = sorted([ranks[tokens[i]] for i in tokens if i < n_vocab] + [ENDOFTEXT_ID])
        return cls(ids, gpt2).spec()

    def hf_tokenizer_json(self) -> str:
        """GPT-2's byte-level BPE with this vocabulary's ids, ``<|endoftext|>`` read as plain text.

        The same ids as :meth:`encode` for every text made of vocabulary tokens, and the same text
        from any ids. A GPT-2 token outside the vocabulary, which :meth:`encode` spells in bytes,
        a ``tokenizers`` BPE cannot spell (its merges must make tokens it has): there it gives
        GPT-2's token an id from ``n_vocab`` on, which the model refuses, never other ids of the
        vocabulary.
        """
        tokens = self._gpt2.token_bytes()  # every ordinary GPT-2 token, by GPT-2 id (= rank)
        ids = self._compact_by_gpt2[: len(tokens)].astype(np.int64)
        outside = ids == self.n_vocab
        ids[outside] = self.n_vocab + np.arange(int(outside.sum()))
        return byte_level_bpe_json(tokens, ids.tolist(), {ENDOFTEXT: self.eot_id})

    def byte_lengths(self) -> np.ndarray:
        """Bytes per id: those of the GPT-2 token it renumbers (0 for end-of-text)."""
        return self._gpt2.byte_lengths()[self.gpt2_ids]

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
