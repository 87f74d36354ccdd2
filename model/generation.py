"""Autoregressive generation with an optional key/value cache.

At batch 1 on a CPU, decoding is bound by memory bandwidth: every new token reads every weight
once, and the LM head (vocab x n_embd) is most of them. Two things keep that read at full speed:

- `LastTokenHead` splits the head's weights into one slab per thread and multiplies them as a
  batched matmul. A single matrix-vector product runs on one core; the batched one runs on all.
- `optimize_for_decoding` re-lays out the blocks' weights input-major, the order a one-row matmul
  streams fastest. Values stay the same; call it on models you only sample from.

`benchmarks/bench.py` measures both.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .gpt import GPT
from .sampling import sample_next


class LastTokenHead:
    """The LM head applied to one position per row, (B, n_embd) -> (B, vocab).

    On CPU it holds a copy of the head's weights as `slabs` x (n_embd, vocab / slabs), each slab
    contiguous, and computes the logits as one batched matmul, which spreads the slabs over the
    threads. Elsewhere it calls the model's own head.
    """

    def __init__(self, model: GPT, slabs: int | None = None) -> None:
        weight = model.lm_head.weight
        self._head = model.lm_head
        self._slabs = None
        # What the copy was made from: a training step changes the version, a reload the storage.
        self._source = (weight.data_ptr(), weight._version)
        weight = weight.detach()
        if weight.device.type != "cpu":
            return
        vocab, width = weight.shape
        slabs = slabs or torch.get_num_threads()
        per_slab = math.ceil(vocab / slabs)
        self._slabs = weight.new_zeros(slabs, width, per_slab)  # (S, C, V/S); the tail is padding
        for i, rows in enumerate(weight.split(per_slab)):
            self._slabs[i, :, : rows.shape[0]] = rows.t()
        self._vocab = vocab

    def matches(self, model: GPT) -> bool:
        """Whether this copy still reflects `model`'s head weights."""
        weight = model.lm_head.weight
        return self._head is model.lm_head and self._source == (weight.data_ptr(), weight._version)

    @classmethod
    def of(cls, model: GPT) -> LastTokenHead:
        """The head `optimize_for_decoding` prepared, while it is current; otherwise a new one."""
        head = getattr(model, "_last_token_head", None)
        return head if head is not None and head.matches(model) else cls(model)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._slabs is None:
            return self._head(hidden)
        b, width = hidden.shape
        slabs = self._slabs.shape[0]
        logits = torch.matmul(hidden.unsqueeze(0).expand(slabs, b, width), self._slabs)  # (S, B, V/S)
        return logits.transpose(0, 1).reshape(b, -1)[:, : self._vocab]


@torch.no_grad()
def optimize_for_decoding(model: GPT) -> GPT:
    """Prepare `model` for generation: returns it, changed in place.

    Stores each block's linear weights input-major (strides only; shapes and values unchanged):
    a one-row matmul against an (out, in) row-major weight runs at about half the memory
    bandwidth it gets from the same weight stored (in, out). Also builds the `LastTokenHead`
    once, so that each generation call does not copy the head again; it is rebuilt if the
    weights change.
    """
    for block in model.transformer.h:
        for module in block.modules():
            if isinstance(module, nn.Linear):
                module.weight.data = module.weight.data.t().contiguous().t()
    model._last_token_head = LastTokenHead(model)
    return model


@torch.inference_mode()
def generate_steps(
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
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield new token ids (B, 1) one step at a time, continuing the prompt `idx` (B, T), each with
    the logits (B, V) they were drawn from, as the model gave them (before temperature and
    filtering): what a server reports as log-probabilities and alternatives.

    The model sees at most its context length: older tokens fall off the left, as in training.
    With the cache, each step feeds only the newest token; once the window starts sliding,
    every position's embedding changes, so the cache is rebuilt from the window each step.
    Cached and uncached generation therefore compute the same logits. Only the last position
    goes through the LM head (`LastTokenHead`). Stops early once every row has produced
    `stop_token`.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if idx.shape[1] == 0:
        raise ValueError("the prompt must contain at least one token")
    context = model.config.context_length
    caches = model.new_kv_caches(idx.shape[0]) if use_cache else None
    head = LastTokenHead.of(model)
    finished = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
    for _ in range(max_new_tokens):
        window = idx[:, -context:]
        if caches is None:
            hidden = model.features(window)
        elif caches[0].length == window.shape[1] - 1:
            hidden = model.features(window[:, -1:], caches)
        else:
            for cache in caches:
                cache.reset()
            hidden = model.features(window, caches)
        logits = head(hidden[:, -1])
        next_id = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        yield next_id, logits
        idx = torch.cat([idx, next_id], dim=1)
        if stop_token is not None:
            finished |= next_id.squeeze(1) == stop_token
            if bool(finished.all()):
                return


def generate_tokens(
    model: GPT, idx: torch.Tensor, max_new_tokens: int, **sampling: Any
) -> Iterator[torch.Tensor]:
    """`generate_steps` with the same arguments, yielding the new ids (B, 1) alone."""
    for next_id, _ in generate_steps(model, idx, max_new_tokens, **sampling):
        yield next_id


def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
    """The prompt followed by up to `max_new_tokens` generated ids, (B, T + n)."""
    new = list(generate_tokens(model, idx, max_new_tokens, **kwargs))
    return torch.cat([idx, *new], dim=1) if new else idx
