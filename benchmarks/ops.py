#!/usr/bin/env python
"""Where a training step's time goes: the wall-clock time of every PyTorch operator in one step.

The step is `bench.py`'s (forward, loss, backward, AdamW step on a fixed batch, built by
`suite.contestants`), with train.py's allocator setting unless ``--allocator default``. A
dispatch mode puts a clock around every aten call of the step, forward, backward and optimizer
alike, so each operator is timed as it runs in the step. (torch.profiler is not used: while it
records, some operators run several times slower here, e.g. the attention softmax at the char
shape.) Matrix products are also listed by shape and layout with their GFLOP/s, next to a square
matmul of the same precision timed right after.

    python benchmarks/ops.py                              # ours, char shape, bf16 autocast
    python benchmarks/ops.py --shape small --impl peer-fast
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minigpt.training import allocator

from suite.contestants import TrainSpec, build_train_step
from suite.probes import Matmul
from suite.shapes import shapes

MATMULS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2)}
"""aten matrix products and the positions of their two factors."""


def layout(t: torch.Tensor) -> str:
    """Shape, marked "ᵀ" when the last two dimensions are stored transposed."""
    transposed = t.dim() >= 2 and t.stride(-1) != 1
    return "x".join(map(str, t.shape)) + ("ᵀ" if transposed else "")


class OpClock(TorchDispatchMode):
    """Accumulates wall-clock seconds and calls per operator, and per matmul shape."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.matmul_seconds: dict[str, float] = defaultdict(float)
        self.matmul_flops: dict[str, float] = defaultdict(float)
        self.matmul_calls: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        seconds = time.perf_counter() - start
        name = func.overloadpacket.__name__
        self.seconds[name] += seconds
        self.calls[name] += 1
        if name in MATMULS:
            a, b = (args[i] for i in MATMULS[name])
            key = f"{name} {layout(a)} @ {layout(b)}"
            batch = a.shape[0] if a.dim() == 3 else 1
            self.matmul_seconds[key] += seconds
            self.matmul_flops[key] += 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]
            self.matmul_calls[key] += 1
        return out


def median_step_ms(step: Any, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(shapes()), default="char")
    parser.add_argument("--impl", choices=("ours", "peer", "peer-fast"), default="ours")
    parser.add_argument("--fp32", action="store_true", help="fp32 instead of bf16 autocast")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (each way)")
    parser.add_argument("--allocator", choices=("tuned", "default"), default="tuned")
    parser.add_argument("--top", type=int, default=20, help="operators listed")
    args = parser.parse_args(argv)
    if args.allocator == "tuned":
        allocator.keep_freed_memory()  # before any tensor exists, as train.py does

    spec = TrainSpec(shape=args.shape, impl=args.impl, bf16=not args.fp32)
    try:
        step, tokens, _ = build_train_step(spec, batch_div=1)
    except RuntimeError as err:  # the peer is not installed
        print(f"ops.py: {err}", file=sys.stderr)
        return 2
    for _ in range(5):
        step()
    plain_ms = median_step_ms(step, args.steps)
    clock = OpClock()
    with clock:
        timed_ms = median_step_ms(step, args.steps)
    plain_after_ms = median_step_ms(step, args.steps)
    peak = Matmul().probe(spec.dtype)

    per_step = {name: seconds * 1e3 / args.steps for name, seconds in clock.seconds.items()}
    total = sum(per_step.values())
    print(f"### {spec.name}, {args.shape} shape, allocator {args.allocator}\n")
    print(f"- step: {plain_ms:.1f} ms before and {plain_after_ms:.1f} ms after the timed steps "
          f"({tokens / plain_ms * 1e3:,.0f} tokens/s before)")  # fmt: skip
    print(f"- with a clock around every operator: {timed_ms:.1f} ms, {total:.1f} ms of it inside operators")
    print(f"- square {spec.dtype} matmul right after: {peak:,.0f} GFLOP/s\n")
    print("| operator | ms per step | share of operator time | calls per step |")
    print("|---|---:|---:|---:|")
    for name, ms in sorted(per_step.items(), key=lambda item: -item[1])[: args.top]:
        print(f"| {name} | {ms:.2f} | {ms / total:.1%} | {clock.calls[name] / args.steps:g} |")

    print("\n| matrix product (ᵀ: stored transposed) | ms per step | GFLOP/s | of the square matmul |")
    print("|---|---:|---:|---:|")
    for key, seconds in sorted(clock.matmul_seconds.items(), key=lambda item: -item[1]):
        gflops = clock.matmul_flops[key] / seconds / 1e9
        ms = seconds * 1e3 / args.steps
        calls = clock.matmul_calls[key] // args.steps
        print(f"| {key} ({calls}x) | {ms:.2f} | {gflops:,.0f} | {gflops / peak:.0%} |")
    matmul_ms = sum(clock.matmul_seconds.values()) * 1e3 / args.steps
    print(f"\nmatrix products: {matmul_ms:.1f} ms per step, {matmul_ms / total:.0%} of the operator time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
