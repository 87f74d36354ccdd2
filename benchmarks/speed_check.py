#!/usr/bin/env python
"""Is training as fast as this machine allows? A check that fails on a slow step, on any CPU.

Each shipped CPU config (`small.yaml`, `char.yaml`, and nanoGPT's README "baby GPT" shape through
`char.yaml`: 4 layers x 4 heads x 128, context 64, batch 12) is timed for a few training steps
(forward, backward, clipping, optimizer, the weight average where the config keeps one) with the
project's own model and optimizer, in the precision `train.py` trains it in on this machine (bf16
autocast, or fp32 where the CPU has no native bf16). Against each step stands the same machine's
matmul ceiling, measured in the same run and the same precision: every matrix product of that
step timed alone (`suite.probes.time_step_matmuls`). The fraction ceiling / step says how much of
the step is the products a model cannot avoid; a step that does something slow besides them (an
emulated bf16 product, a cast in a loop) drops it however fast the machine is. A config whose
fraction is below its floor (FLOORS) fails the check, and the script exits 1.

The same shapes with `recipes/gpt2.yaml` laid over them (GPT-2's recipe: AdamW, learned positions,
GELU) are timed beside them, so the table also gives the recipe's step speed against GPT-2's.

    python benchmarks/speed_check.py                       # all three, ~3 minutes on 2 cores
    python benchmarks/speed_check.py --cases baby --rounds 5
    python benchmarks/speed_check.py --cases baby --phases  # also forward+backward and optimizer apart
    python benchmarks/speed_check.py --cases baby --rounds 4 --train-steps 300  # also through train.py
    python benchmarks/speed_check.py --cases char --rounds 6 --compiled  # also with torch.compile

`--compiled` also times each recipe with its blocks through `torch.compile`, as `train.py
--model.compile true` runs them, in the same rounds: the compiled step's speed-up over the eager one,
and the first step of each, which pays for compiling (inductor's cache, when warm, pays most of it).

`--train-steps N` also runs `train.py` for N steps of each case with each recipe, taking turns for
`--rounds` rounds (wandb off, no validation): the steps/s a user sees, Lightning's loop, logging and
callbacks included, each run's figure the median of its logged `tokens_per_sec`.

Cases take turns for `--rounds` rounds, each round timing the ceiling again and then each recipe's
consecutive steps (`--steps`, or more for a short step: about ROUND_SECONDS of them, so 11 at the
baby shape); every figure is the fastest seen, which other work on the machine can only make
slower.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from minigpt.data import DataConfig, prepare
from minigpt.model import GPTConfig
from minigpt.training import muon, optim
from minigpt.training.allocator import keep_freed_memory
from minigpt.training.precision import cpu_description, resolve_precision

from suite.configs import BABY, ROOT, merged, precision, read_yaml
from suite.probes import time_step_matmuls
from suite.runs import run_train_py, step_timer
from suite.shapes import Shape

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "small": ("small.yaml", {}),
    "char": ("char.yaml", {}),
    "baby": ("char.yaml", BABY),
}

OVERLAYS = {"baby": ["benchmarks/baby.yaml"]}
"""The configs train.py lays over a case's file to make its shape (--train-steps)."""

FLOORS = {"small": 0.25, "char": 0.25, "baby": 0.05}
"""The lowest fraction of the matmul ceiling each case may reach. Measured (benchmarks/RESULTS.md):
small 0.5-0.6 and char ~0.6 on either kind of CPU, baby ~0.1-0.15, whose products are so small that
fixed costs per operation are most of its step. torch's Muon on a CPU without native bf16 (bf16
orthogonalisation emulated) put small at ~0.1: a floor at about half of what is measured fails
that and passes ordinary noise."""


@dataclass
class Case:
    """One config at one shape, timed with its own recipe and with GPT-2's."""

    name: str
    config: dict[str, Any]
    extra: dict[str, Any]
    shape: Shape
    dtype: torch.dtype
    timers: dict[str, Any] = field(default_factory=dict)
    best: dict[str, float] = field(default_factory=dict)
    first: dict[str, float] = field(default_factory=dict)
    ceiling: float = float("inf")


def vocab_size(config: dict[str, Any], work: Path) -> int:
    data = dict(config["data"]["config"], cache_dir=str(work))
    return prepare(DataConfig(**data)).tokenizer().n_vocab


