#!/usr/bin/env python
"""What a trained model's validation loss is made of: by position in the window and by how often
the target token occurs in the training split.

    python benchmarks/experiments/val_breakdown.py runs/small
    python benchmarks/experiments/val_breakdown.py runs/small --context 64 --source path/to/text.txt

The model scores every non-overlapping window of the validation split (`--context` tokens, the
model's context length by default) in fp32, as `benchmarks/quality.py` does. Three tables:

- **position**: the mean loss of the tokens at positions 0, 1-3, 4-15, ... of a window; how much
  a longer context is worth to this model;
- **training count**: the tokens grouped by how many times they occur in the training split; a
  token the model never saw as a target can only get the probability it learned to give the
  unseen, and the share column says how much of the mean each group carries;
- **uniform mix**: the loss after mixing a share of the uniform distribution into the model's,
  the most that calibrating rare tokens after training could win.

The corpus and tokenizer must be the ones the model was trained with (`--source`, the built-in
plays by default; the tokenizer is the checkpoint's).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

from minigpt.checkpoints import CheckpointError, load_model
from minigpt.data import DataConfig, DataError, prepare

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the `suite` library
from suite.runs import windows

POSITION_EDGES = (0, 1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048)
COUNT_GROUPS = ((0, 0, "never"), (1, 4, "1-4 times"), (5, 99, "5-99 times"), (100, None, "100+ times"))
UNIFORM_SHARES = (1e-3, 3e-3, 1e-2, 3e-2)


def target_log_probs(
    model: torch.nn.Module, ids: np.ndarray, context: int, batch: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) of every target in the non-overlapping windows of `ids`, and the targets; both
    (windows, context)."""
    x, y = windows(ids, context)
    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch):
            logp = torch.log_softmax(model(x[i : i + batch]).float(), dim=-1)
            out.append(logp.gather(-1, y[i : i + batch, :, None]).squeeze(-1))
    return torch.cat(out), y


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a run folder or a model file")
    p.add_argument("--source", default="shakespeare", help="the corpus it was trained on")
    p.add_argument("--context", type=int, default=None, help="window length (default: the model's)")
    args = p.parse_args()

    try:
        model, tokenizer = load_model(args.checkpoint)
        prepared = prepare(DataConfig(source=args.source, tokenizer=tokenizer.name))
    except (CheckpointError, DataError) as err:
        raise SystemExit(f"error: {err}") from None
    context = model.config.context_length if args.context is None else args.context
    if not 1 <= context <= model.config.context_length:
        raise SystemExit(f"error: --context must be 1..{model.config.context_length}, got {context}")
    n_vocab = prepared.tokenizer().n_vocab
    if n_vocab != model.config.vocab_size:
        raise SystemExit(
            f"error: {args.source!r} with {tokenizer.name} has {n_vocab} tokens, "
            f"the model {model.config.vocab_size}: not the corpus it was trained on"
        )
    val = prepared.tokens("val")
    if len(val) <= context:
        raise SystemExit(f"error: the validation split ({len(val)} tokens) holds no window of {context}")
    counts = np.bincount(prepared.tokens("train"), minlength=model.config.vocab_size)
    logp, targets = target_log_probs(model, val, context)
    loss = -logp
    mean = loss.mean().item()
    print(f"{args.checkpoint}: {loss.numel():,} validation targets in {loss.shape[0]:,} windows of {context}")
    print(f"mean loss {mean:.4f} nats\n")

    print("| positions | mean loss |\n|---|---|")
    edges = [e for e in POSITION_EDGES if e < context] + [context]
    for lo, hi in zip(edges, edges[1:], strict=False):
        label = f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}"
        print(f"| {label} | {loss[:, lo:hi].mean().item():.4f} |")

    seen = torch.from_numpy(counts)[targets]
    print("\n| times in the training split | targets | mean loss | share of the mean |\n|---|---|---|---|")
    for lo, hi, label in COUNT_GROUPS:
        mask = (seen >= lo) & (seen <= hi) if hi is not None else seen >= lo
        if mask.any():
            group = loss[mask]
            share = group.sum().item() / loss.numel()
            print(f"| {label} | {group.numel():,} | {group.mean().item():.3f} | {share:.4f} |")

    print("\n| uniform share mixed in | mean loss | change |\n|---|---|---|")
    for share in UNIFORM_SHARES:
        uniform = torch.full_like(logp, math.log(share / model.config.vocab_size))
        mixed = -torch.logaddexp(logp + math.log1p(-share), uniform).mean().item()
        print(f"| {share:g} | {mixed:.4f} | {mixed - mean:+.4f} |")


if __name__ == "__main__":
    main()
