"""GPT-2's vocabulary in the files Hugging Face tokenizers read (`vocab.json`, `merges.txt`) and back.

tiktoken describes a byte-pair vocabulary by its tokens' bytes in merge order (a token's rank is
its id); Hugging Face's GPT-2 tokenizer by a token -> id map and the list of merges, with every
byte written as a printable character. The two carry the same information (see
`minigpt.data.tokenizer.hf_json`, which also writes other vocabularies as `tokenizer.json`).
A tokenizer with the chat markers also gets the chat template, in the form transformers renders.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minigpt.data.chat.template import CHAT_TEMPLATE
from minigpt.data.gpt2_encoding import ENDOFTEXT, ENDOFTEXT_ID, N_VOCAB, R50K_SHA256
from minigpt.data.tokenizer import ChatTokenizer
from minigpt.data.tokenizer.hf_json import as_text, bpe_merges, byte_to_char

from .errors import CheckpointError

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"


def write_gpt2_vocabulary(tokens: list[bytes], folder: Path) -> list[str]:
    """Write `vocab.json` and `merges.txt` for GPT-2's tokens (bytes by id); returns the file names."""
    table = byte_to_char()
    vocab = {as_text(token, table): i for i, token in enumerate(tokens)}
    vocab[ENDOFTEXT] = ENDOFTEXT_ID
    merges = ["#version: 0.2"]
    merges += [f"{as_text(left, table)} {as_text(right, table)}" for left, right in bpe_merges(tokens)]
    (folder / VOCAB_FILE).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / MERGES_FILE).write_text("\n".join(merges) + "\n", encoding="utf-8")
    return [VOCAB_FILE, MERGES_FILE]


def chat_template_with_markers(markers: Mapping[str, str], template: str | None = None) -> str:
    """The chat template (by default the one training and the server read) that sets its
    `chat_tokens` to `markers` itself: transformers renders a template with the messages alone."""
    source = CHAT_TEMPLATE.read_text(encoding="utf-8") if template is None else template
    return "{%- set chat_tokens = " + json.dumps(dict(markers)) + " -%}\n" + source


def chat_settings(tokenizer: ChatTokenizer) -> dict[str, Any]:
    """`tokenizer_config.json`'s settings for a tokenizer with the chat markers: the template,
    which `apply_chat_template` renders and encodes to the ids `minigpt.data.chat.ChatEncoder`
    gives, and the end marker as the token that ends a reply."""
    return {
        "eos_token": tokenizer.markers["end"],
        # The rendered template is encoded as one text, so its markers must read as markers.
        "split_special_tokens": False,
        "chat_template": chat_template_with_markers(tokenizer.markers),
    }


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
