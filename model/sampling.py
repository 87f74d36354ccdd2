"""Choosing the next token from logits: pure functions, no model involved."""

from __future__ import annotations

import torch

from .config import ConfigError


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """The one rule for sampling settings, shared by every config and command line that takes them.

    Raises:
        ConfigError: A value outside its range, named in one line.
    """
    if not temperature >= 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits per row (B, V); the rest become -inf. Ties at the k-th value survive."""
    if k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches p (nucleus sampling)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Mass strictly before each token; a token is kept while that mass is below p, so the most
    # likely token always survives.
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_next(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids (B, 1) from last-position logits (B, V). Temperature 0 means greedy."""
    check_sampling(temperature, top_k, top_p)
    logits = logits.float()
    if temperature == 0:
        return torch.argmax(logits, dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)
