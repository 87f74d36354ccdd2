"""Causal multi-head self-attention, as built up in "Build a Large Language Model (From Scratch)".

`MultiHeadAttention` keeps the teaching version's names and semantics (separate query/key/value
projections, a registered upper-triangular mask, dropout on the attention weights, an output
projection) and adds what a real model needs: a path through PyTorch's fused scaled-dot-product
attention (SDPA), and continuing a sequence held in a `KVCache`.

Which path runs is the `attention` setting. "auto" takes SDPA on GPUs and, without gradients
(validation, generation), on CPU too; a training step on CPU takes the textbook computation,
which is faster there (docs/results/cpu-speed.md, docs/results/validation.md).

Several sequences packed into one row (conversations for fine-tuning) attend each to itself
alone: given `same_segment`, the (B, 1, T, T) mask of which query and key share a sequence, the
textbook path adds it to its causal mask and SDPA takes the two as one boolean `attn_mask` (on
CPU its flash kernel accepts one, but computes the blocks above the diagonal that `is_causal`
skips); `positions` then rotates each token by its place in its own sequence. Without them
nothing changes: the plain causal paths run as they did.

QK-norm and the rotation by position run through the fast paths of `fast.py` (`rms_normalise`,
`normalise_and_rotate`), each beside its eager reference. The causal mask is one tensor per context
length and device, shared by every layer (`mask.py`). A batch whose attention scores cannot fit in
the machine's memory is refused with a `ConfigError` naming the setting, before anything is
allocated.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import ATTENTION_PATHS
from .device import check_fits
from .fast import normalise_and_rotate, rms_normalise
from .kv_cache import KVCache
from .mask import causal_mask, mask_kept_shared
from .rotary import RotaryEmbedding


class MultiHeadAttention(nn.Module):
    """Causal self-attention with `num_heads` heads of size `d_out // num_heads`.

    Input (B, T, d_in), output (B, T, d_out). Position t attends to positions <= t only.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        attention: str = "auto",
        *,
        qk_norm: bool = False,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        """The first six arguments are the reference text's. `qk_norm` normalises queries and
        keys per head (RMS, no gain); `rotary` rotates them by position (RoPE)."""
        super().__init__()
        if d_out % num_heads:
            raise ValueError(f"d_out ({d_out}) must be divisible by num_heads ({num_heads})")
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_PATHS)}, got {attention!r}")
        self.attention = attention
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        # Creation order matters: with a fixed seed it reproduces the reference numbers.
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out, bias=proj_bias)
        self.dropout = nn.Dropout(dropout)
        self.qk_norm = qk_norm
        self.rotary = rotary
        # True above the diagonal = "may not look here". Boolean and non-persistent: it costs no
        # checkpoint space, needs no cast per forward, and a checkpoint still loads when the
        # context length changes. Shared with every other layer of this context length.
        self.register_buffer("mask", causal_mask(context_length), persistent=False)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> nn.Module:
        # Moved or cast, every layer keeps sharing one mask rather than converting a copy.
        with mask_kept_shared(self, fn):
            return super()._apply(fn, recurse)

    def forward(
        self,
        x: torch.Tensor,
        *,
        kv_cache: KVCache | None = None,
        return_weights: bool = False,
        same_segment: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend over `x` (B, T, d_in), continuing the sequence held in `kv_cache` if given.

        With `return_weights=True` the explicit reference path runs and also returns the
        attention weights (B, nh, T, T_total) after dropout; otherwise the `attention` setting
        picks the path. `same_segment` (B, 1, T, T) bool (`mask.segment_mask`), True where query
        and key belong to the same packed sequence, confines each token to its own; `positions`
        (B, T), each token's place in it, is what the rotation (if any) reads. Neither goes with
        a `kv_cache`.
        """
        b, t, _ = x.shape
        queries_keys, values = self._project(x)
        past = kv_cache.length if kv_cache is not None else 0
        total = past + t
        if total > self.mask.shape[0]:
            raise ValueError(f"sequence of {total} tokens exceeds context length {self.mask.shape[0]}")
        # Both before caching: a cached key keeps its position's rotation.
        if self.qk_norm and self.rotary is not None:
            queries_keys = normalise_and_rotate(queries_keys, self.rotary, past, positions)
        elif self.qk_norm:
            queries_keys = rms_normalise(queries_keys)
        elif self.rotary is not None:
            queries_keys = self.rotary(queries_keys, past, positions)
        queries, keys = queries_keys.unbind(0)
        if kv_cache is not None:
            keys, values = kv_cache.append(keys, values)

        if return_weights or not self._use_sdpa(x):
            context, weights = self._explicit_attention(queries, keys, values, past, same_segment)
        else:
            context, weights = self._fused_attention(queries, keys, values, past, same_segment), None

        context = context.transpose(1, 2).contiguous().view(b, t, self.d_out)  # (B, T, d_out)
        out = self.out_proj(context)
        return (out, weights) if return_weights else out

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys of `x` as one (2, B, nh, T, hs) tensor, and the values (B, nh, T, hs).

        When gradients are on (training), the three weights are stacked into one (3 * d_out, d_in)
        matrix: one large matmul forward and one per gradient backward instead of three each, and
        no sum of three input gradients. The parameters stay the three layers above. Stacking
        copies the weights, which costs more than it saves when decoding one token at a time, so
        inference runs the three layers as they are. Queries and keys stay together so QK-norm
        and the rotation each run once over both: at small shapes the number of elementwise
        calls, not their arithmetic, is what they cost. A layer that an adapter wraps (LoRA)
        computes more than its weight, so then the three run as they are in training too.
        """
        b, t, _ = x.shape
        layers = (self.W_query, self.W_key, self.W_value)
        if torch.is_grad_enabled() and all(type(layer) is nn.Linear for layer in layers):
            weight = torch.cat([layer.weight for layer in layers])
            bias = None if self.W_query.bias is None else torch.cat([layer.bias for layer in layers])
            projected = F.linear(x, weight, bias).view(b, t, 3, self.num_heads, self.head_dim)
            qkv = projected.permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
            # split and squeeze rather than indexing: their gradients are one concatenation,
            # where each index's is a zero-filled (3, B, nh, T, hs) tensor and the two are summed.
            queries_keys, values = qkv.split([2, 1])
            return queries_keys, values.squeeze(0)
        queries, keys, values = (self._split_heads(layer(x)) for layer in layers)
        return torch.stack((queries, keys)), values

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)

    def _use_sdpa(self, x: torch.Tensor) -> bool:
        if self.attention != "auto":
            return self.attention == "sdpa"
        # On CPU SDPA's single call wins wherever no backward pass follows it, and for one token.
        return x.device.type != "cpu" or not torch.is_grad_enabled() or x.shape[1] == 1

    def _explicit_attention(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        past: int,
        same_segment: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The textbook computation, softmax(mask(Q K^T / sqrt(hs))) V; the reference for SDPA.

        The scaling and the mask ride inside one `baddbmm`, the mask as an additive bias (0 where
        allowed, -inf above the diagonal) made from the registered boolean mask. That saves a
        masked fill and a division over the (B, nh, T, T) scores, forward and backward. Packed
        sequences (`same_segment`) make the bias one per row, also -inf between sequences.
        """
        b, h, t, hs = queries.shape
        total = keys.shape[2]
        if not torch.compiler.is_compiling():
            check_fits(
                b * h * t * total * 4,  # the fp32 softmax alone; the scores and weights come on top
                queries.device,
                f"model context_length {self.mask.shape[0]} at batch size {b}: attention over "
                f"{t} x {total} positions in {h} heads",
            )
        if same_segment is None:
            bias = torch.zeros(t, total, dtype=queries.dtype, device=queries.device)
            bias.masked_fill_(self.mask[past:total, :total], float("-inf"))
        else:  # (B, 1, T, T), one per head as baddbmm takes it
            hidden = self.mask[:t, :t] | ~same_segment
            bias = torch.zeros(hidden.shape, dtype=queries.dtype, device=queries.device)
            bias = bias.masked_fill_(hidden, float("-inf")).expand(b, h, t, t).reshape(b * h, t, t)
        q, k = queries.reshape(b * h, t, hs), keys.reshape(b * h, total, hs)
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=hs**-0.5).view(b, h, t, total)
        # Softmax in fp32 even under bf16 autocast (CPU autocast would keep it in bf16), as SDPA
        # kernels do internally. bf16's forward is as exact, but its backward, from weights
        # rounded to bf16, cost small.yaml ~0.2 nats of val loss at every validation.
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
        weights = self.dropout(weights)
        return weights @ values, weights  # (B, nh, T, hs)

    def _fused_attention(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        past: int,
        same_segment: torch.Tensor | None = None,
    ) -> torch.Tensor:
        t, total = queries.shape[2], keys.shape[2]
        dropout_p = self.dropout.p if self.training else 0.0
        if same_segment is not None:  # packed sequences: causal within each, nothing across
            allowed = same_segment & ~self.mask[:t, :t]
            return F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=allowed, dropout_p=dropout_p
            )
        if past == 0:
            # Plain causal attention: let the kernel build the mask itself.
            return F.scaled_dot_product_attention(queries, keys, values, dropout_p=dropout_p, is_causal=True)
        if t == 1:
            # One new token sees every cached position: nothing to mask.
            return F.scaled_dot_product_attention(queries, keys, values, dropout_p=dropout_p)
        allowed = ~self.mask[past:total, :total]
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=allowed, dropout_p=dropout_p)
