"""GPT-2's vocabulary in the files Hugging Face tokenizers read (`vocab.json`, `merges.txt`) and back.

tiktoken describes a byte-pair vocabulary by its tokens' bytes in merge order (a token's rank is
its id); Hugging Face's GPT-2 tokenizer by a token -> id map and the list of merges, with every
byte written as a printable character. The two carry the same information: the merge that makes
a token is found by running byte-pair encoding on its bytes with the merges ranked before it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from pathlib import Path

from minigpt.data.gpt2_encoding import ENDOFTEXT, ENDOFTEXT_ID, N_VOCAB, R50K_SHA256

from .errors import CheckpointError

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"


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


def _as_text(token: bytes, table: dict[int, str]) -> str:
    return "".join(table[byte] for byte in token)


def _merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
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


def write_gpt2_vocabulary(tokens: list[bytes], folder: Path) -> list[str]:
    """Write `vocab.json` and `merges.txt` for GPT-2's tokens (bytes by id); returns the file names."""
    table = byte_to_char()
    vocab = {_as_text(token, table): i for i, token in enumerate(tokens)}
    vocab[ENDOFTEXT] = ENDOFTEXT_ID
    ranks = {token: i for i, token in enumerate(tokens)}
    merges = ["#version: 0.2"]
    for token in tokens:
        if len(token) > 1:
            left, right = _merge_of(token, ranks)
            merges.append(f"{_as_text(left, table)} {_as_text(right, table)}")
    (folder / VOCAB_FILE).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / MERGES_FILE).write_text("\n".join(merges) + "\n", encoding="utf-8")
    return [VOCAB_FILE, MERGES_FILE]


def gpt2_ranks_from_vocabulary(path: Path) -> bytes:
    """The contents of GPT-2's `r50k_base.tiktoken` rebuilt from a Hugging Face `vocab.json`.

    Raises:
        CheckpointError: The file is unreadable or is not GPT-2's vocabulary (checked by the
            rebuilt ranks' sha256, the one tiktoken's GPT-2 encoding has).
    """
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {path}: {err}") from None
    char_to_byte = {char: byte for byte, char in byte_to_char().items()}
    not_gpt2 = CheckpointError(
        f"{path} is not GPT-2's vocabulary; minigpt reads GPT-2 models with GPT-2's tokenizer only"
    )
    if not isinstance(vocab, dict) or len(vocab) != N_VOCAB or vocab.get(ENDOFTEXT) != ENDOFTEXT_ID:
        raise not_gpt2
    by_id: dict[int, bytes] = {}
    for text, token_id in vocab.items():
        if text == ENDOFTEXT:
            continue
        if not isinstance(token_id, int) or any(char not in char_to_byte for char in text):
            raise not_gpt2
        by_id[token_id] = bytes(char_to_byte[char] for char in text)
    if sorted(by_id) != list(range(ENDOFTEXT_ID)):
        raise not_gpt2
    data = b"".join(base64.b64encode(by_id[i]) + b" %d\n" % i for i in range(ENDOFTEXT_ID))
    if hashlib.sha256(data).hexdigest() != R50K_SHA256:
        raise not_gpt2
    return data
