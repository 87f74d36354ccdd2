#!/usr/bin/env python
"""Validation loss after the same number of steps, variant against variant, in one process.

`ablation.py` scores variants through `train.py` in the same wall-clock time; at small shapes its
runs are long, and the loss per step is what decides between two ways of computing one update
(Muon's Newton-Schulz polynomials, say) before their speed is weighed. This trains each variant
of a config (the same variants as `ablation.py`) for `--steps` steps with the project's model,
optimizer and learning-rate schedule (warmup scaled to the steps), on random windows of the
training split drawn from the seed, without Lightning and without autocast (fp32), and scores the
first `--val-windows` windows of the validation split four times along the way.

    python benchmarks/steps_quality.py --config char.yaml --over benchmarks/baby.yaml --steps 2000 \\
        --variants baseline,polar+muon_ns3,muon_ns3
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from minigpt.data import DataConfig, prepare
from minigpt.model import GPT, GPTConfig
from minigpt.training.allocator import keep_freed_memory
from minigpt.training.config import OptimConfig
from minigpt.training.loss import next_token_loss
from minigpt.training.optim import build_optimizer, build_scheduler

from suite.configs import config_path, merged, read_yaml, section, settings


def windows(tokens: torch.Tensor, starts: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (len(starts), length) of the windows starting at `starts`."""
    rows = starts[:, None] + torch.arange(length + 1)
    ids = tokens[rows]
    return ids[:, :-1], ids[:, 1:]


def train(config: dict, variant: str, steps: int, seed: int, data: dict, val_windows: int) -> list[float]:
    """Validation losses at each quarter of `steps`."""
    extra = settings(variant, config)
    full = int(config["trainer"]["max_steps"])
    extra["model.optim.warmup_steps"] = round(int(config["model"]["optim"]["warmup_steps"]) * steps / full)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**section(config, extra, "gpt"), "vocab_size": data["vocab_size"]}))
    optim = OptimConfig(**section(config, extra, "optim"))
    optimizer = build_optimizer(model, optim)
    scheduler = build_scheduler(optimizer, optim, steps)
    batch, length = data["batch_size"], model.config.context_length
    train_tokens, val_tokens = data["train"], data["val"]
    generator = torch.Generator().manual_seed(seed)
    val_starts = torch.arange(min(val_windows, (len(val_tokens) - 1) // length)) * length
    losses = []
    for step in range(steps):
        starts = torch.randint(len(train_tokens) - length - 1, (batch,), generator=generator)
        x, y = windows(train_tokens, starts, length)
        next_token_loss(model(x), y).backward()
        if optim.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if (step + 1) % max(1, steps // 4) == 0:
            model.eval()
            with torch.no_grad():
                total = 0.0
                for chunk in val_starts.split(256):
                    x, y = windows(val_tokens, chunk, length)
                    total += next_token_loss(model(x), y).item() * len(chunk)
            model.train()
            losses.append(total / len(val_starts))
    return losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="char.yaml")
    p.add_argument("--over", default=None, help="a config laid over the first, e.g. benchmarks/baby.yaml")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--variants", default="baseline", help="comma-separated, as ablation.py's")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--val-windows", type=int, default=2048)
    args = p.parse_args()
    config = read_yaml(config_path(args.config))
    if args.over:
        config = merged(config, read_yaml(config_path(args.over)))
    keep_freed_memory()
    prepared = prepare(DataConfig(**config["data"]["config"]))
    data = {
        "vocab_size": prepared.tokenizer().n_vocab,
        "batch_size": int(config["data"]["config"]["batch_size"]),
        "train": torch.from_numpy(prepared.tokens("train").astype(np.int64)),
        "val": torch.from_numpy(prepared.tokens("val").astype(np.int64)),
    }
    for variant in args.variants.split(","):
        start = time.perf_counter()
        losses = train(config, variant, args.steps, args.seed, data, args.val_windows)
        print(
            f"{variant:24s} seed {args.seed}, {args.steps} steps: val "
            + " / ".join(f"{loss:.4f}" for loss in losses)
            + f"  ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
