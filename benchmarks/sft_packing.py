#!/usr/bin/env python
"""Conversations per second of a fine-tuning epoch, several packed into each window or one per window.

For each context length, the conversations of ``--source`` (the play questions that
``python play_questions.py`` writes, by default) are read with the tokenizer of ``--weights`` and
the chat markers, as sft.yaml reads them, and cut into windows both ways: one conversation each,
padded (``pack: false``), and packed by greedy first-fit (``pack: true``). Each contestant trains
a model of the weights' shape at that context (random weights: the speed depends on the shape
alone) with sft.yaml's batch of windows, optimizer and precision: ``LitGPT.loss`` (the attention
path the model's setting picks, on a CPU the textbook one), its backward pass, clipping and the
optimizer's step, on batches drawn from the epoch's shuffled windows, loading included. The
contestants take turns, ``--steps`` steps each per round over ``--repeats`` rounds, the order
rotating, so the drift of a shared machine falls on all of them alike.

An epoch takes ``windows // batch`` steps; conversations per second are the epoch's conversations
over the steps' time at the median seconds per step. The speed-up is the median over the rounds
of packed over one-per-window conversations per second at the same context.

    python play_questions.py --out data_cache/play_questions
    python benchmarks/sft_packing.py --contexts 128 512 --steps 10 --repeats 5
"""

from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from minigpt.checkpoints.pretrained import open_pretrained
from minigpt.data.chat.conversations import (
    ChatDataConfig,
    ChatExamples,
    ConversationWindows,
    PackedConversationWindows,
    load_chat_examples,
)
from minigpt.data.chat.template import ChatEncoder
from minigpt.data.loader import EpochShuffle
from minigpt.data.tokenizer import tokenizer_from_spec, with_chat_tokens
from minigpt.model import GPT
from minigpt.training.config import OptimConfig
from minigpt.training.lit import LitGPT
from minigpt.training.optim import build_optimizer
from minigpt.training.precision import resolve_precision

from suite.configs import precision, read_yaml
from suite.report import cpu_flags, cpu_model
from suite.stats import rotated


@dataclass
class Contestant:
    """One context length, packed or not: its windows, and a model training on them."""

    context: int
    pack: bool
    conversations: int
    windows: ConversationWindows | PackedConversationWindows
    batches: Any
    lit: LitGPT
    optimizer: torch.optim.Optimizer
    seconds_per_step: list[float]

    @property
    def name(self) -> str:
        return f"context {self.context}, {'packed' if self.pack else 'one per window'}"

    def steps_per_epoch(self, batch_size: int) -> int:
        return len(self.windows) // batch_size


def contestant(
    examples: ChatExamples, context: int, pack: bool, pad_id: int, lit: LitGPT, settings: dict[str, Any]
) -> Contestant:
    data = settings["data"]["init_args"]["conversations"]
    seed = int(data.get("seed", ChatDataConfig.seed))
    if pack:
        windows = PackedConversationWindows(examples, context, pad_id, seed)
    else:
        windows = ConversationWindows(examples, context, pad_id)
    sampler = EpochShuffle(windows, seed)
    loader = DataLoader(windows, batch_size=int(data["batch_size"]), sampler=sampler, drop_last=True)
    optimizer = build_optimizer(lit.model, OptimConfig(**settings["model"]["optim"]))
    return Contestant(context, pack, len(examples), windows, _endless(loader, sampler), lit, optimizer, [])


def _endless(loader: DataLoader, sampler: EpochShuffle) -> Any:
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from loader


def train_steps(contestant: Contestant, steps: int, bf16: bool, grad_clip: float | None) -> float:
    """Seconds per step of `steps` training steps, loading the batches included."""
    model = contestant.lit.model
    start = time.perf_counter()
    for _ in range(steps):
        batch = next(contestant.batches)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = contestant.lit.loss(*batch)
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        contestant.optimizer.step()
        contestant.optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="data_cache/play_questions/train.jsonl", help="conversations")
    parser.add_argument(
        "--weights", default="runs/small", help="their shape and tokenizer (sft.yaml's init_from)"
    )
    parser.add_argument("--config", default="sft.yaml", help="batch, optimizer and precision")
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512])
    parser.add_argument(
        "--attention", default=None, help="the model's attention setting (default: the weights')"
    )
    parser.add_argument("--steps", type=int, default=10, help="steps per contestant per round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds")
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: its own)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    settings = read_yaml(args.config)
    _, shape, spec = open_pretrained(args.weights)
    tokenizer = with_chat_tokens(tokenizer_from_spec(spec))
    gpt = replace(shape, vocab_size=tokenizer.n_vocab, **settings["model"].get("gpt", {}))
    if args.attention is not None:
        gpt = replace(gpt, attention=args.attention)
    bf16 = resolve_precision(precision(settings), "cpu") == "bf16-mixed"
    grad_clip = OptimConfig(**settings["model"]["optim"]).grad_clip
    batch_size = int(settings["data"]["init_args"]["conversations"]["batch_size"])
    config = ChatDataConfig(args.source, split="train")

    contestants = []
    for context in args.contexts:
        examples = load_chat_examples(config, ChatEncoder(tokenizer), context)
        for pack in (False, True):
            torch.manual_seed(0)
            lit = LitGPT(replace(gpt, context_length=context))
            lit.model = GPT(lit.gpt_config)
            contestants.append(contestant(examples, context, pack, tokenizer.end_id, lit, settings))
    for c in contestants:  # warm-up: the allocator's pools and the kernels' first calls
        train_steps(c, 2, bf16, grad_clip)
    for r in range(args.repeats):
        for c in rotated(contestants, r):
            c.seconds_per_step.append(train_steps(c, args.steps, bf16, grad_clip))
            print(f"round {r + 1}: {c.name}: {c.seconds_per_step[-1] * 1e3:.0f} ms per step", flush=True)

    lines = [
        f"CPU: {cpu_model()} ({cpu_flags()}), {torch.get_num_threads()} threads; torch {torch.__version__},"
        f" {platform.python_version()}; {'bf16 autocast' if bf16 else 'fp32'}, attention {gpt.attention};"
        f" {args.source}, {args.weights}'s shape; batch {batch_size} windows; {args.steps} steps x"
        f" {args.repeats} rounds",
        "",
        "| context | windows | conversations per window | ms per step | conversations/s | epoch | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for alone, packed in zip(contestants[::2], contestants[1::2], strict=True):
        ratios = [
            (alone_s / packed_s) * (packed.conversations / len(packed.windows))
            for alone_s, packed_s in zip(alone.seconds_per_step, packed.seconds_per_step, strict=True)
        ]
        for c in (alone, packed):
            step = statistics.median(c.seconds_per_step)
            epoch = c.steps_per_epoch(batch_size) * step
            per_window = c.conversations / len(c.windows)
            gain = f"{statistics.median(ratios):.2f}x" if c.pack else "1"
            lines.append(
                f"| {c.context}{' packed' if c.pack else ''} | {len(c.windows):,} | {per_window:.2f} |"
                f" {step * 1e3:.0f} | {c.conversations / epoch:,.0f} | {epoch / 60:.1f} min | {gain} |"
            )
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
