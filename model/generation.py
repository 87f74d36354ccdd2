"""Autoregressive generation with an optional key/value cache."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .gpt import GPT
from .sampling import sample_next


@torch.inference_mode()
def generate_tokens(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_token: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> Iterator[torch.Tensor]:
    """Yield new token ids (B, 1) one step at a time, continuing the prompt `idx` (B, T).

    The model sees at most its context length: older tokens fall off the left, as in training.
    With the cache, each step feeds only the newest token; once the window starts sliding,
    every position's embedding changes, so the cache is rebuilt from the window each step.
    Cached and uncached generation therefore compute the same logits. Stops early once every
    row has produced `stop_token`.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if idx.shape[1] == 0:
        raise ValueError("the prompt must contain at least one token")
    context = model.config.context_length
    caches = model.new_kv_caches(idx.shape[0]) if use_cache else None
    finished = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
    for _ in range(max_new_tokens):
        window = idx[:, -context:]
        if caches is None:
            logits = model(window)
        elif caches[0].length == window.shape[1] - 1:
            logits = model(window[:, -1:], caches)
        else:
            for cache in caches:
                cache.reset()
            logits = model(window, caches)
        next_id = sample_next(
            logits[:, -1, :], temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
        )
        yield next_id
        idx = torch.cat([idx, next_id], dim=1)
        if stop_token is not None:
            finished |= next_id.squeeze(1) == stop_token
            if bool(finished.all()):
                return


def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
    """The prompt followed by up to `max_new_tokens` generated ids, (B, T + n)."""
    new = list(generate_tokens(model, idx, max_new_tokens, **kwargs))
    return torch.cat([idx, *new], dim=1) if new else idx
