"""The training split's text, for a tokenizer that learns its vocabulary before the split exists.

``prepare`` splits the *token* stream (the last ``val_fraction`` of it is validation), but a
learned vocabulary has to exist before there are tokens. So it learns from the first
``(1 - val_fraction)`` of the corpus's *bytes* (of ``max_tokens`` bytes when a budget is set:
every token but an end-of-text holds at least one byte, so that text lies within the budget's
training tokens), cut where GPT-2's pre-tokenisation cuts anyway; ``prepare`` then makes sure the
validation split starts after it (:meth:`BaseTokenizer.train_tokens_at_least`). Text is read as a
stream, one batch of documents at a time.
"""

from __future__ import annotations

from collections.abc import Iterator

from .corpus import Corpus
from .tokenizer.pretokens import SAFE_CUT

_LOOK_BACK = 1 << 16


def train_text_bytes(corpus: Corpus, val_fraction: float, max_tokens: int | None = None) -> int:
    """UTF-8 bytes of the corpus's training text: ``1 - val_fraction`` of its bytes, or of
    ``max_tokens`` bytes when that is fewer. Reads the corpus (up to ``max_tokens`` bytes) once."""
    total = 0
    for texts in corpus.batches():
        total += sum(len(text.encode("utf-8")) for text in texts)
        if max_tokens is not None and total >= max_tokens:
            total = max_tokens
            break
    return int(total * (1.0 - val_fraction))


def _safe_cut_before(text: str, index: int) -> int:
    """The last position at or before ``index`` where cutting ``text`` leaves its GPT-2 pre-tokens
    unchanged (0 when there is none)."""
    stop = index
    while stop > 0:
        start = max(0, stop - _LOOK_BACK)
        # endpos stop + 1 lets the look-ahead see the character at stop; the look-behind sees before start.
        cuts = [match.start() for match in SAFE_CUT.finditer(text, start, stop + 1)]
        if cuts:
            return cuts[-1]
        stop = start
    return 0


def split_texts(corpus: Corpus, limit: int) -> Iterator[tuple[str, bool]]:
    """``(text, in training)`` for the corpus in order: the documents of the first ``limit`` bytes
    are training text; the document that straddles ``limit`` is cut at a safe line break before it
    into a training piece and the rest."""
    left = limit
    for texts in corpus.batches():
        for text in texts:
            if left <= 0:
                yield text, False
                continue
            data = text.encode("utf-8")
            if len(data) <= left:
                left -= len(data)
                yield text, True
                continue
            cut = _safe_cut_before(text, len(data[:left].decode("utf-8", errors="ignore")))
            left = 0
            if cut:
                yield text[:cut], True
            yield text[cut:], False


def training_text(corpus: Corpus, val_fraction: float, max_tokens: int | None = None) -> Iterator[str]:
    """The corpus's training text, as documents and one final piece (see the module's description)."""
    limit = train_text_bytes(corpus, val_fraction, max_tokens)
    for text, in_training in split_texts(corpus, limit):
        if not in_training:
            return
        yield text


def validation_text(corpus: Corpus, val_fraction: float, max_tokens: int | None = None) -> Iterator[str]:
    """The text after :func:`training_text`: the rest of the corpus, or with ``max_tokens`` the
    bytes up to ``max_tokens`` (the budget's bytes if each token held one)."""
    limit = train_text_bytes(corpus, val_fraction, max_tokens)
    left = None if max_tokens is None else max_tokens - limit
    for text, in_training in split_texts(corpus, limit):
        if in_training:
            continue
        if left is not None:
            data = text.encode("utf-8")[:left]
            text, left = data.decode("utf-8", errors="ignore"), left - len(data)
        yield text
        if left is not None and left <= 0:
            return
