"""Typed configuration of what happens around the model: optimisation, LoRA and samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minigpt.model import ConfigError, check_sampling

from .muon import NS_COEFFICIENTS, NS_NORMS

OPTIMIZERS = ("adamw", "muon")
LORA_TARGETS = ("W_query", "W_key", "W_value", "out_proj", "c_fc", "c_proj")
"""The layers LoRA may adapt, by their names in every block (`minigpt.model`): the attention's
query, key, value and output projections, and the MLP's two layers."""
SCHEDULES = ("cosine", "wsd")


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer (AdamW, or Muon for the blocks' matrices with AdamW for the rest) and the
    learning-rate schedule over `trainer.max_steps`: linear warmup, then cosine decay or
    warmup-stable-decay to `min_lr`."""

    lr: float = 1e-3
    """Peak learning rate, reached after `warmup_steps`."""
    min_lr: float = 1e-4
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = 100
    """Optimizer steps of linear warmup from 0 to `lr`."""
    weight_decay: float = 0.1
    """Decoupled weight decay, applied to weight matrices and embeddings only (not biases or norms)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2 (0.95 as in GPT-3/nanoGPT; steadier than 0.999 for language models)."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this value before each step (None: no clipping)."""
    fused: bool = True
    """Use PyTorch's fused AdamW kernel where the device supports it (much faster on CPU and CUDA)."""
    optimizer: str = "adamw"
    """"adamw" for every parameter, or "muon": `torch.optim.Muon` (momentum orthogonalised by
    Newton-Schulz) for the blocks' weight matrices, AdamW (`lr`) for embeddings, head, gains and biases.
    LoRA's adapters train with AdamW either way (`model.lora`)."""
    embedding_lr: float | None = None
    """AdamW's peak learning rate for the embedding tables (tokens, and positions where learned),
    scheduled like `lr`; None: `lr`. With tied weights the token table is also the head."""
    muon_lr: float = 0.02
    """Muon's peak learning rate (scaled per matrix shape as in Keller Jordan's implementation);
    follows the same schedule as `lr`."""
    muon_momentum: float = 0.95
    """Muon's Nesterov momentum."""
    muon_ns_steps: int = 5
    """Muon's Newton-Schulz iterations per step (each costs about three matrix products per
    weight matrix; fewer orthogonalise less exactly)."""
    muon_ns_coefficients: str = "jordan"
    """The Newton-Schulz polynomials: "jordan", Keller Jordan's (a, b, c) at every step, as
    torch's Muon; "polar_express", one polynomial per step, each the best for the range the last
    one left (Amsel et al., 2025), which orthogonalises more in the same steps."""
    muon_qk_per_head: bool = False
    """Muon orthogonalises each head's rows of the query and key projections on their own, as
    matrices of their own, rather than each projection whole. With QK-norm (`qk_norm`) a head's
    queries and keys do not depend on the scale of its rows, so each head is a layer of its own;
    one (head_dim x n_embd) matrix per head also costs far fewer products than one (n_embd x
    n_embd) matrix (docs/results/muon.md)."""
    muon_v_per_head: bool = False
    """Muon orthogonalises each head's rows of the value projection on their own, as
    `muon_qk_per_head` does the queries' and keys': a head's values feed only that head's mix.
    Its (head_dim x n_embd) blocks cost a fraction of the whole matrix's products
    (docs/results/muon.md)."""
    muon_ns_norm: str = "frobenius"
    """How Muon scales each matrix before its first Newton-Schulz step: "frobenius" by its
    Frobenius norm, as torch's Muon; "gram" by the square root of its Gram matrix's Frobenius
    norm, a tighter bound on the largest singular value at no extra cost, so the same steps
    orthogonalise more (training/muon.py's `newton_schulz`)."""
    schedule: str = "cosine"
    """"cosine": after warmup, cosine decay to `min_lr`; "wsd" (warmup-stable-decay): `lr` held
    until the last `decay_fraction` of the steps, then a linear decay to `min_lr`."""
    decay_fraction: float = 0.2
    """wsd only: the share of the steps spent decaying (1.0 with min_lr 0: linear decay to zero)."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optim lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"optim min_lr must be in [0, lr={self.lr}], got {self.min_lr}")
        if self.warmup_steps < 0:
            raise ConfigError(f"optim warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.weight_decay < 0:
            raise ConfigError(f"optim weight_decay must be >= 0, got {self.weight_decay}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ConfigError(f"optim grad_clip must be positive or null, got {self.grad_clip}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"optim optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"optim schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"optim decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if self.embedding_lr is not None and self.embedding_lr <= 0:
            raise ConfigError(f"optim embedding_lr must be positive or null, got {self.embedding_lr}")
        if self.muon_lr <= 0:
            raise ConfigError(f"optim muon_lr must be positive, got {self.muon_lr}")
        if not 1 <= self.muon_ns_steps < 100:
            raise ConfigError(f"optim muon_ns_steps must be in [1, 100), got {self.muon_ns_steps}")
        if self.muon_ns_coefficients not in NS_COEFFICIENTS:
            raise ConfigError(
                f"optim muon_ns_coefficients must be one of {', '.join(NS_COEFFICIENTS)},"
                f" got {self.muon_ns_coefficients!r}"
            )
        if self.muon_ns_norm not in NS_NORMS:
            raise ConfigError(
                f"optim muon_ns_norm must be one of {', '.join(NS_NORMS)}, got {self.muon_ns_norm!r}"
            )
        if not 0 <= self.muon_momentum < 1:
            raise ConfigError(f"optim muon_momentum must be in [0, 1), got {self.muon_momentum}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"optim {name} must be in [0, 1), got {getattr(self, name)}")


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021), added through `peft`: each target layer's weight W
    stays frozen and learns W + (alpha / rank) B A instead, with A (rank x in) random and B
    (out x rank) zero at the start, so the fine-tune starts from the weights' own function. A and
    B train, and the rows of the tokens new to the weights (the chat markers), in the embedding
    and an untied head; everything else is frozen. The finished run's weights are the merged
    W + (alpha / rank) B A with those rows: a plain model to generate with and export."""

    rank: int = 8
    """Rank of each adapter, the inner size of B A (litgpt's default, 8)."""
    alpha: float = 16.0
    """Scale of the adapters' update: B A is multiplied by alpha / rank, so a run may change the
    rank without retuning its learning rate."""
    dropout: float = 0.05
    """Dropout on the adapters' input (the frozen layer's path has none of its own)."""
    targets: tuple[str, ...] = ("W_query", "W_value")
    """The layers to adapt, by name, in every block: W_query, W_key, W_value (the attention's
    query, key and value projections), out_proj (its output projection), c_fc and c_proj (the
    MLP's). The default is litgpt's, query and value. Our query, key and value projections are
    three layers, as GPT-2's fused c_attn splits into, so each may be chosen alone; a training
    step stacks the three into one product only while none of them has an adapter."""

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ConfigError(f"model lora rank must be at least 1, got {self.rank}")
        if not self.alpha > 0:
            raise ConfigError(f"model lora alpha must be positive, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model lora dropout must be in [0, 1), got {self.dropout}")
        if not self.targets:
            raise ConfigError(f"model lora targets must name at least one of {', '.join(LORA_TARGETS)}")
        for target in self.targets:
            if target not in LORA_TARGETS:
                raise ConfigError(
                    f"model lora targets: no layer {target!r} in a block; "
                    f"the layers are {', '.join(LORA_TARGETS)}"
                )


@dataclass(frozen=True)
class SampleConfig:
    """What to generate and how to choose tokens: used by `generate.py` and by the sample printed at
    every validation."""

    prompt: str = "\n"
    """Text to continue."""
    max_new_tokens: int = 100
    """Tokens to generate (per sample); 0 generates nothing."""
    temperature: float = 0.8
    """Softmax temperature; 0 is greedy."""
    top_k: int | None = 200
    """Sample only among the k most likely tokens (None: all)."""
    top_p: float | None = None
    """Nucleus sampling: only among the most likely tokens that together hold this much
    probability, in (0, 1] (None: all)."""
    seed: int = 1337
    """Seed of the sampler, so samples are reproducible (and comparable from step to step)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        check_sampling(self.temperature, self.top_k, self.top_p)

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments that choose tokens, as `minigpt.model.generate` takes them."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
