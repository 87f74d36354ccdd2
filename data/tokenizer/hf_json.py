"""Vocabularies as Hugging Face `tokenizers` files (`tokenizer.json`), built with that library.

`AutoTokenizer.from_pretrained` reads such a file with no code of ours. Two kinds cover minigpt's
tokenizers: one token per character (`char_tokenizer_json`), and GPT-2's byte-level BPE with the
ids renumbered (`byte_level_bpe_json`). GPT-2's BPE is described by its tokens' bytes in merge
order (tiktoken's view); Hugging Face's by a token -> id map and the merges, with every byte
written as a printable character (`byte_to_char`). The merge that makes a token is found by
running byte-pair encoding on its bytes with only the merges ranked before it (`merge_of`).
`encode_with` encodes texts with such a tokenizer, as minigpt's tokenizers built on one do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .pretokens import split_at_safe_breaks

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer


def byte_to_char() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves,
    the others (controls, space, ...) for the characters from U+0100 on, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def as_text(token: bytes, table: dict[int, str]) -> str:
    """`token`'s bytes as the printable characters of `table` (`byte_to_char`)."""
    return "".join(table[byte] for byte in token)


def merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two tokens whose merge makes `token`: byte-pair encoding of its bytes, allowed only the
    merges ranked before it, stops at exactly two parts."""
    limit = ranks[token]
    parts = [bytes([byte]) for byte in token]
    while True:
        best_rank, best = math.inf, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], math.inf)
            if rank < best_rank and rank < limit:
                best_rank, best = rank, i
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} is not the merge of two earlier tokens")
    return parts[0], parts[1]


def bpe_merges(tokens: Sequence[bytes]) -> list[tuple[bytes, bytes]]:
    """The merges of a byte-pair vocabulary given as its tokens' bytes in rank order, in that order."""
    ranks = {token: i for i, token in enumerate(tokens)}
    return [merge_of(token, ranks) for token in tokens if len(token) > 1]


def char_tokenizer_json(chars: str) -> str:
    """One token per character, id i for `chars[i]`; a character outside `chars` is an error when
    encoding (there is no unknown token), and decoding joins the characters as they are."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({char: i for i, char in enumerate(chars)}, unk_token=_NO_UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return tokenizer.to_str()


_NO_UNKNOWN = "<no unknown token>"
"""Names no token of a character vocabulary, so `tokenizers` refuses unknown characters."""


def chars_of_tokenizer_json(hf_json: dict[str, Any]) -> str | None:
    """The vocabulary (character of id 0, 1, ...) of a file `char_tokenizer_json` wrote, else None."""
    model = hf_json.get("model") or {}
    vocab = model.get("vocab")
    if (
        model.get("type") != "WordLevel"
        or model.get("unk_token") != _NO_UNKNOWN
        or not isinstance(vocab, dict)
    ):
        return None
    by_id = {token_id: char for char, token_id in vocab.items()}
    if sorted(by_id) != list(range(len(vocab))) or any(len(char) != 1 for char in vocab):
        return None
    return "".join(by_id[i] for i in range(len(vocab)))


def byte_level_vocabulary(hf_json: dict[str, Any]) -> tuple[dict[int, bytes], dict[str, int]] | None:
    """The tokens (id -> bytes) and special tokens (text -> id) of a byte-level BPE file such as
    `byte_level_bpe_json` writes, else None."""
    model = hf_json.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or (hf_json.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        return None
    special = {
        token["content"]: token["id"] for token in hf_json.get("added_tokens") or [] if token.get("special")
    }
    char_to_byte = {char: byte for byte, char in byte_to_char().items()}
    tokens = {}
    for text, token_id in (vocab or {}).items():
        if text in special:
            continue
        if not isinstance(token_id, int) or any(char not in char_to_byte for char in text):
            return None
        tokens[token_id] = bytes(char_to_byte[char] for char in text)
    return tokens, special


def merge_pairs(merges: Any) -> list[tuple[str, ...]] | None:
    """A ``tokenizer.json``'s merges as pairs, whether written as ``"a b"`` or ``["a", "b"]``."""
    if not isinstance(merges, list):
        return None
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]


def byte_level_bpe_json(
    tokens: Sequence[bytes],
    ids: Sequence[int],
    special: dict[str, int],
    merges: Sequence[tuple[bytes, bytes]] | None = None,
) -> str:
    """GPT-2's byte-level BPE over `tokens` (every token's bytes, in rank order), token `tokens[r]`
    numbered `ids[r]`, with the special tokens `special` (text -> id) added.

    `merges` are the pairs to merge, in rank order, when the caller has them (None: `bpe_merges`
    of `tokens`); each must make a token of `tokens`. Special tokens in text are read as plain
    text, as minigpt's GPT-2 tokenizers read them; `tokenizer_config.json` says so to
    transformers (`split_special_tokens`).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    table = byte_to_char()
    vocab = {as_text(token, table): token_id for token, token_id in zip(tokens, ids, strict=True)}
    vocab |= special
    pairs = bpe_merges(tokens) if merges is None else merges
    written = [(as_text(left, table), as_text(right, table)) for left, right in pairs]
    tokenizer = Tokenizer(models.BPE(vocab, written))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in special])
    return tokenizer.to_str()


def encode_with(tokenizer: HFTokenizer, texts: list[str]) -> list[np.ndarray]:
    """The ids (1-D uint32) a byte-level ``tokenizers`` BPE gives each text, long texts cut where
    GPT-2's pre-tokenisation cuts anyway (:func:`split_at_safe_breaks`), all pieces in one batch."""
    pieces = [split_at_safe_breaks(text) for text in texts]
    flat = [piece for parts in pieces for piece in parts]
    # encode_batch_fast skips offsets and spreads the batch over the library's threads.
    encoded = tokenizer.encode_batch_fast(flat, add_special_tokens=False) if flat else []
    out, i = [], 0
    for parts in pieces:
        ids = [np.asarray(e.ids, dtype=np.uint32) for e in encoded[i : i + len(parts)]]
        out.append(np.concatenate(ids) if ids else np.zeros(0, dtype=np.uint32))
        i += len(parts)
    return out
