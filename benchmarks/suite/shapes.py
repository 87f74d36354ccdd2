"""The model shapes the benchmarks measure, built from the project's own configs.

`small` is `configs/small.yaml`'s model, `char` is `configs/char.yaml`'s (nanoGPT's
shakespeare_char). Each takes the config's `model.gpt` section as train.py does and changes only
what the benchmark deliberately measures differently (`OVERRIDES`, each with its reason). The
published figures (benchmarks/RESULTS.md, README) were measured at `MEASURED_AT`; if a config
moves away from it, loading fails with a message instead of silently benchmarking another model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from minigpt.model import GPTConfig
from minigpt.training.flops import matmul_weights, training_flops_per_token

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

CONFIG_FILES = {"small": "small.yaml", "char": "char.yaml"}
"""Benchmark shape name -> the file in configs/ it is built from."""

OVERRIDES: dict[str, dict[str, int]] = {
    # small.yaml trains gpt2-compact, a vocabulary sized to its corpus. The benchmark keeps GPT-2's
    # full 50,257 tokens: the book's GPTModel (the peer) has them, and the LM head is then most of
    # the step, the case the fused loss and the allocator setting were measured on.
    "small": {"vocab_size": 50257},
    # char.yaml leaves the vocabulary to its tokenizer, which needs the prepared corpus; 65 is the
    # character set of the plays (nanoGPT's shakespeare_char). Batch 8 of context 256 is 2,048
    # tokens per step, as small's 16 x 128, so both shapes' timed blocks do the same token count.
    "char": {"vocab_size": 65, "batch": 8},
}

MEASURED_AT = {
    "small": {"context_length": 128, "n_layer": 4, "n_head": 4, "n_embd": 256, "batch": 16},
    "char": {"context_length": 256, "n_layer": 6, "n_head": 6, "n_embd": 384, "batch": 8},
}
"""What each shape was when the published figures were measured, checked on every load: a change
to a config is then a decision to re-run the benchmarks and update this together with them."""

SHAPE_FIELDS = ("vocab_size", "context_length", "n_layer", "n_head", "n_embd")
"""The GPTConfig fields a shape sets; every other field must be at its default, which is the
layout the peer's GPT mirrors (no qkv bias, no dropout; the matmul-weight check covers the rest)."""


class ShapeMismatch(RuntimeError):
    """A config in configs/ no longer matches what the benchmark assumes."""


@dataclass(frozen=True)
class Shape:
    """One benchmark shape: a complete GPTConfig (vocabulary included) and a training batch."""

    name: str
    gpt: GPTConfig
    batch: int

    @property
    def vocab(self) -> int:
        assert self.gpt.vocab_size is not None  # set by load_shape
        return self.gpt.vocab_size

    @property
    def context(self) -> int:
        return self.gpt.context_length

    @property
    def n_layer(self) -> int:
        return self.gpt.n_layer

    @property
    def n_head(self) -> int:
        return self.gpt.n_head

    @property
    def n_embd(self) -> int:
        return self.gpt.n_embd

    def batch_size(self, batch_div: int) -> int:
        """The batch a run with `--batch-div` uses (--quick divides it)."""
        return max(1, self.batch // batch_div)

    def gpt_config(self, context: int | None = None, attention: str = "auto") -> GPTConfig:
        return replace(self.gpt, context_length=context or self.context, attention=attention)

    def peer_config(self, context: int | None = None) -> dict[str, Any]:
        """The same model in the peer's config dict."""
        return {
            "vocab_size": self.vocab,
            "context_length": context or self.context,
            "emb_dim": self.n_embd,
            "n_heads": self.n_head,
            "n_layers": self.n_layer,
            "drop_rate": self.gpt.dropout,
            "qkv_bias": self.gpt.qkv_bias,
        }

    def matmul_params(self) -> int:
        """Weights that multiply activations: q, k, v, out, fc, proj per block, plus the LM head."""
        return matmul_weights(self.gpt_config())

    def flops_per_token(self) -> int:
        """Training FLOPs per token, counted as the training run counts them for its MFU."""
        return training_flops_per_token(self.gpt_config())


def load_shape(name: str) -> Shape:
    """Build shape `name` from its config file and OVERRIDES; raise ShapeMismatch if it drifted."""
    path = CONFIGS / CONFIG_FILES[name]
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    section = config["model"]["gpt"]
    if section.get("vocab_size") is not None:
        raise ShapeMismatch(f"{path} now sets vocab_size; the benchmark assumes the tokenizer's")
    gpt = GPTConfig(**section)
    unexpected = {
        f.name: getattr(gpt, f.name)
        for f in fields(GPTConfig)
        if f.name not in SHAPE_FIELDS and getattr(gpt, f.name) != f.default
    }
    if unexpected:
        raise ShapeMismatch(f"{path} sets {unexpected}; the benchmark and its peer assume the defaults")
    override = dict(OVERRIDES[name])
    batch = override.pop("batch", config["data"]["config"]["batch_size"])
    shape = Shape(name, replace(gpt, **override), batch)
    measured = {k: getattr(shape.gpt, k) for k in ("context_length", "n_layer", "n_head", "n_embd")}
    measured["batch"] = batch
    if measured != MEASURED_AT[name]:
        raise ShapeMismatch(
            f"the {name} shape from {path} is now {measured}, the published benchmarks were measured "
            f"at {MEASURED_AT[name]}: re-run them and update MEASURED_AT in benchmarks/suite/shapes.py"
        )
    return shape


@functools.cache
def shapes() -> dict[str, Shape]:
    """Every benchmark shape by name, read from configs/ once per process."""
    return {name: load_shape(name) for name in CONFIG_FILES}
