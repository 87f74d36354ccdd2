"""The tokenizer interface and the base class of every tokenizer minigpt can build by name.

A :class:`BaseTokenizer` subclass says how it is built, rebuilt from its spec and used by
``prepare``; :mod:`.registry` finds it by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from minigpt.common import available_cores as available_cores  # re-exported: the tokenizers use it

from ..errors import DataError


@runtime_checkable
class Tokenizer(Protocol):
    """What the rest of minigpt needs from a tokenizer."""

    name: str
    """Registry name (a key of :data:`TOKENIZERS`)."""
    n_vocab: int
    """Number of token ids; every id is in ``[0, n_vocab)``."""
    eot_id: int | None
    """Id of the end-of-text token placed between documents, or None if the vocabulary has none."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; raises DataError if the text cannot be represented."""
        ...

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """``encode`` of each text as a 1-D uint32 array: how the data pipeline tokenizes documents."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; raises DataError for an id outside the vocabulary."""
        ...

    def spec(self) -> dict[str, Any]:
        """JSON-serialisable description from which :func:`tokenizer_from_spec` rebuilds this tokenizer."""
        ...

    def byte_lengths(self) -> np.ndarray:
        """``(n_vocab,)`` int64: the UTF-8 bytes each id stands for; 0 for special tokens."""
        ...


IdMap = Callable[[np.ndarray], np.ndarray]
"""Maps a 1-D uint32 array of one tokenizer's ids to another's, one id for one id."""


