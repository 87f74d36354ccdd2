"""One training step of ours or the peer: what a contestant is (`TrainSpec`) and its step function."""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minigpt.model import GPT, MultiHeadAttention
from minigpt.training.config import OptimConfig
from minigpt.training.loss import fused_linear_cross_entropy, next_token_loss
from minigpt.training.optim import build_optimizer

from .peer import require_peer
from .shapes import shapes

OPTIM = OptimConfig(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95)
"""AdamW settings shared by every contestant (ours through build_optimizer, the peer directly)."""


@dataclass(frozen=True)
class TrainSpec:
    shape: str
    impl: str
    """"ours", "peer" (ch04.GPTModel) or "peer-fast" (ch04.GPTModelFast)."""
    bf16: bool
    loss: str = "full"
    """"full": cross-entropy of the whole logits tensor; "fused": fused_linear_cross_entropy."""
    chunk: int = 0
    adamw: str = "fused"
    """"fused": AdamW(fused=True); "default": AdamW's default on CPU (a per-tensor for-loop)."""
    compile: bool = False
    threads: int | None = None
    attention: str = "auto"
    """Ours only: the model's `attention` setting ("auto" is the explicit path on CPU)."""
    skip_elementwise: bool = False
    """Ours only, a measurement rather than a model: softmax, GELU and LayerNorm removed (see
    `remove_elementwise`), to show how fast the step could be if they cost nothing."""

    @property
    def dtype(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    @property
    def name(self) -> str:
        model = {"ours": "ours", "peer": "peer GPTModel", "peer-fast": "peer GPTModelFast"}[self.impl]
        parts = [f"{model} {'bf16 autocast' if self.bf16 else 'fp32'}"]
        if self.impl == "ours":
            parts.append(f"fused CE {self.chunk}" if self.loss == "fused" else "full-logits CE")
        parts.append("AdamW fused" if self.adamw == "fused" else "AdamW default")
        if self.attention != "auto":
            parts.append(f"{self.attention} attention")
        if self.skip_elementwise:
            parts.append("WITHOUT softmax, GELU, LayerNorm (not a model)")
        if self.compile:
            parts.append("torch.compile")
        if self.threads is not None:
            parts.append(f"{self.threads} thread{'s' if self.threads > 1 else ''}")
        return ", ".join(parts)


def _attention_without_softmax(
    self: Any, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int
) -> tuple[torch.Tensor, None]:
    b, h, t, hs = queries.shape
    scores = torch.bmm(queries.reshape(b * h, t, hs), keys.reshape(b * h, t, hs).transpose(1, 2))
    return scores.view(b, h, t, t) @ values, None


def remove_elementwise(model: GPT) -> None:
    """Turn `model` into a measuring device: every LayerNorm and GELU becomes the identity, and
    attention multiplies Q K^T straight into V (no scale, mask, softmax or fp32 casts). It keeps
    every matrix product, the embeddings, the loss and the optimizer, so its speed is what a
    step could reach if those elementwise operations cost nothing."""
    for name, module in list(model.named_modules()):
        if isinstance(module, (nn.LayerNorm, nn.GELU)):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, nn.Identity())
        elif isinstance(module, MultiHeadAttention):
            module._explicit_attention = types.MethodType(_attention_without_softmax, module)


def linear_weights(model: nn.Module) -> int:
    """Elements of all nn.Linear weights (a tied LM head counts once, as a matmul)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def build_train_step(spec: TrainSpec, batch_div: int) -> tuple[Callable[[], torch.Tensor], int, int]:
    """One optimizer step (forward, loss, backward, AdamW step, zero_grad) on a fixed random batch.

    Returns the step function, tokens per step and model FLOPs per step.
    """
    shape = shapes()[spec.shape]
    batch = shape.batch_size(batch_div)
    g = torch.Generator().manual_seed(1234)
    x = torch.randint(shape.vocab, (batch, shape.context), generator=g)
    y = torch.randint(shape.vocab, (batch, shape.context), generator=g)
    torch.manual_seed(0)
    fused_adamw = spec.adamw == "fused"
    if spec.impl == "ours":
        model: nn.Module = GPT(shape.gpt_config(attention=spec.attention))
        if spec.skip_elementwise:
            remove_elementwise(model)
        optimizer = build_optimizer(model, OptimConfig(**{**asdict(OPTIM), "fused": fused_adamw}))
    else:
        peer = require_peer()
        cls = peer.GPTModel if spec.impl == "peer" else peer.GPTModelFast
        model = cls(shape.peer_config())
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=OPTIM.lr,
            betas=(OPTIM.beta1, OPTIM.beta2),
            weight_decay=OPTIM.weight_decay,
            fused=True if fused_adamw else None,
        )
    model.train()
    if linear_weights(model) != shape.matmul_params():
        raise RuntimeError(f"{spec.name}: matmul weights {linear_weights(model)} != {shape.matmul_params()}")
    flops = shape.flops_per_token() * batch * shape.context

    if spec.impl == "ours":
        features = torch.compile(model.features) if spec.compile else model.features
        head = model.lm_head

        def loss_fn() -> torch.Tensor:
            hidden = features(x)
            if spec.loss == "fused":
                return fused_linear_cross_entropy(hidden, head.weight, y, spec.chunk)
            return next_token_loss(head(hidden), y)

    else:
        forward = torch.compile(model) if spec.compile else model

        def loss_fn() -> torch.Tensor:
            return F.cross_entropy(forward(x).flatten(0, 1), y.flatten())

    def step() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.bf16):
            loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step, batch * shape.context, flops
