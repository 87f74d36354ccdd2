"""GPT-2's byte-level BPE through tiktoken, encoding long texts on several threads."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import tiktoken

from ..errors import DataError
from ..gpt2_encoding import ENDOFTEXT, N_VOCAB, R50K_SHA256, load_gpt2_encoding
from .base import BaseTokenizer, available_cores
from .hf_json import byte_level_bpe_json
from .pretokens import split_at_safe_breaks
from .registry import register_tokenizer

GPT2_SPEC: dict[str, Any] = {
    "name": "gpt2",
    "encoding": "r50k_base",
    "n_vocab": N_VOCAB,
    "sha256": R50K_SHA256,
}
"""The spec of the one GPT-2 vocabulary this version knows; it names the ranks file by its sha256."""


@register_tokenizer
class GPT2Tokenizer(BaseTokenizer):
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

    @classmethod
    def build(
        cls, texts: Iterable[str] | None, *, tokenizer_path: str | None = None, num_threads: int | None = None
    ) -> GPT2Tokenizer:
        """GPT-2's tokenizer; its vocabulary is fixed, so ``texts`` is never read."""
        return cls(path=tokenizer_path, num_threads=num_threads)

    @classmethod
    def from_spec(cls, spec: dict[str, Any], tokenizer_path: str | None = None) -> GPT2Tokenizer:
        if spec != GPT2_SPEC:
            raise DataError(f"tokenizer spec describes a GPT-2 vocabulary this version does not know: {spec}")
        return cls(path=tokenizer_path)

    @classmethod
    def cache_key(cls) -> dict[str, Any]:
        # The tokens depend on the ranks file, which the spec names by its hash.
        return dict(GPT2_SPEC)

    def _encode_piece(self, text: str) -> np.ndarray:
        # No special tokens allowed or disallowed: "<|endoftext|>" in the text is plain text.
        return self._encoding.encode_to_numpy(text, allowed_special=set(), disallowed_special=())

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        pieces_per_text = [split_at_safe_breaks(text, self._chunk_chars) for text in texts]
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
        return self._encoding.decode(self._checked_ids(ids))

    def spec(self) -> dict[str, Any]:
        return dict(GPT2_SPEC)

    def token_bytes(self) -> list[bytes]:
        """The bytes of every ordinary token, indexed by id: the ids below ``<|endoftext|>``'s. An
        id is also its rank in the merge order, so this is the whole byte-pair vocabulary."""
        return [self._encoding.decode_single_token_bytes(i) for i in range(self.eot_id)]

    def hf_tokenizer_json(self) -> str:
        """GPT-2's BPE as a ``tokenizer.json``, ``<|endoftext|>`` its special token. Export writes
        GPT-2's own ``vocab.json`` and ``merges.txt`` for this tokenizer; one built on it (with the
        chat markers) writes this file with its tokens added."""
        return byte_level_bpe_json(self.token_bytes(), range(self.eot_id), {ENDOFTEXT: self.eot_id})

    def byte_lengths(self) -> np.ndarray:
        """Bytes per id: each BPE token's bytes (part of a character, for some), 0 for end-of-text."""
        return np.array([len(b) for b in self.token_bytes()] + [0], dtype=np.int64)