class BaseTokenizer(ABC):
    """A :class:`Tokenizer` that also knows how it is made: from a corpus, from its spec, and in ``prepare``.

    A subclass sets :attr:`name`, implements ``encode_to_arrays``, ``decode`` and ``spec`` (``encode``
    follows from ``encode_to_arrays``), and the class methods :meth:`from_spec` and :meth:`build`. The
    other class methods have defaults that fit a tokenizer which encodes the corpus itself and
    depends on nothing but the corpus.
    """

    name: ClassVar[str]
    """Registry name; also the ``"name"`` entry of :meth:`spec`."""
    options: ClassVar[tuple[str, ...]] = ()
    """``DataConfig`` fields this tokenizer is built with besides the corpus (``bpe``: ``vocab_size``,
    ``special_tokens``), passed by name to :meth:`build`, :meth:`corpus_encoder` and :meth:`cache_key`;
    a tokenizer without options is never passed any."""
    n_vocab: int
    eot_id: int | None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; raises DataError if the text cannot be represented."""
        return self.encode_to_arrays([text])[0].tolist()

    @abstractmethod
    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text as a 1-D uint32 array."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; raises DataError for an id outside the vocabulary."""

    @abstractmethod
    def spec(self) -> dict[str, Any]:
        """JSON-serialisable description from which :meth:`from_spec` rebuilds this tokenizer."""

    def byte_lengths(self) -> np.ndarray:
        """``(n_vocab,)`` int64: how many bytes of UTF-8 text each id stands for, 0 for special
        tokens (end-of-text), which stand for no text. Bits per byte divide by these.

        By default each id is decoded alone, which is right where every id is whole characters. A
        byte-level tokenizer, whose ids may stand for part of a character, must override it.

        Raises:
            DataError: An id decodes alone to a partial character (U+FFFD), so its bytes are unknown.
        """
        lengths = np.zeros(self.n_vocab, dtype=np.int64)
        for i in range(self.n_vocab):
            if i == self.eot_id:
                continue
            text = self.decode([i])
            if "\ufffd" in text:
                raise DataError(
                    f"the {self.name} tokenizer cannot say how many bytes token {i} stands for: it "
                    "decodes alone to part of a character (the tokenizer must define byte_lengths)"
                )
            lengths[i] = len(text.encode("utf-8"))
        return lengths

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: dict[str, Any], tokenizer_path: str | None = None) -> BaseTokenizer:
        """Rebuild the tokenizer a :meth:`spec` describes; ``spec["name"]`` is already known to match.

        Args:
            spec: As stored in ``meta.json`` of prepared data or in a checkpoint.
            tokenizer_path: GPT-2 ranks file for air-gapped machines; a spec never stores a path.

        Raises:
            DataError: The spec is malformed.
        """

    @classmethod
    @abstractmethod
    def build(
        cls, texts: Iterable[str] | None, *, tokenizer_path: str | None = None, num_threads: int | None = None
    ) -> BaseTokenizer:
        """A new tokenizer for a corpus.

        Args:
            texts: The corpus, for a tokenizer whose vocabulary is read off it (see
                :func:`require_texts`); None when the caller has none.
            tokenizer_path: GPT-2 ranks file, for tokenizers built on GPT-2's BPE.
            num_threads: Encoding threads, for tokenizers that encode in parallel.
        """

    @classmethod
    def cache_key(cls) -> dict[str, Any]:
        """Everything besides the corpus text that decides the tokens ``prepare`` writes.

        It is hashed into the name of the prepared-data folder, so changing what it returns makes
        existing folders unreachable. The name suffices when the vocabulary follows from the corpus
        alone; a tokenizer that reads outside files names them too.
        """
        return {"name": cls.name}

    @classmethod
    def corpus_encoder(
        cls, texts: Iterable[str], *, tokenizer_path: str | None = None, num_threads: int | None = None
    ) -> Tokenizer:
        """The tokenizer ``prepare`` encodes the corpus documents with: by default this class, built.

        ``texts`` is the training split's text (:func:`minigpt.data.split.training_text`), read
        lazily: only a tokenizer that learns its vocabulary from text reads it. A tokenizer whose
        vocabulary is read off another tokenizer's output returns that other tokenizer here and
        derives itself in :meth:`from_corpus_tokens`.
        """
        return cls.build(texts, tokenizer_path=tokenizer_path, num_threads=num_threads)

    @classmethod
    def from_corpus_tokens(
        cls, encoder: Tokenizer, token_arrays: Iterator[np.ndarray]
    ) -> tuple[Tokenizer, IdMap | None]:
        """The tokenizer ``prepare`` stores, given :meth:`corpus_encoder`'s tokens of the whole corpus.

        Args:
            encoder: What :meth:`corpus_encoder` returned.
            token_arrays: The encoded corpus, in pieces; need not be read.

        Returns:
            The final tokenizer, and the map from the encoder's ids to its ids that ``prepare``
            applies while writing the splits (None: the encoder's ids are final). By default the
            encoder itself and no map.
        """
        return encoder, None

    def hf_tokenizer_json(self) -> str | None:
        """This vocabulary as a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library's file, which
        ``transformers.AutoTokenizer`` reads), encoding and decoding as this tokenizer does; None
        (the default) when it cannot express itself as one. Export writes the file when given one."""
        return None

    @classmethod
    def spec_from_hf_tokenizer_json(
        cls, hf_json: dict[str, Any], n_vocab: int, tokenizer_path: str | None = None
    ) -> dict[str, Any] | None:
        """The :meth:`spec` of the tokenizer of this class whose :meth:`hf_tokenizer_json` wrote
        ``hf_json`` (the parsed file) for a model of ``n_vocab`` ids; None (the default) when the file
        is not one this class writes. How minigpt reads back a folder that lost its own spec, e.g.
        one transformers' ``save_pretrained`` wrote."""
        return None

    @classmethod
    def train_tokens_at_least(cls, tokenizer: Tokenizer, token_arrays: Iterator[np.ndarray]) -> int:
        """How many tokens from the start of the stream must stay in the training split, given the
        final tokenizer and the finished stream: for a vocabulary learned from text, the tokens of
        that text, so validation never holds text the tokenizer saw. By default none."""
        return 0

    def _checked_ids(self, ids: Sequence[int]) -> list[int]:
        """``ids`` as Python ints; raises DataError for one outside ``[0, n_vocab)``."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.n_vocab]
        if bad:
            raise DataError(f"token id {bad[0]} is outside the {self.name} vocabulary of {self.n_vocab} ids")
        return ids


def require_texts(texts: Iterable[str] | None, name: str) -> Iterable[str]:
    """``texts``, for a :meth:`BaseTokenizer.build` that reads its vocabulary off the corpus.

    Raises:
        ValueError: ``texts`` is None, a mistake in the calling code rather than in user input.
    """
    if texts is None:
        raise ValueError(f"the {name} tokenizer is built from corpus text; pass texts=")
    return texts
