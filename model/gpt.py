"""A decoder-only GPT: token + position embeddings, pre-LayerNorm blocks, a tied LM head.

- GPT-2's shapes and names: its weights map on one for one (`c_attn` split into W_query, ...).
- The recipe's levers (docs/results/recipe.md): learned or rotary positions, the norm, the MLP's
  activation, QK-norm, the tied head, zero-initialised projections.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention import MultiHeadAttention
from .config import GPTConfig, parameter_count
from .device import check_fits
from .fast import squared_relu
from .kv_cache import KVCache
from .mask import segment_mask
from .rotary import RotaryEmbedding


def norm(config: GPTConfig) -> nn.Module:
    """The normalisation `config.norm` names, over the residual width."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=config.layer_norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)


class SquaredReLU(nn.Module):
    """relu(x)^2 (So et al. 2021, "Primer"), the speedrun community's MLP nonlinearity."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return squared_relu(x)


class MLP(nn.Module):
    """Position-wise feed-forward: n_embd -> 4 n_embd -> GELU (or squared ReLU) -> n_embd."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        if config.activation == "relu2":
            self.gelu = SquaredReLU()  # the attribute keeps GPT-2's name whatever it computes
        else:
            self.gelu = nn.GELU(approximate=config.gelu_approximate)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    """x + attn(ln(x)), then x + mlp(ln(x)); dropout on each residual branch."""

    def __init__(self, config: GPTConfig, rotary: RotaryEmbedding | None = None) -> None:
        super().__init__()
        self.ln_1 = norm(config)
        self.attn = MultiHeadAttention(
            d_in=config.n_embd,
            d_out=config.n_embd,
            context_length=config.context_length,
            dropout=config.dropout,
            num_heads=config.n_head,
            qkv_bias=config.qkv_bias,
            proj_bias=config.bias,
            attention=config.attention,
            qk_norm=config.qk_norm,
            rotary=rotary,
        )
        self.ln_2 = norm(config)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        kv_cache: KVCache | None = None,
        same_segment: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        attended = self.attn(self.ln_1(x), kv_cache=kv_cache, same_segment=same_segment, positions=positions)
        return self._after_attention(x, attended)

    def forward_with_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` through the explicit attention path: the output (B, T, C) and the attention
        weights (B, nh, T, T). A separate method, so the training path stays free of branches."""
        attended, weights = self.attn(self.ln_1(x), return_weights=True)
        return self._after_attention(x, attended), weights

    def _after_attention(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(attended)
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    """Token ids (B, T) in, next-token logits (B, T, vocab_size) out.

    `config.vocab_size` must be set (the training module fills it from the tokenizer).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("GPTConfig.vocab_size must be set before building the model")
        n = parameter_count(config)
        check_fits(
            n * torch.get_default_dtype().itemsize,
            torch.get_default_device(),
            f"model n_layer {config.n_layer}, n_embd {config.n_embd}, vocab_size {config.vocab_size}, "
            f"context_length {config.context_length}: a network of {n / 1e6:,.0f}M parameters",
        )
        self.config = config
        rotary = None
        layers = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.position_embedding == "learned":
            layers["wpe"] = nn.Embedding(config.context_length, config.n_embd)
        else:  # one table of rotations for every layer
            rotary = RotaryEmbedding(config.head_size, config.context_length, config.rope_base)
        layers |= dict(
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config, rotary) for _ in range(config.n_layer)),
            ln_f=norm(config),
        )
        self.transformer = nn.ModuleDict(layers)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        # Each block adds two projections into the residual stream; scaling them keeps its
        # variance from growing with depth (GPT-2 paper, section 2.3).
        # With zero_init_proj they start at zero instead: every block begins as the identity.
        residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        for block in self.transformer.h:
            for proj in (block.attn.out_proj, block.mlp.c_proj):
                if config.zero_init_proj:
                    nn.init.zeros_(proj.weight)
                else:
                    nn.init.normal_(proj.weight, mean=0.0, std=residual_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without position embeddings (tied token embeddings count once)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(
        self, idx: torch.Tensor, kv_caches: list[KVCache] | None = None, **packed: torch.Tensor | None
    ) -> torch.Tensor:
        """The logits (B, T, V): `features` (whose arguments these are), then the LM head."""
        return self.lm_head(self.features(idx, kv_caches, **packed))

    def features(
        self,
        idx: torch.Tensor,
        kv_caches: list[KVCache] | None = None,
        *,
        segments: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states (B, T, n_embd), before the LM head.

        With `kv_caches` (one per block), `idx` continues the cached sequence: its positions
        start after the cached ones. With `segments` and `positions` (B, T) int64, a row holds
        several sequences packed back to back: `segments` numbers them (the tokens of one share
        a value) and `positions` gives each token's place in its own, from 0. Each token then
        attends only to its own sequence's earlier tokens and is placed by its own position, so
        every sequence gets the hidden states it would get alone.
        """
        if (segments is None) != (positions is None):
            raise ValueError("segments and positions go together: give both or neither")
        mask = None
        if segments is not None:
            if kv_caches:
                raise ValueError("packed sequences (segments) cannot continue a KV cache")
            if segments.shape != idx.shape or positions.shape != idx.shape:
                raise ValueError(
                    f"segments {tuple(segments.shape)} and positions {tuple(positions.shape)} must be "
                    f"shaped as the ids {tuple(idx.shape)}"
                )
            mask = segment_mask(segments)  # (B, 1, T, T), once for every layer
        x = self._embed(idx, kv_caches[0].length if kv_caches else 0, positions)  # (B, T, C)
        caches = kv_caches or [None] * len(self.transformer.h)
        for block, cache in zip(self.transformer.h, caches, strict=True):
            x = block(x, cache, mask, positions)
        return self.transformer.ln_f(x)

    def _embed(self, idx: torch.Tensor, start: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Token + position embeddings (B, T, C) of ids (B, T) at positions start, start + 1, ...,
        or at `positions` (B, T) where given."""
        t = idx.shape[1]
        if start + t > self.config.context_length:
            raise ValueError(
                f"sequence of {start + t} tokens exceeds context length {self.config.context_length}"
            )
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:  # with rotary embeddings, attention applies the positions
            if positions is None:
                positions = torch.arange(start, start + t, device=idx.device)
            x = x + self.transformer.wpe(positions)
        return self.transformer.drop(x)

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """The attention weights of every layer for ids `idx` (B, T), as the model computes them.

        Returns one (B, n_head, T, T) tensor per layer, in layer order, from the explicit path
        whatever the `attention` setting: entry [b, h, i, j] is how much position i attends to
        position j, in the activations' dtype; each row sums to 1 and everything above the
        diagonal is 0. The model runs in eval mode (no dropout on the weights) and without
        gradients; its mode is restored after, so a callback may call this in mid-training.
        """
        was_training = self.training
        self.eval()
        try:
            x, weights = self._embed(idx, 0), []
            for block in self.transformer.h:
                x, layer_weights = block.forward_with_weights(x)
                weights.append(layer_weights)
            return weights
        finally:
            self.train(was_training)

    def new_kv_caches(self, batch_size: int) -> list[KVCache]:
        """Empty caches, one per block, on the model's device and dtype."""
        param = self.lm_head.weight
        c = self.config
        return [
            KVCache(
                batch_size, c.n_head, c.context_length, c.head_size, device=param.device, dtype=param.dtype
            )
            for _ in range(c.n_layer)
        ]
