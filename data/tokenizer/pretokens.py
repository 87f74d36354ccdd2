"""Where GPT-2's pre-tokenisation always cuts, so a long text cut there encodes to the tokens of the
whole: what lets tiktoken and Hugging Face's tokenizers encode pieces of one text in parallel, and
what the training split of a learned vocabulary cuts at."""

from __future__ import annotations

import re

SAFE_CUT = re.compile(r"(?<=[!-~]\n)(?=[!-~])")
"""A line break between two printable ASCII characters: always a boundary between GPT-2
pre-tokens, and the pre-tokens on either side come out the same whether or not the text is cut
there."""


def split_at_safe_breaks(text: str, chunk_chars: int = 1 << 17) -> list[str]:
    """``text`` in pieces of about ``chunk_chars`` characters, cut only where GPT-2's pre-tokenisation
    cuts anyway, so encoding the pieces gives the tokens of the whole (and pieces encode in parallel)."""
    pieces, start = [], 0
    while len(text) - start > chunk_chars:
        cut = SAFE_CUT.search(text, start + chunk_chars)
        if cut is None:
            break
        pieces.append(text[start : cut.start()])
        start = cut.start()
    pieces.append(text[start:])
    return pieces
