"""Which GPT-2 tokens a gpt2-compact vocabulary holds: those of a corpus, the 256 single-byte tokens,
``<|endoftext|>`` and, in the current version, every token GPT-2 merges on the way to them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import tiktoken

from ..gpt2_encoding import ENDOFTEXT_ID, N_VOCAB
from .gpt2 import GPT2Tokenizer
from .hf_json import merge_of


def corpus_vocabulary(token_arrays: Iterable[np.ndarray], gpt2: GPT2Tokenizer, *, closed: bool) -> np.ndarray:
    """GPT-2 ids, increasing, of the tokens in ``token_arrays`` (a tokenized corpus), the bytes and
    ``<|endoftext|>``, and (``closed``) the tokens merged on the way."""
    used = np.zeros(N_VOCAB, dtype=bool)
    used[byte_token_ids(gpt2._encoding)] = True
    used[ENDOFTEXT_ID] = True
    for tokens in token_arrays:
        used[tokens] = True
    if closed:
        used = closed_under_merges(used, gpt2)
    return np.flatnonzero(used)


def gpt2_token_arrays(texts: Iterable[str], gpt2: GPT2Tokenizer, batch_size: int) -> Iterator[np.ndarray]:
    """GPT-2's tokens of each of ``texts``, encoded ``batch_size`` texts at a time."""
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == batch_size:
            yield from gpt2.encode_to_arrays(batch)
            batch.clear()
    yield from gpt2.encode_to_arrays(batch)


def byte_token_ids(encoding: tiktoken.Encoding) -> np.ndarray:
    """``(256,)`` GPT-2 id of the single-byte token of each byte value."""
    return np.array([encoding.encode_single_token(bytes([b])) for b in range(256)], dtype=np.int64)


def gpt2_ranks(gpt2: GPT2Tokenizer) -> dict[bytes, int]:
    """Token bytes -> GPT-2 id (its merge rank), for every ordinary GPT-2 token."""
    return {token: i for i, token in enumerate(gpt2.token_bytes())}


def closed_under_merges(used: np.ndarray, gpt2: GPT2Tokenizer) -> np.ndarray:
    """``used`` (a mask over GPT-2 ids) with, for each of its tokens, the two tokens GPT-2 merges
    into it, and so on down to single bytes."""
    tokens, ranks = gpt2.token_bytes(), gpt2_ranks(gpt2)
    closed = used.copy()
    todo = [int(i) for i in np.flatnonzero(used) if i != ENDOFTEXT_ID]
    while todo:
        token = tokens[todo.pop()]
        if len(token) < 2:
            continue
        for part in merge_of(token, ranks):
            if not closed[ranks[part]]:
                closed[ranks[part]] = True
                todo.append(ranks[part])
    return closed
