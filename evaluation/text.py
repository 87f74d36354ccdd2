"""Bits per byte and perplexity of a model on any text, over fixed windows with a stated stride.

Bits per byte compare models whatever their tokenizer; perplexity (per token) only compares models
that share a tokenizer. The text is scored as training validates: documents joined by end-of-text
(where the tokenizer has one), every target summed by `BitsPerByte` (`metrics.py`, which says
what end-of-text counts in each).

Windows of `context_length` tokens start every `stride` tokens; each scores only the tokens the
window before it did not, so every token is scored once, with at least `context_length - stride`
tokens of context (all tokens before it, for those in the first window). A stride equal to the
context scores back-to-back windows, as validation does; a smaller one gives each token more
context, at `context_length / stride` times the cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minigpt.data import DataError, Tokenizer
from minigpt.data.corpus import resolve_corpus
from minigpt.model import GPT


@dataclass(frozen=True)
class TextScore:
    """What scoring a text found."""

    tokens: int
    """Targets scored (every token of the text, and the end-of-text tokens between documents)."""
    bytes: int
    """UTF-8 bytes of the text those targets spell."""
    bits_per_byte: float
    loss: float
    """Mean loss per token, in nats."""
    context_length: int
    stride: int

    @property
    def perplexity(self) -> float:
        """Per token: exp of the mean loss."""
        return math.exp(min(self.loss, 700.0))


def read_documents(
    source: str, subset: str | None = None, split: str = "train", text_column: str = "text", tail: float = 1.0
) -> list[str]:
    """The documents of a source `data.config.source` accepts (a file, a folder, a hub dataset,
    `shakespeare`), keeping the last `tail` of their characters: the same text for every tokenizer.

    Raises:
        DataError: The source cannot be read or holds no text.
    """
    documents = [text for text in resolve_corpus(source, text_column, split, subset).texts() if text]
    drop = round(sum(map(len, documents)) * (1.0 - tail))
    while documents and drop >= len(documents[0]):
        drop -= len(documents.pop(0))
    if documents:
        documents[0] = documents[0][drop:]
    if not any(documents):
        raise DataError(f"{source} holds no text to score")
    return documents


def prefix_id(tokenizer: Tokenizer) -> int | None:
    """The token a text's first token is predicted from: end-of-text, else a line break where the
    tokenizer has one token for it (the char tokenizers of line-based text), else None."""
    if tokenizer.eot_id is not None:
        return tokenizer.eot_id
    try:
        ids = tokenizer.encode("\n")
    except DataError:
        return None
    return ids[0] if len(ids) == 1 else None


def token_stream(tokenizer: Tokenizer, documents: list[str]) -> list[int]:
    """The prefix token, then the documents' tokens joined by end-of-text where there is one."""
    first = prefix_id(tokenizer)
    stream = [] if first is None else [first]
    for i, document in enumerate(documents):
        if i and tokenizer.eot_id is not None:
            stream.append(tokenizer.eot_id)
        stream += tokenizer.encode(document)
    return stream


def windows(num_tokens: int, context_length: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, scored) of each window over a stream of `num_tokens`: inputs `begin:end`,
    targets `begin + 1:end + 1`, of which the last `scored` are new."""
    out, scored_to, begin = [], 0, 0
    while scored_to < num_tokens - 1:
        end = min(begin + context_length, num_tokens - 1)
        out.append((begin, end, end - scored_to))
        scored_to, begin = end, begin + stride
    return out


@torch.inference_mode()
def score_text(
    model: GPT,
    tokenizer: Tokenizer,
    documents: list[str],
    context_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 16,
) -> TextScore:
    """Bits per byte and perplexity of `model` on `documents` (see the module's docstring).

    Args:
        context_length: Tokens per window; at most (and by default) the model's context.
        stride: Tokens between window starts, 1..context_length (default: context_length).
    """
    context_length = context_length or model.config.context_length
    stride = stride or context_length
    if not 1 <= context_length <= model.config.context_length:
        raise DataError(f"context_length must be 1..{model.config.context_length}, got {context_length}")
    if not 1 <= stride <= context_length:
        raise DataError(f"stride must be 1..context_length ({context_length}), got {stride}")
    stream = torch.tensor(token_stream(tokenizer, documents), dtype=torch.long)
    if len(stream) < 2:
        raise DataError("the text is a single token: nothing to predict")
    from .metrics import BitsPerByte  # here, not at the top: torchmetrics takes ~2 s to import

    # Every process that calls this scores the whole text: there is nothing to add up across them.
    score = BitsPerByte(tokenizer.byte_lengths(), sync_on_compute=False)
    device = next(model.parameters()).device
    spans = windows(len(stream), context_length, stride)
    for start in range(0, len(spans), batch_size):
        batch = spans[start : start + batch_size]
        width = max(end - begin for begin, end, _ in batch)
        x = torch.zeros(len(batch), width, dtype=torch.long)
        y = torch.zeros_like(x)
        scored = torch.zeros_like(x, dtype=torch.bool)
        for row, (begin, end, new) in enumerate(batch):
            x[row, : end - begin] = stream[begin:end]
            y[row, : end - begin] = stream[begin + 1 : end + 1]
            scored[row, end - begin - new : end - begin] = True
        logits = model(x.to(device)).float()
        losses = (
            F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten(), reduction="none").cpu().double()
        )
        score.update(losses[scored.flatten()], y[scored])
    total = {name: value.item() for name, value in score.compute().items()}
    return TextScore(
        int(total["targets"]), int(total["bytes"]), total["bpb"], total["loss"], context_length, stride
    )
