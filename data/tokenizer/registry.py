"""The registry of tokenizers minigpt can build by name.

:data:`TOKENIZERS` maps a name to its class. Everything that takes a tokenizer name (``DataConfig``,
:func:`build_tokenizer`, :func:`tokenizer_from_spec`, ``prepare``) looks it up there and asks the
class what to do, so a new tokenizer is one :class:`~.base.BaseTokenizer` subclass and one
:func:`register_tokenizer` line; nothing else in the data pipeline names tokenizers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from ..errors import DataError
from .base import BaseTokenizer, Tokenizer
from .chat_tokens import CHAT_TOKENS_KEY, ChatTokenizer

TOKENIZERS: dict[str, type[BaseTokenizer]] = {}
"""Name -> class of every tokenizer that can be built by name, in the order error messages list them."""

TokenizerClass = TypeVar("TokenizerClass", bound=type[BaseTokenizer])


def register_tokenizer(cls: TokenizerClass) -> TokenizerClass:
    """Make ``cls`` available under ``cls.name``; usable as a class decorator.

    Raises:
        ValueError: Another class is registered under that name.
    """
    registered = TOKENIZERS.setdefault(cls.name, cls)
    if registered is not cls:
        raise ValueError(f"tokenizer name {cls.name!r} is already taken by {registered.__qualname__}")
    return cls


def _valid_names() -> str:
    return ", ".join(TOKENIZERS)


def tokenizer_class(name: str) -> type[BaseTokenizer]:
    """The class registered as ``name``.

    Raises:
        DataError: No tokenizer has that name; the message lists the valid ones.
    """
    if not isinstance(name, str) or name not in TOKENIZERS:
        raise DataError(f"unknown tokenizer {name!r}; valid names: {_valid_names()}")
    return TOKENIZERS[name]


def tokenizer_from_spec(spec: dict[str, Any], tokenizer_path: str | None = None) -> Tokenizer:
    """Rebuild the tokenizer described by ``spec`` (from :meth:`Tokenizer.spec`).

    Args:
        spec: As stored in ``meta.json`` of prepared data or in a checkpoint; with chat markers
            (:data:`CHAT_TOKENS_KEY`), the named tokenizer with them (:class:`ChatTokenizer`).
        tokenizer_path: GPT-2 ranks file for air-gapped machines; the spec never stores a path.

    Raises:
        DataError: The spec is malformed or names an unknown tokenizer.
    """
    name = spec.get("name") if isinstance(spec, dict) else None
    if not isinstance(name, str) or name not in TOKENIZERS:
        raise DataError(f"tokenizer spec names unknown tokenizer {name!r}; valid names: {_valid_names()}")
    if CHAT_TOKENS_KEY in spec:  # a tokenizer with the chat markers added (see ChatTokenizer)
        markers = spec[CHAT_TOKENS_KEY]
        if not isinstance(markers, dict):
            raise DataError(f"tokenizer spec's {CHAT_TOKENS_KEY!r} is not a mapping of role to token")
        base = {key: value for key, value in spec.items() if key != CHAT_TOKENS_KEY}
        return ChatTokenizer(TOKENIZERS[name].from_spec(base, tokenizer_path), markers)
    return TOKENIZERS[name].from_spec(spec, tokenizer_path)


def spec_from_hf_tokenizer_json(
    hf_json: dict[str, Any], n_vocab: int, tokenizer_path: str | None = None
) -> dict[str, Any] | None:
    """The spec of the registered tokenizer that wrote ``hf_json`` (a parsed ``tokenizer.json``) for a
    model of ``n_vocab`` ids, or None when none of them did (see
    :meth:`BaseTokenizer.spec_from_hf_tokenizer_json`)."""
    for cls in TOKENIZERS.values():
        spec = cls.spec_from_hf_tokenizer_json(hf_json, n_vocab, tokenizer_path)
        if spec is not None:
            return spec
    return None


def build_tokenizer(
    name: str,
    *,
    tokenizer_path: str | None = None,
    texts: Iterable[str] | None = None,
    num_threads: int | None = None,
    **options: Any,
) -> Tokenizer:
    """A new tokenizer by name (see :meth:`BaseTokenizer.build`).

    Args:
        name: A key of :data:`TOKENIZERS`.
        tokenizer_path: GPT-2 ranks file (for the GPT-2 tokenizers).
        texts: The corpus, required by tokenizers whose vocabulary is read off it (``"char"``,
            ``"gpt2-compact"``).
        num_threads: GPT-2 encoding threads per process (default: all available cores).
        options: The tokenizer's :attr:`~BaseTokenizer.options` (``bpe``: ``vocab_size=4096``).

    Raises:
        DataError: Unknown name.
        ValueError: The tokenizer needs ``texts`` and none were given.
    """
    return tokenizer_class(name).build(
        texts, tokenizer_path=tokenizer_path, num_threads=num_threads, **options
    )
