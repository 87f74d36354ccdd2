"""Optimizer parameter groups and the learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from minigpt.model import MultiHeadAttention

from .config import OptimConfig
from .lora import is_adapter, new_token_rows
from .muon import NS_COEFFICIENTS, Muon


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.Optimizer:
    """AdamW that decays matrices and embeddings but not biases or normalisation gains; with
    `optimizer: muon`, the blocks' weight matrices go to Muon instead (`MuonWithAdamW`), the query
    and key projections cut into heads with `muon_qk_per_head`, the value projections with
    `muon_v_per_head`. Only the parameters that train are given to it (LoRA freezes the rest).
    The rows LoRA trains of tokens new to the weights are their table's: decayed, and in the
    embeddings' group where it has one.

    LoRA's adapters go to AdamW with either optimizer: Muon orthogonalises the update of a
    layer's weight, and an adapter's update is the product of two factors' (B A), which
    orthogonalising each factor's alone does not orthogonalise; its per-shape learning rate is
    also the layer's, not a rank-8 factor's.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # tied weights appear once
    matrices = [
        p
        for n, p in named
        if config.optimizer == "muon" and _in_blocks(n) and p.dim() == 2 and not is_adapter(n)
    ]
    chosen = {id(p) for p in matrices}
    rest = [p for _, p in named if id(p) not in chosen]
    rows = new_token_rows(model)
    decayed = _decayed(model) | rows.keys()
    tables = set()  # with its own learning rate, the embedding tables are a third group
    if config.embedding_lr is not None:
        tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        tables |= {i for i, table in rows.items() if isinstance(table, nn.Embedding)}
    matrix_decayed = decayed - tables
    # Each group's name is its learning rate's name on the dashboards and in the CSV log
    # (LearningRateMonitor: lr-AdamW/decay, lr-MuonWithAdamW/muon, ...) rather than pg1, pg2.
    groups = [
        {
            "params": [p for p in rest if id(p) in matrix_decayed],
            "weight_decay": config.weight_decay,
            "name": "decay",
        },
        {"params": [p for p in rest if id(p) not in decayed], "weight_decay": 0.0, "name": "no_decay"},
    ]
    if tables:
        embeddings = [p for p in rest if id(p) in tables]
        groups.append(
            {
                "params": embeddings,
                "weight_decay": config.weight_decay,
                "lr": config.embedding_lr,
                "name": "embeddings",
            }
        )
    device = named[0][1].device
    fused = config.fused and device.type in ("cpu", "cuda")
    adamw = torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), fused=fused)
    if not matrices:
        return adamw
    muon = Muon(
        [{"params": matrices, "name": "muon"}],
        lr=config.muon_lr,
        weight_decay=config.weight_decay,
        momentum=config.muon_momentum,
        ns_steps=config.muon_ns_steps,
        ns_coefficients=NS_COEFFICIENTS[config.muon_ns_coefficients],
        adjust_lr_fn="original",
        ns_norm=config.muon_ns_norm,
        row_blocks=(rows := _head_rows(model, chosen, config.muon_qk_per_head, config.muon_v_per_head)),
    )
    return MuonWithAdamW(muon, adamw, per_head=_cut(model, rows))


def _head_rows(
    model: nn.Module, chosen: set[int], queries_keys: bool, values: bool
) -> dict[torch.Tensor, int]:
    """The query and key projections' weights among `chosen` (ids) with `queries_keys`, and the
    value projections' with `values`, each with its heads' rows."""
    return {
        layer.weight: attention.head_dim
        for attention in model.modules()
        if isinstance(attention, MultiHeadAttention)
        for layer, cut in (
            (attention.W_query, queries_keys),
            (attention.W_key, queries_keys),
            (attention.W_value, values),
        )
        if cut and id(layer.weight) in chosen
    }


def _cut(model: nn.Module, rows: dict[torch.Tensor, int]) -> list[str]:
    """Which of the attention's projections `rows` cuts into heads, by what they make."""
    attention = next((m for m in model.modules() if isinstance(m, MultiHeadAttention)), None)
    if attention is None:
        return []
    layers = (("queries", attention.W_query), ("keys", attention.W_key), ("values", attention.W_value))
    blocked = {id(p) for p in rows}
    return [name for name, layer in layers if id(layer.weight) in blocked]


def _decayed(model: nn.Module) -> set[int]:
    """The weights of linear layers and embeddings: the matrices. Chosen by the module that owns
    them rather than by `p.dim()`, which FSDP's flat 1-D shards would hide."""
    return {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, nn.Linear | nn.Embedding) and m.weight is not None
    }


def _in_blocks(name: str) -> bool:
    return name.startswith("transformer.h.")


class MuonWithAdamW(torch.optim.Optimizer):
    """Two optimizers stepped as one, so Lightning's automatic optimisation, gradient
    accumulation, the learning-rate scheduler and checkpoints treat them as a single optimizer.

    `param_groups` are the two optimizers' own group dicts (Muon's first), so a scheduler that
    scales each group's lr reaches both; the state dict holds both optimizers' state dicts.
    """

    def __init__(
        self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer, per_head: Sequence[str] = ()
    ) -> None:
        self.muon, self.adamw = muon, adamw
        self.per_head = list(per_head)
        """The attention projections Muon orthogonalises a head at a time ("queries", ...)."""
        super().__init__(muon.param_groups + adamw.param_groups, defaults={})

    def describe(self, device: torch.device) -> str:
        """How Muon orthogonalises, for the run's summary."""
        cut = self.per_head
        heads = ", " + (", ".join(cut[:-1]) + " and " + cut[-1] if len(cut) > 1 else cut[0]) if cut else ""
        return self.muon.describe(device, heads + " per head" if cut else "")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = self.muon.step(closure)  # the closure, if any, runs once, in Muon's step
        self.adamw.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        # Loading replaces each optimizer's group dicts with new ones: share them again, or the
        # scheduler would go on scaling the old dicts and a resumed run keep its saved rates.
        self.param_groups = self.muon.param_groups + self.adamw.param_groups


def lr_at(step: int, config: OptimConfig, total_steps: int) -> float:
    """Learning rate at optimizer step `step`: linear warmup, then cosine decay to min_lr, or
    (schedule "wsd") constant until the last `decay_fraction` of the steps, then linear to min_lr."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / (config.warmup_steps + 1)
    if step >= total_steps:
        return config.min_lr
    if config.schedule == "wsd":
        decay_start = total_steps - max(1, round(config.decay_fraction * total_steps))
        decay_start = max(decay_start, config.warmup_steps)
        if step < decay_start:
            return config.lr
        progress = (step - decay_start) / max(1, total_steps - decay_start)
        return config.lr + progress * (config.min_lr - config.lr)
    progress = (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps)
    return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.lr - config.min_lr)


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over `lr_at`; the optimizer's lr must be `config.lr` (the multiplier's base)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_at(step, config, total_steps) / config.lr
    )
