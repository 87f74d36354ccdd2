"""Rotary position embedding (RoPE, Su et al. 2021), the recipes' alternative to a learned table."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Rotates each pair of a head's channels (i, i + hs/2) by an angle proportional to the
    position, so a query-key dot product depends on how far apart the two tokens are. One
    instance serves every layer; its tables are not saved."""

    def __init__(self, head_dim: int, context_length: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = base ** -(torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (hs/2,)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32), inv_freq)  # (T, hs/2)
        cos, sin = angles.cos(), angles.sin()
        # Full-width tables, the sine signed for the half it multiplies, so that the rotation is
        # x * cos + swap_halves(x) * sin: three elementwise calls and one copy, forward and
        # backward, instead of six and a concatenation. Each output is the same sum of the same
        # two products as (x1 cos - x2 sin, x1 sin + x2 cos): the same numbers, bit for bit.
        self.register_buffer("cos", torch.cat([cos, cos], dim=-1), persistent=False)  # (T, hs)
        self.register_buffer("sin", torch.cat([-sin, sin], dim=-1), persistent=False)  # (T, hs)

    def forward(self, x: torch.Tensor, start: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        """`x` (..., T, hs) at positions start, start + 1, ..., rotated; or, given `positions`
        (B, T) for an `x` of (..., B, nh, T, hs), each token at its own."""
        cos, sin = self.tables(x, start, positions=positions)
        return x * cos + swap_halves(x) * sin

    def tables(
        self,
        x: torch.Tensor,
        start: int,
        dtype: torch.dtype | None = None,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The cosine and signed sine tables (T, hs) for `x`'s positions from `start`, in `dtype`
        (default: x's); given `positions` (B, T), those of each token, (B, 1, T, hs), which
        broadcast over the heads."""
        dtype = dtype or x.dtype
        if positions is not None:
            return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)
        t = x.shape[-2]
        return self.cos[start : start + t].to(dtype), self.sin[start : start + t].to(dtype)


def swap_halves(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (x2, x1), the halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x2, x1], dim=-1)
