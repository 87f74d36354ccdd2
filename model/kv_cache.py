"""The key/value cache that lets generation feed one new token at a time."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer.

    Buffers are allocated once at full context length, so generation never reallocates.
    """

    def __init__(
        self,
        batch_size: int,
        num_heads: int,
        max_length: int,
        head_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        shape = (batch_size, num_heads, max_length, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0
        """Number of positions filled."""

    @property
    def max_length(self) -> int:
        return self.keys.shape[2]

    def reset(self) -> None:
        self.length = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, nh, t, hs) new keys/values; return all keys/values so far, (B, nh, length, hs)."""
        start, end = self.length, self.length + keys.shape[2]
        if end > self.max_length:
            raise RuntimeError(f"KV cache overflow: {end} positions > capacity {self.max_length}")
        self.keys[:, :, start:end] = keys
        self.values[:, :, start:end] = values
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]
