"""Rotary position embedding (RoPE, Su et al. 2021), the recipes' alternative to a learned table."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """`x` (..., T, hs) at positions start, start + 1, ..., rotated."""
        cos, sin = self.tables(x, start)
        return x * cos + _swap_halves(x) * sin

    def normalise_and_rotate(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """QK-norm then the rotation: `forward(x / rms(x), start)`, the RMS over the last dimension
        with fp32's eps as `F.rms_norm`. In fp32 one autograd node does both (`_NormaliseRotate`),
        whose backward takes about half the passes over x that the two apart take; elsewhere, and
        when compiled, the two as they are."""
        if x.dtype == torch.float32 and not torch.compiler.is_compiling():
            return _NormaliseRotate.apply(x, *self.tables(x, start))
        return self(F.rms_norm(x, (x.size(-1),)), start)

    def tables(self, x: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cosine and signed sine tables (T, hs) for `x`'s positions from `start`, in its dtype."""
        t = x.shape[-2]
        return self.cos[start : start + t].to(x.dtype), self.sin[start : start + t].to(x.dtype)


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x2, x1], dim=-1)


class _NormaliseRotate(torch.autograd.Function):
    """y = R(x r), r = 1 / sqrt(mean(x^2) + eps) over the last dimension and R the rotation
    x * cos + swap_halves(x) * sin. R is orthogonal and commutes with the scalar r, so the gradient
    is r R^T (g - y mean(g y)): the RMS norm's gradient, rotated back by R^T u = u * cos -
    swap_halves(u) * sin."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        scale = norm.square_().div_(x.size(-1)).add_(torch.finfo(x.dtype).eps).rsqrt_()
        normalised = x * scale
        y = torch.addcmul(normalised * cos, _swap_halves(normalised), sin)
        ctx.save_for_backward(y, scale, cos, sin)
        return y

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        y, scale, cos, sin = ctx.saved_tensors
        along = (grad * y).mean(-1, keepdim=True)
        u = torch.addcmul(grad, y, along, value=-1)
        return torch.addcmul(u * cos, _swap_halves(u), sin, value=-1).mul_(scale), None, None