def build_case(name: str, work: Path, compiled: bool = False) -> Case:
    file, extra = CASES[name]
    config = read_yaml(file)
    gpt2 = merged(config, read_yaml("recipes/gpt2.yaml"))
    vocab = vocab_size(config, work)
    gpt = {
        **config["model"]["gpt"],
        **{k.removeprefix("model.gpt."): v for k, v in extra.items() if "gpt." in k},
    }
    batch = int(extra.get("data.config.batch_size", config["data"]["config"]["batch_size"]))
    shape = Shape(name, GPTConfig(**{**gpt, "vocab_size": vocab}), batch)
    bf16 = resolve_precision(precision(config), "cpu") == "bf16-mixed"
    case = Case(name, config, extra, shape, torch.bfloat16 if bf16 else torch.float32)
    case.timers = {"recipe": step_timer(config, extra, vocab), "gpt2": step_timer(gpt2, extra, vocab)}
    if compiled:
        case.timers["recipe compiled"] = step_timer(config, extra, vocab, compiled=True)
        case.timers["gpt2 compiled"] = step_timer(gpt2, extra, vocab, compiled=True)
    return case


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def square_product_speed(dtype: torch.dtype, size: int = 512, calls: int = 3) -> float:
    """GFLOP/s of one (size x size) @ (size x size) product in `dtype`, best of `calls`. Small, so
    that an emulated bf16 product (~0.3 GFLOP/s) takes a second, not minutes."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b  # the first call pays oneDNN's kernel choice
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


ROUND_SECONDS = 0.5
"""A case whose steps are short takes more of them a round, to about this long per recipe: the
fastest of 2 steps of 40 ms spreads by a few percent with the machine's speed, of 12 by less."""


def measure(cases: list[Case], rounds: int, steps: int, count: bool = False) -> dict[str, int]:
    """Times every case's recipes for `rounds` rounds; returns the steps per round of each case.
    `count`: also count each eager recipe's matrix products in one step (the timers' `gflop`)."""
    per_round = {}
    for case in cases:
        for which, timer in case.timers.items():
            case.first[which] = timer()  # warm up: first-touch allocations, oneDNN's kernel choice, compiling
            seconds = timer()
            if count and "compiled" not in which:
                timer(count=True)
        per_round[case.name] = max(steps, math.ceil(ROUND_SECONDS / seconds))
    for r in range(rounds):
        for case in cases[r % len(cases) :] + cases[: r % len(cases)]:
            case.ceiling = min(
                case.ceiling, sum(time_step_matmuls(case.shape, case.shape.batch, case.dtype).values())
            )
            for which, timer in case.timers.items():  # consecutive steps, as in training
                seconds = min(timer() for _ in range(per_round[case.name]))
                case.best[which] = min(case.best.get(which, float("inf")), seconds)
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    return per_round


def train_py_speed(case: Case, recipe: str, steps: int, work: Path, round_: int) -> float:
    """Steps per second of `steps` steps of `case` through train.py with its own recipe or GPT-2's:
    the median of the run's logged tokens per second over the tokens of a step."""
    gpt2 = ["recipes/gpt2.yaml"] if recipe == "gpt2" else []
    layers = [CASES[case.name][0], *OVERLAYS.get(case.name, []), *gpt2]
    configs = [str(ROOT / layer) if (ROOT / layer).is_file() else layer for layer in layers]
    extra = [
        f"--trainer.max_steps={steps}",
        f"--trainer.val_check_interval={steps + 1}",  # no validation: steps only
        f"--data.config.cache_dir={work}",
    ]
    rows = run_train_py(configs, extra, work / f"{case.name}-{recipe}-{round_}", work)
    rates = [float(row["tokens_per_sec"]) for row in rows if row.get("tokens_per_sec")]
    return statistics.median(rates) / (case.shape.batch * case.shape.context)


