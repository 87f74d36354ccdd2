"""A byte-level BPE learned from the training text, with Hugging Face ``tokenizers``."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from ..errors import DataError
from .base import BaseTokenizer, Tokenizer, require_texts
from .hf_json import byte_to_char, encode_with
from .registry import register_tokenizer

logger = logging.getLogger(__name__)

DEFAULT_VOCAB_SIZE = 4096
DEFAULT_SPECIAL_TOKENS = ("<|endoftext|>",)
MIN_PAIR_COUNT = 2
"""A merge is learned only from a pair seen at least this often: one seen once only memorises."""


def _settings(vocab_size: int | None, special_tokens: Sequence[str] | None) -> tuple[int, tuple[str, ...]]:
    """Validated ``(vocab_size, special_tokens)``, defaults filled in.

    Raises:
        DataError: A special token is empty or repeated, or ``vocab_size`` cannot hold the 256 bytes
            and the special tokens.
    """
    specials = DEFAULT_SPECIAL_TOKENS if special_tokens is None else tuple(special_tokens)
    if any(not isinstance(t, str) or not t for t in specials) or len(set(specials)) != len(specials):
        raise DataError(f"data.special_tokens must be distinct non-empty strings, got {list(specials)}")
    size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    least = 256 + len(specials)
    if not isinstance(size, int) or size < least:
        raise DataError(
            f"data.vocab_size {size} is too small for bpe: it needs the 256 bytes and"
            f" {len(specials)} special token(s), at least {least}"
        )
    return size, specials


@register_tokenizer
class BPETokenizer(BaseTokenizer):
    """Byte-level BPE learned from the corpus's training text at a chosen vocabulary size.

    Text is split with GPT-2's pre-tokenisation and every byte has a token, so any string encodes
    and ``decode(encode(text)) == text`` byte for byte. Ids ``0 .. len(special_tokens) - 1`` are the
    special tokens; the first one is the end-of-text token ``prepare`` puts between documents. As
    with GPT-2's tokenizer, a special token's spelling inside text is plain text, so user text can
    never forge a document boundary.

    ``prepare`` learns the merges from the training split's text only (see
    :func:`minigpt.data.split.training_text`), streamed: the trainer keeps word counts, never the
    text. The whole tokenizer is its spec (the Hugging Face ``tokenizer.json``), so it travels in
    prepared data, checkpoints, safetensors and exported folders. Learning is deterministic: the
    same text and options give the same vocabulary.
    """

    name = "bpe"
    options = ("vocab_size", "special_tokens")

    def __init__(self, tokenizer: HFTokenizer, learned_bytes: int | None = None) -> None:
        """
        Args:
            tokenizer: A byte-level BPE as :meth:`learn` makes it.
            learned_bytes: UTF-8 bytes of text it was learned from, the first ones of the corpus
                stream (None: not known, e.g. loaded from a model folder).
        """
        self._tokenizer = tokenizer
        # Literal special-token spellings in text are encoded as text; only prepare inserts eot_id.
        self._tokenizer.encode_special_tokens = True
        self.learned_bytes = learned_bytes
        self.n_vocab: int = tokenizer.get_vocab_size(with_added_tokens=True)
        specials = sorted(
            (i, t.content) for i, t in tokenizer.get_added_tokens_decoder().items() if t.special
        )
        self.special_tokens: dict[int, str] = dict(specials)
        """Id -> spelling of each special token."""
        self.eot_id: int | None = specials[0][0] if specials else None

    @classmethod
    def learn(
        cls,
        texts: Iterable[str],
        vocab_size: int | None = None,
        special_tokens: Sequence[str] | None = None,
    ) -> BPETokenizer:
        """Learn merges from ``texts`` (read once, as a stream) until the vocabulary has ``vocab_size`` ids.

        With ``vocab_size`` None, a text too small for the default size gets the vocabulary it
        supports, and a warning says so.

        Raises:
            DataError: Bad options, or the text has too few repeated pairs to fill a ``vocab_size`` given.
        """
        size, specials = _settings(vocab_size, special_tokens)
        tokenizer = HFTokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=size,
            min_frequency=MIN_PAIR_COUNT,
            special_tokens=list(specials),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        seen = [0]

        def counted(pieces: Iterable[str]) -> Iterator[str]:
            for piece in pieces:
                seen[0] += len(piece.encode("utf-8"))
                yield piece

        tokenizer.train_from_iterator(counted(texts), trainer=trainer)
        got = tokenizer.get_vocab_size(with_added_tokens=True)
        if got < size and vocab_size is None:
            # A small text of your own, with a config's default size: train on what it supports.
            logger.warning(
                "data.vocab_size: the training text's %s bytes support %d tokens (pairs seen %d+ times),"
                " fewer than the default %d: using %d (set data.vocab_size to choose)",
                f"{seen[0]:,}",
                got,
                MIN_PAIR_COUNT,
                size,
                got,
            )
        elif got < size:
            raise DataError(
                f"data.vocab_size {size} is more than the training text supports: its {seen[0]:,} bytes"
                f" give only {got} tokens (pairs seen {MIN_PAIR_COUNT}+ times); lower vocab_size"
            )
        return cls(tokenizer, learned_bytes=seen[0])

    @classmethod
    def build(
        cls,
        texts: Iterable[str] | None,
        *,
        tokenizer_path: str | None = None,
        num_threads: int | None = None,
        vocab_size: int | None = None,
        special_tokens: Sequence[str] | None = None,
    ) -> BPETokenizer:
        """A BPE learned from all of ``texts``."""
        return cls.learn(require_texts(texts, cls.name), vocab_size, special_tokens)

    @classmethod
    def corpus_encoder(
        cls,
        texts: Iterable[str],
        *,
        tokenizer_path: str | None = None,
        num_threads: int | None = None,
        vocab_size: int | None = None,
        special_tokens: Sequence[str] | None = None,
    ) -> BPETokenizer:
        """A BPE learned from ``texts``, the training split's text."""
        return cls.learn(texts, vocab_size, special_tokens)

    @classmethod
    def cache_key(cls, vocab_size: int | None = None, special_tokens: Sequence[str] | None = None) -> dict:
        size, specials = _settings(vocab_size, special_tokens)
        trainer = {"min_frequency": MIN_PAIR_COUNT, "pre_tokenizer": "ByteLevel(gpt2 regex)"}
        return {"name": cls.name, "vocab_size": size, "special_tokens": list(specials), "trainer": trainer}

    @classmethod
    def train_tokens_at_least(cls, tokenizer: Tokenizer, token_arrays: Iterator[np.ndarray]) -> int:
        """Tokens of the stream up to the end of the text the vocabulary was learned from."""
        if not isinstance(tokenizer, BPETokenizer) or tokenizer.learned_bytes is None:
            raise TypeError("the split of a bpe corpus needs the tokenizer prepare learned")
        lengths, position, done = tokenizer.byte_lengths(), 0, 0
        for tokens in token_arrays:
            ends = done + np.cumsum(lengths[tokens])
            # The first token that reaches the end of the learned text, and it, stay in training.
            reached = int(np.searchsorted(ends, tokenizer.learned_bytes, side="left"))
            if reached < len(tokens):
                return position + reached + 1
            position, done = position + len(tokens), int(ends[-1]) if len(ends) else done
        return position

    @classmethod
    def from_spec(cls, spec: dict[str, Any], tokenizer_path: str | None = None) -> BPETokenizer:
        text = spec.get("tokenizer_json")
        if not isinstance(text, str):
            raise DataError("bpe spec has no 'tokenizer_json' string")
        return cls.from_hf_json(text, spec.get("learned_bytes"))

    @classmethod
    def from_hf_json(cls, text: str, learned_bytes: int | None = None) -> BPETokenizer:
        """The tokenizer a Hugging Face ``tokenizer.json`` describes, if it is a byte-level BPE.

        Raises:
            DataError: It cannot be parsed or is another kind of tokenizer.
        """
        try:
            tokenizer = HFTokenizer.from_str(text)
        except Exception as error:  # tokenizers raises a bare Exception for malformed JSON
            raise DataError(f"bpe tokenizer.json cannot be read: {error}") from None
        description = json.loads(text)
        if (description.get("model") or {}).get("type") != "BPE" or not isinstance(
            tokenizer.pre_tokenizer, pre_tokenizers.ByteLevel
        ):
            raise DataError("bpe tokenizer.json does not describe a byte-level BPE")
        return cls(tokenizer, learned_bytes)

    @classmethod
    def spec_from_hf_tokenizer_json(
        cls, hf_json: dict[str, Any], n_vocab: int, tokenizer_path: str | None = None
    ) -> dict[str, Any] | None:
        """The spec of the byte-level BPE ``hf_json`` describes, for a model of ``n_vocab`` ids."""
        try:
            tokenizer = cls.from_hf_json(json.dumps(hf_json))
        except DataError:
            return None
        return tokenizer.spec() if tokenizer.n_vocab == n_vocab else None

    def hf_tokenizer_json(self) -> str | None:
        """The Hugging Face ``tokenizer.json`` of this tokenizer (``tokenizers.Tokenizer.from_str``
        and transformers' ``PreTrainedTokenizerFast(tokenizer_file=...)`` read it)."""
        return self._tokenizer.to_str()

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return encode_with(self._tokenizer, texts)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(self._checked_ids(ids), skip_special_tokens=False)

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "learned_bytes": self.learned_bytes,
            "tokenizer_json": self.hf_tokenizer_json(),
        }

    def token_bytes(self) -> list[bytes]:
        """Every token's bytes, by id; a special token's are its spelling's."""
        byte_of = {char: byte for byte, char in byte_to_char().items()}
        out = [b""] * self.n_vocab
        for token, i in self._tokenizer.get_vocab(with_added_tokens=False).items():
            out[i] = bytes(byte_of[char] for char in token)
        for i, spelling in self.special_tokens.items():
            out[i] = spelling.encode()
        return out

    def byte_lengths(self) -> np.ndarray:
        """``(n_vocab,)`` int64: the text bytes each id stands for in a prepared stream (part of a
        character, for some byte-level tokens), where special tokens are separators and stand for none."""
        lengths = np.array([len(b) for b in self.token_bytes()], dtype=np.int64)
        lengths[list(self.special_tokens)] = 0
        return lengths
