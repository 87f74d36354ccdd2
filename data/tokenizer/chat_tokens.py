"""Any tokenizer with the chat template's role markers as special tokens.

A conversation is written with one marker per role before each message and an end-of-turn marker
after it (``data/chat/chat_template.jinja``). Each marker is a single id that no text can produce:
:meth:`ChatTokenizer.encode` reads its spelling in text as plain text, as the base tokenizers read
``<|endoftext|>``, so a user's message can never forge a turn. Only the template's own text, read
with :meth:`ChatTokenizer.encode_markup`, turns a marker's spelling into its id.

The markers take the ids after the base tokenizer's (a model fine-tuned on chats grows its
embedding by that many rows), except that a base tokenizer which already has a marker as a special
token of its own (a ``bpe`` learned with ``special_tokens`` that name it) keeps that id. The spec is
the base's spec with the markers added under :data:`CHAT_TOKENS_KEY`, so checkpoints and prepared
data rebuild the same ids (:func:`~.registry.tokenizer_from_spec`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from .base import Tokenizer

CHAT_TOKENS: dict[str, str] = {
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "end": "<|end|>",
}
"""Role -> its marker, and ``"end"``, the marker that closes every message."""
CHAT_TOKENS_KEY = "chat_tokens"
"""The spec entry holding the markers."""


class ChatTokenizer:
    """``base`` plus the chat markers: a :class:`Tokenizer` whose ``n_vocab`` counts the markers' ids."""

    def __init__(self, base: Tokenizer, markers: Mapping[str, str] = CHAT_TOKENS) -> None:
        """
        Args:
            base: The tokenizer the model was pretrained with.
            markers: Role (and ``"end"``) -> spelling; new ids are given in this order.

        Raises:
            DataError: A marker spelling is empty or repeated, or ``"end"`` is missing.
        """
        spellings = list(markers.values())
        if "end" not in markers or any(not isinstance(s, str) or not s for s in spellings):
            raise DataError(f"chat tokens must be non-empty strings and include 'end', got {dict(markers)}")
        if len(set(spellings)) != len(spellings):
            raise DataError(f"chat tokens must be distinct, got {spellings}")
        self.base = base
        self.markers = dict(markers)
        """Role (and ``"end"``) -> the marker's spelling."""
        self.name: str = base.name
        self.eot_id: int | None = base.eot_id
        own = {spelling: i for i, spelling in getattr(base, "special_tokens", {}).items()}
        self.ids: dict[str, int] = {}
        """Role (and ``"end"``) -> the marker's id."""
        next_id = base.n_vocab
        for role, spelling in self.markers.items():
            if spelling in own:
                self.ids[role] = own[spelling]
            else:
                self.ids[role], next_id = next_id, next_id + 1
        self.n_vocab: int = next_id
        self.spelling_of = {self.ids[role]: spelling for role, spelling in self.markers.items()}
        """Marker id -> spelling."""
        longest_first = sorted(spellings, key=len, reverse=True)
        self._splitter = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")")
        self._id_of = {spelling: self.ids[role] for role, spelling in self.markers.items()}

    @property
    def end_id(self) -> int:
        """The end-of-turn marker's id: where generation of the assistant's turn stops."""
        return self.ids["end"]

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` as plain text: a marker's spelling in it is text, never a marker."""
        return self.encode_to_arrays([text])[0].tolist()

    def encode_to_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return self.base.encode_to_arrays(texts)

    def encode_markup(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Ids of each text, in which every marker's spelling is that marker (for the template's
        own text, never for a message's content), as 1-D uint32 arrays."""
        pieces = [self._splitter.split(text) for text in texts]  # text, marker, text, marker, ..., text
        plain = [piece for split in pieces for piece in split[::2]]
        encoded = iter(self.base.encode_to_arrays(plain))
        out = []
        for split in pieces:
            parts = []
            for i, piece in enumerate(split):
                parts.append(next(encoded) if i % 2 == 0 else np.array([self._id_of[piece]], np.uint32))
            out.append(np.concatenate(parts).astype(np.uint32, copy=False))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.n_vocab]
        if bad:
            raise DataError(
                f"token id {bad[0]} is outside the {self.name} chat vocabulary of {self.n_vocab} ids"
            )
        text, run = [], []
        for i in ids:
            if i >= self.base.n_vocab:  # an added marker; a marker of the base's own decodes in the run
                text.append(self.base.decode(run) + self.spelling_of[i])
                run = []
            else:
                run.append(i)
        return "".join(text) + self.base.decode(run)

    def spec(self) -> dict[str, Any]:
        return self.base.spec() | {CHAT_TOKENS_KEY: dict(self.markers)}

    def byte_lengths(self) -> np.ndarray:
        """The base's byte lengths, and 0 for each added marker, which stands for no text."""
        lengths = np.zeros(self.n_vocab, dtype=np.int64)
        lengths[: self.base.n_vocab] = self.base.byte_lengths()
        return lengths

    def hf_tokenizer_json(self) -> str | None:
        """The base's ``tokenizer.json`` with the markers added as special tokens at their ids; None
        when the base has no such file, or its file gives ids from ``base.n_vocab`` on to tokens of
        its own (the first ``gpt2-compact``), so the markers cannot have theirs.

        transformers reads a special token's spelling anywhere in a text as that token, unless told
        to read the messages' text as text (``apply_chat_template(..., sanitize_control_tokens=True)``
        in recent versions); :meth:`encode` reads it as text always.
        """
        base_json = self.base.hf_tokenizer_json() if hasattr(self.base, "hf_tokenizer_json") else None
        if base_json is None:
            return None
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as HFTokenizer

        tokenizer = HFTokenizer.from_str(base_json)
        # `tokenizers` numbers a new token after every id it has: in id order, each gets its own.
        added = [self.spelling_of[i] for i in sorted(self.spelling_of) if i >= self.base.n_vocab]
        tokenizer.add_special_tokens([AddedToken(marker, special=True, normalized=False) for marker in added])
        numbered = {spelling: tokenizer.token_to_id(spelling) for spelling in self.spelling_of.values()}
        if numbered != {spelling: i for i, spelling in self.spelling_of.items()}:
            return None
        return tokenizer.to_str()


def with_chat_tokens(tokenizer: Tokenizer, markers: Mapping[str, str] = CHAT_TOKENS) -> ChatTokenizer:
    """``tokenizer`` with the chat markers; one that has them already is returned as it is."""
    if isinstance(tokenizer, ChatTokenizer):
        if tokenizer.markers != dict(markers):
            raise DataError(f"the tokenizer's chat tokens {tokenizer.markers} are not {dict(markers)}")
        return tokenizer
    return ChatTokenizer(tokenizer, markers)
