"""Room in a trained GPT for token ids its tokenizer gained, such as the chat markers."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from .gpt import GPT


@torch.no_grad()
def add_token_rows(model: GPT, n_vocab: int, trained: int | None = None) -> None:
    """Give ``model`` rows for ids ``trained .. n_vocab - 1``, each the mean of the rows of ids
    ``0 .. trained - 1``, in the token embedding and (when not tied to it) the LM head.

    The mean keeps a new id's embedding among the ones the blocks have learned to read, and its
    logit at the average of the others', so the model starts out predicting as it did (Hewitt,
    "Initializing New Word Embeddings for Pretrained Language Models", 2021). The table grows
    when ``n_vocab`` is more than ``model.config.vocab_size``; a table already padded past it
    (GPT-2's 50304) keeps its size, its rows from ``trained`` on overwritten. Call it before the
    optimizer is built: a grown table is a new parameter.

    Args:
        model: A GPT whose first ``trained`` ids are the ones it was trained on.
        n_vocab: Ids the model must read and write (the new tokenizer's ``n_vocab``).
        trained: Ids with trained rows (default: all the model has, ``config.vocab_size``).
    """
    rows = model.config.vocab_size
    trained = rows if trained is None else trained
    if not 0 < trained <= min(rows, n_vocab):
        raise ValueError(f"trained ids {trained} must be in 1..{min(rows, n_vocab)}")
    size = max(rows, n_vocab)
    wte = model.transformer.wte
    model.transformer.wte = _grown_embedding(wte, size, trained, n_vocab)
    if model.config.tie_weights:
        model.lm_head.weight = model.transformer.wte.weight
    else:
        model.lm_head = _grown_head(model.lm_head, size, trained, n_vocab)
    model.config = replace(model.config, vocab_size=size)


def _mean_filled(weight: torch.Tensor, size: int, trained: int, n_vocab: int) -> nn.Parameter:
    """``weight`` (V, C) at ``size`` rows, rows ``trained:n_vocab`` the mean of the first ``trained``."""
    grown = weight.new_empty(size, weight.shape[1])
    grown[: len(weight)] = weight
    grown[trained:n_vocab] = weight[:trained].float().mean(dim=0).to(weight.dtype)
    return nn.Parameter(grown, requires_grad=weight.requires_grad)


def _grown_embedding(wte: nn.Embedding, size: int, trained: int, n_vocab: int) -> nn.Embedding:
    grown = nn.Embedding(size, wte.embedding_dim, device=wte.weight.device, dtype=wte.weight.dtype)
    grown.weight = _mean_filled(wte.weight, size, trained, n_vocab)
    return grown


def _grown_head(head: nn.Linear, size: int, trained: int, n_vocab: int) -> nn.Linear:
    grown = nn.Linear(head.in_features, size, bias=False, device=head.weight.device, dtype=head.weight.dtype)
    grown.weight = _mean_filled(head.weight, size, trained, n_vocab)
    return grown
