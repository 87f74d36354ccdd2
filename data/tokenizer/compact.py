"""GPT-2's BPE renumbered densely over the GPT-2 tokens a corpus uses."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from ..errors import DataError
from ..gpt2_encoding import ENDOFTEXT, ENDOFTEXT_ID, N_VOCAB
from .base import BaseTokenizer, IdMap, Tokenizer, require_texts
from .compact_vocab import byte_token_ids, corpus_vocabulary, gpt2_ranks, gpt2_token_arrays
from .gpt2 import GPT2_SPEC, GPT2Tokenizer
from .hf_json import byte_level_bpe_json, byte_level_vocabulary, encode_with, merge_of, merge_pairs
from .registry import register_tokenizer

CLOSED = "closed"
"""``spec()["merges"]`` of the current version: the vocabulary is closed under GPT-2's merges, and
encoding applies the merges that make its tokens. A spec without ``"merges"`` is the first
version, which applies all of GPT-2's merges and spells a token outside the vocabulary in bytes."""


@register_tokenizer
class CompactGPT2Tokenizer(BaseTokenizer):
    """GPT-2's BPE with the ids renumbered densely over the GPT-2 tokens a corpus uses.

    The vocabulary is every GPT-2 token that occurs in the corpus, every token GPT-2 merges on the
    way to one of them (for each token, the two tokens whose merge makes it), the 256 single-byte
    tokens and ``<|endoftext|>``, numbered in GPT-2 id order (so :attr:`eot_id` is the last id).
    Encoding is GPT-2's byte-level BPE with only the merges that make vocabulary tokens, in GPT-2's
    order: a ``tokenizers`` BPE, the very one :meth:`hf_tokenizer_json` writes, so transformers'
    ``AutoTokenizer`` encodes every text as this class does. On the corpus the dropped merges never
    applied, so its text encodes to exactly GPT-2's tokens, renumbered; other text (a new word in a
    prompt, an emoji) stops at the intermediate tokens and bytes its merges reach. Every text
    encodes, and ``decode(encode(text)) == text``. For Shakespeare's plays the corpus's tokens,
    the bytes and end-of-text are 18,943 ids and the tokens merged on the way add 1,158: 20,101
    ids, an embedding and LM head 2.5 times smaller than GPT-2's. Those added tokens never occur
    in the corpus, so their embeddings are never trained. Like :class:`GPT2Tokenizer`, a literal
    ``"<|endoftext|>"`` in text is plain text.

    The first version of this tokenizer (a spec without ``"merges"``, :attr:`closed` False) holds
    only the corpus's tokens, applies all of GPT-2's merges and spells a GPT-2 token outside the
    vocabulary with the single-byte tokens of its bytes; models trained with it keep that spelling.
    A ``tokenizers`` BPE cannot express it, so its ``tokenizer.json`` is exact only on text made of
    vocabulary tokens.

    ``prepare`` runs the corpus through GPT-2's BPE once: :meth:`corpus_encoder` is GPT-2's
    tokenizer, :meth:`from_corpus_tokens` reads the vocabulary off its tokens and renumbers them
    with :meth:`to_compact` as the splits are written.
    """

    name = "gpt2-compact"

    def __init__(
        self, gpt2_ids: Sequence[int] | np.ndarray, gpt2: GPT2Tokenizer, *, closed: bool = True
    ) -> None:
        """
        Args:
            gpt2_ids: The vocabulary: GPT-2 ids in increasing order, including the 256 single-byte
                tokens and ``<|endoftext|>``; compact id ``i`` is GPT-2 id ``gpt2_ids[i]``.
            gpt2: GPT-2's tokenizer, which knows GPT-2's tokens and merges.
            closed: The current version (see the class): ``gpt2_ids`` must then hold, for each of
                its tokens, the two tokens GPT-2 merges into it. False: the first version.

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
        self._byte_ids = self._compact_by_gpt2[byte_token_ids(self._encoding)]
        if np.any(self._byte_ids == self.n_vocab) or self._compact_by_gpt2[ENDOFTEXT_ID] == self.n_vocab:
            raise DataError(
                "a gpt2-compact vocabulary must hold the 256 single-byte tokens and <|endoftext|>"
            )
        self.eot_id: int | None = int(self._compact_by_gpt2[ENDOFTEXT_ID])
        self.closed = closed
        """Whether this is the current version, whose vocabulary is closed under GPT-2's merges."""
        self._bpe = self._closed_bpe() if closed else None

    def _closed_bpe(self) -> HFTokenizer:
        """GPT-2's merges that make vocabulary tokens, as a ``tokenizers`` BPE over the compact ids.

        Raises:
            DataError: A token's merge needs a token outside the vocabulary.
        """
        ranks = gpt2_ranks(self._gpt2)
        tokens = [self._encoding.decode_single_token_bytes(int(i)) for i in self.gpt2_ids[:-1]]
        merges = []
        for token in tokens:
            if len(token) < 2:
                continue
            merge = merge_of(token, ranks)
            missing = [part for part in merge if self._compact_by_gpt2[ranks[part]] == self.n_vocab]
            if missing:
                raise DataError(
                    "a gpt2-compact vocabulary must hold the two tokens GPT-2 merges into each of its"
                    f" tokens: it has {token!r} but not {missing[0]!r}"
                )
            merges.append(merge)
        ids = range(len(tokens))  # every id but end-of-text's, the last
        bpe = HFTokenizer.from_str(byte_level_bpe_json(tokens, ids, {ENDOFTEXT: self.n_vocab - 1}, merges))
        # Literal "<|endoftext|>" in text is encoded as text; only prepare inserts eot_id.
        bpe.encode_special_tokens = True
        return bpe

    @classmethod
    def from_gpt2_tokens(
        cls, token_arrays: Iterable[np.ndarray], gpt2: GPT2Tokenizer, *, closed: bool = True
    ) -> CompactGPT2Tokenizer:
        """Vocabulary of the GPT-2 ids in ``token_arrays`` (a tokenized corpus), plus the bytes and
        ``<|endoftext|>``, and (``closed``, the current version) the tokens merged on the way."""
        return cls(corpus_vocabulary(token_arrays, gpt2, closed=closed), gpt2, closed=closed)

    @classmethod
    def from_texts(
        cls, texts: Iterable[str], gpt2: GPT2Tokenizer, batch_size: int = 1000, *, closed: bool = True
    ) -> CompactGPT2Tokenizer:
        """Vocabulary of the GPT-2 tokens of ``texts``, plus the bytes and ``<|endoftext|>``, and
        (``closed``, the current version) the tokens merged on the way."""
        return cls.from_gpt2_tokens(gpt2_token_arrays(texts, gpt2, batch_size), gpt2, closed=closed)

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
        # Every corpus token is in the vocabulary, so the renumbering is one id for one id. It is
        # also what the closed BPE gives the corpus text: the merges it lacks never applied there.
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
        merges = spec.get("merges")
        if merges not in (None, CLOSED):
            raise DataError(
                f"gpt2-compact spec has merges {merges!r}; this version knows {CLOSED!r} and, for the"
                " first version, none"
            )
        return cls(ids, GPT2Tokenizer(path=tokenizer_path), closed=merges == CLOSED)

    @classmethod
    def cache_key(cls) -> dict[str, Any]:
        # The vocabulary follows from the corpus and GPT-2's ranks, which GPT2_SPEC names by hash,
        # and from the version: the closed vocabulary numbers the same tokens differently.
        return {"name": cls.name, "gpt2": dict(GPT2_SPEC), "merges": CLOSED}

    def to_compact(self, gpt2_tokens: np.ndarray) -> np.ndarray:
        """Compact ids (1-D uint32) of a GPT-2 token sequence, such as a corpus's tokens.

        A GPT-2 token outside the vocabulary is spelled in bytes by the first version. The current
        version refuses it: how its closed BPE splits such a token depends on the text around it,
        so encode the text instead.

        Raises:
            DataError: The current version meets a token outside its vocabulary.
        """
        ids = self._compact_by_gpt2[gpt2_tokens]
        unknown = np.flatnonzero(ids == self.n_vocab)
        if not unknown.size:
            return ids
        if self.closed:
            raise DataError(
                f"GPT-2 token {int(gpt2_tokens[unknown[0]])} is not in this gpt2-compact vocabulary;"
                " encode the text instead"
            )
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
        if self._bpe is not None:
            return encode_with(self._bpe, texts)
        return [self.to_compact(tokens) for tokens in self._gpt2.encode_to_arrays(texts)]

    def decode(self, ids: Sequence[int]) -> str:
        compact = np.array(self._checked_ids(ids), dtype=np.int64)
        return self._encoding.decode(self.gpt2_ids[compact].tolist())

    @classmethod
    def spec_from_hf_tokenizer_json(
        cls, hf_json: dict[str, Any], n_vocab: int, tokenizer_path: str | None = None
    ) -> dict[str, Any] | None:
        """The current version's file holds exactly the vocabulary's tokens and their merges; the
        first version's holds all of GPT-2's tokens, the vocabulary's at ids below the model's
        ``n_vocab``, and ``<|endoftext|>``."""
        vocabulary = byte_level_vocabulary(hf_json)
        if vocabulary is None:
            return None
        tokens, special = vocabulary
        if special.get(ENDOFTEXT, n_vocab) >= n_vocab:
            return None
        gpt2 = GPT2Tokenizer(path=tokenizer_path)
        ranks = gpt2_ranks(gpt2)
        if any(token not in ranks for token in tokens.values()):
            return None
        if len(tokens) + len(special) == n_vocab == len(tokens) + 1:  # the current version's file
            try:
                ours = cls(sorted([ranks[token] for token in tokens.values()] + [ENDOFTEXT_ID]), gpt2)
            except DataError:  # not closed under GPT-2's merges
                return None
            written, theirs = json.loads(ours.hf_tokenizer_json())["model"], hf_json["model"]
            same = written["vocab"] == theirs.get("vocab") and merge_pairs(written["merges"]) == merge_pairs(
                theirs.get("merges")
            )
            return ours.spec() if same else None
        if len(tokens) + len(special) == N_VOCAB:  # the first version's file
            first = sorted([ranks[tokens[i]] for i in tokens if i < n_vocab] + [ENDOFTEXT_ID])
            return cls(first, gpt2, closed=False).spec()
        return None

    def hf_tokenizer_json(self) -> str:
        """This byte-level BPE as a ``tokenizer.json``, ``<|endoftext|>`` read as plain text.

        The current version's is the very BPE :meth:`encode` runs: the same ids for every text and
        the same text from any ids. The first version's is GPT-2's BPE with this vocabulary's ids:
        the same ids as :meth:`encode` for every text made of vocabulary tokens, and the same text
        from any ids. A GPT-2 token outside the vocabulary, which that version spells in bytes, a
        ``tokenizers`` BPE cannot spell (its merges must make tokens it has): there it gives GPT-2's
        token an id from ``n_vocab`` on, which the model refuses, never other ids of the vocabulary.
        """
        if self._bpe is not None:
            return self._bpe.to_str()
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
        spec = {
            "name": self.name,
            "gpt2": dict(GPT2_SPEC),
            "n_vocab": self.n_vocab,
            "gpt2_ids": base64.b64encode(packed).decode("ascii"),
        }
        return (spec | {"merges": CLOSED}) if self.closed else spec
