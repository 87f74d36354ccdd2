"""Optimizer parameter groups and the learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import OptimConfig


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.AdamW:
    """AdamW that decays matrices and embeddings (dim >= 2) but not biases or LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    device = params[0].device
    fused = config.fused and device.type in ("cpu", "cuda")
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), fused=fused)


def lr_at(step: int, config: OptimConfig, total_steps: int) -> float:
    """Learning rate at optimizer step `step`: linear warmup, then cosine decay to min_lr."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / (config.warmup_steps + 1)
    if step >= total_steps:
        return config.min_lr
    progress = (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps)
    return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.lr - config.min_lr)


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over `lr_at`; the optimizer's lr must be `config.lr` (the multiplier's base)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_at(step, config, total_steps) / config.lr
    )
