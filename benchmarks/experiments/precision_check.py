#!/usr/bin/env python
"""How steady train.py's bf16 check is (`training/precision.py`, `bf16_gain`) when other work
comes and goes on the machine, against the form it had before: each timed `--repeats` times,
taking turns, alone and then beside a process that multiplies matrices on one thread in bursts
(0.3 s on, 0.2 s off), as a test run or a second training run would.

    python benchmarks/experiments/precision_check.py --repeats 40

It prints the ratios' range and how many of them reach `BF16_GAIN`, the line between training in
bf16 and in fp32. On a CPU whose bf16 is slower than fp32, every one that reaches it is a run that
would have trained in the slow precision.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

from minigpt.training.precision import BF16_GAIN, product_speeds

BURSTS = """
import time, torch
torch.set_num_threads(1)
a = torch.randn(700, 700)
while True:
    start = time.time()
    while time.time() - start < 0.3:
        a @ a
    time.sleep(0.2)
"""


def earlier_check(size: int = 512, calls: int = 5) -> float:
    """The check as it was: the best of 5 bf16 products, then the best of 5 fp32 ones, on all threads."""

    def speed(dtype: torch.dtype) -> float:
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        a @ b
        best = float("inf")
        for _ in range(calls):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        return 1.0 / best

    return speed(torch.bfloat16) / speed(torch.float32)


def check() -> float:
    bf16, fp32 = product_speeds((torch.bfloat16, torch.float32))
    return bf16 / fp32


def summary(name: str, ratios: list[float]) -> str:
    ratios = sorted(ratios)
    reached = sum(r >= BF16_GAIN for r in ratios)
    return (
        f"| {name} | {ratios[0]:.2f} | {ratios[len(ratios) // 2]:.2f} | {ratios[-1]:.2f} "
        f"| {reached} of {len(ratios)} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=40)
    args = p.parse_args()
    print(
        f"| bf16 / fp32 products | lowest | median | highest | at least {BF16_GAIN} |\n|---|---|---|---|---|"
    )
    for load in ("alone", "beside bursts of work"):
        bursts = subprocess.Popen([sys.executable, "-c", BURSTS]) if load != "alone" else None
        try:
            ratios: dict[str, list[float]] = {"the check": [], "the earlier check": []}
            for i in range(args.repeats):
                ways = [("the check", check), ("the earlier check", earlier_check)]
                for name, way in ways if i % 2 == 0 else ways[::-1]:
                    ratios[name].append(way())
                    time.sleep(0.05)
        finally:
            if bursts is not None:
                bursts.kill()
        for name, values in ratios.items():
            print(summary(f"{name}, {load}", values))


if __name__ == "__main__":
    main()