def through_train(cases: list[Case], rounds: int, steps: int, work: Path) -> list[str]:
    """The lines of a table of each case's steps/s through train.py, recipe against GPT-2's, round
    by round, the two taking turns to go first."""
    lines = [
        "| case | round | recipe steps/s through train.py | GPT-2's recipe steps/s | recipe vs GPT-2's |",
        "|---|---|---|---|---|",
    ]
    for case in cases:
        ratios = []
        for r in range(rounds):
            order = ("recipe", "gpt2") if r % 2 == 0 else ("gpt2", "recipe")
            speed = {recipe: train_py_speed(case, recipe, steps, work, r) for recipe in order}
            ratios.append(speed["recipe"] / speed["gpt2"])
            recipe, gpt2 = speed["recipe"], speed["gpt2"]
            lines.append(f"| {case.name} | {r + 1} | {recipe:.1f} | {gpt2:.1f} | {ratios[-1]:.2f}x |")
            print(f"train.py round {r + 1}/{rounds} done", file=sys.stderr)
        lines.append(f"| {case.name} | median | | | **{statistics.median(ratios):.2f}x** |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--rounds", type=int, default=3, help="rounds, the cases taking turns")
    p.add_argument(
        "--steps", type=int, default=2, help="steps timed per case and round, at least (ROUND_SECONDS)"
    )
    p.add_argument(
        "--muon-in-bf16",
        action="store_true",
        help="orthogonalise in bf16 whatever the CPU, as torch.optim.Muon does: the regression this "
        "check was written against, to see it fail on a CPU without native bf16",
    )
    p.add_argument(
        "--torch-muon",
        action="store_true",
        help="train with torch.optim.Muon as torch ships it (bf16 orthogonalisation everywhere, one "
        "matrix at a time) instead of ours: the same update, to compare the two steps' speed",
    )
    p.add_argument(
        "--phases",
        action="store_true",
        help="also print each recipe's fastest forward+backward and optimizer part, and the matrix "
        "products each does (GFLOP, torch's FlopCounterMode): where a step's time goes",
    )
    p.add_argument(
        "--compiled",
        action="store_true",
        help="also time each recipe with its blocks compiled, as --model.compile true runs them: "
        "the step's speed-up, and the first step's time, which pays for compiling",
    )
    p.add_argument(
        "--train-steps",
        type=int,
        default=0,
        help="also run train.py for this many steps of each case with each recipe, --rounds times: "
        "the steps/s a user sees, the training loop included",
    )
    args = p.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.train_steps < 0:
        p.error("--rounds and --steps must be at least 1, --train-steps at least 0")
    if args.muon_in_bf16:
        muon.fast_matmul_dtype = lambda device: torch.bfloat16
    if args.torch_muon:
        optim.Muon = lambda params, **options: torch.optim.Muon(params, **options)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown or not names:
        raise SystemExit(
            f"error: unknown case {unknown[0] if unknown else '(none)'}; known: {', '.join(CASES)}"
        )
    keep_freed_memory()  # as train.py does
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="minigpt-speed-") as tmp:
        cases = [build_case(name, Path(tmp), args.compiled) for name in names]
        per_round = measure(cases, args.rounds, args.steps, count=args.phases)
        peak = {name: square_product_speed(dtype) for name, dtype in DTYPES.items()}
        train_py = through_train(cases, args.rounds, args.train_steps, Path(tmp)) if args.train_steps else []
    print(
        f"CPU: {cpu_description()}; {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"{args.rounds} rounds x {', '.join(f'{n} steps ({c})' for c, n in per_round.items())} "
        f"in {time.perf_counter() - start:.0f} s"
        + ("; torch.optim.Muon" if args.torch_muon else "")
        + ("; Muon in bf16" if args.muon_in_bf16 else "")
    )
    bf16_speed = peak["bf16"] / peak["fp32"]
    print(
        f"512x512 products: fp32 {peak['fp32']:.1f} GFLOP/s, bf16 {peak['bf16']:.1f} GFLOP/s "
        f"({bf16_speed:.3g}x fp32's speed: bf16 {'native' if bf16_speed > 1 else 'emulated'})\n"
    )
    print(
        "| case | precision | ms/step | matmul ceiling ms | fraction of ceiling | floor "
        "| GPT-2's recipe ms/step | recipe steps/s vs GPT-2's | |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    failed = []
    for case in cases:
        step, gpt2 = case.best["recipe"], case.best["gpt2"]
        fraction = case.ceiling / step
        ok = fraction >= FLOORS[case.name]
        if not ok:
            failed.append(case.name)
        dtype = str(case.dtype).removeprefix("torch.")
        print(
            f"| {case.name} | {dtype} | {step * 1e3:.0f} | {case.ceiling * 1e3:.0f} | {fraction:.2f} "
            f"| {FLOORS[case.name]:.2f} | {gpt2 * 1e3:.0f} | {gpt2 / step:.2f}x | {'ok' if ok else 'SLOW'} |"
        )
    if args.phases:
        print(
            "\n| case | recipe | forward+backward ms | its products GFLOP "
            "| optimizer ms (clipping, step, average) | its products GFLOP |"
        )
        print("|---|---|---|---|---|---|")
        for case in cases:
            for which, timer in case.timers.items():
                fastest, gflop = timer.fastest, timer.gflop
                parts = ("forward+backward", "optimizer")
                counted = [f"{gflop[part]:.3f}" if part in gflop else "" for part in parts]
                print(
                    f"| {case.name} | {which} | {fastest['forward+backward'] * 1e3:.1f} | {counted[0]} "
                    f"| {fastest['optimizer'] * 1e3:.1f} | {counted[1]} |"
                )
    if args.compiled:
        print(
            "\n| case | recipe | eager ms/step | compiled ms/step | compiled's speed-up "
            "| first step eager s | first step compiled s |"
        )
        print("|---|---|---|---|---|---|---|")
        for case in cases:
            for recipe in ("recipe", "gpt2"):
                eager, compiled = case.best[recipe], case.best[f"{recipe} compiled"]
                print(
                    f"| {case.name} | {recipe} | {eager * 1e3:.0f} | {compiled * 1e3:.0f} "
                    f"| {eager / compiled:.3f}x "
                    f"| {case.first[recipe]:.1f} | {case.first[f'{recipe} compiled']:.1f} |"
                )
    if train_py:
        print(f"\nThrough train.py, {args.train_steps} steps a run (the median of its logged tokens/s):")
        print("\n".join(train_py))
    if failed:
        print(f"\nerror: {', '.join(failed)}: the step is below its floor of the matmul ceiling")
        sys.exit(1)


if __name__ == "__main__":
    main()
