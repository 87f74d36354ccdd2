"""Tokenizers, found by name in a registry: GPT-2's BPE (through tiktoken), the same BPE renumbered over
the tokens a corpus uses, a character vocabulary, and a byte-level BPE learned from the corpus.

Every tokenizer can describe itself as a JSON-serialisable :meth:`Tokenizer.spec`; the spec is
stored with prepared data and in checkpoints so :func:`tokenizer_from_spec` rebuilds exactly the
tokenizer the model was trained with. A new tokenizer is a :class:`BaseTokenizer` subclass
decorated with :func:`register_tokenizer` (see :mod:`.base` and :mod:`.registry`).
"""

from .base import BaseTokenizer, IdMap, Tokenizer, available_cores
from .chat_tokens import CHAT_TOKENS, ChatTokenizer, with_chat_tokens
from .registry import (
    TOKENIZERS,
    build_tokenizer,
    register_tokenizer,
    spec_from_hf_tokenizer_json,
    tokenizer_class,
    tokenizer_from_spec,
)

# isort: off
# Importing a module registers its tokenizer; this order is the order error messages list the names in.
from .gpt2 import GPT2_SPEC, GPT2Tokenizer
from .compact import CompactGPT2Tokenizer
from .char import CharTokenizer
from .bpe import BPETokenizer

# isort: on

__all__ = [
    "CHAT_TOKENS",
    "GPT2_SPEC",
    "TOKENIZERS",
    "BPETokenizer",
    "BaseTokenizer",
    "CharTokenizer",
    "ChatTokenizer",
    "CompactGPT2Tokenizer",
    "GPT2Tokenizer",
    "IdMap",
    "Tokenizer",
    "available_cores",
    "build_tokenizer",
    "register_tokenizer",
    "spec_from_hf_tokenizer_json",
    "tokenizer_class",
    "tokenizer_from_spec",
    "with_chat_tokens",
]
