#!/usr/bin/env python
"""Which levers of the modern recipe pay at our shapes: each alone, then combinations, each given
the same wall-clock budget through `train.py`, scored by validation loss.

Every variant is `train.py --config <config>` plus its overrides, with the same data and seed.
The budget is the time the baseline (the config as it is) needs for `--steps` steps. A variant
that makes a step slower gets proportionally fewer steps, so every variant has the same time:

1. **Timing.** One training step (forward, backward, clipping, optimizer) of every variant is
   timed in this process, with the project's own model, optimizer, precision (bf16 autocast, or
   fp32 where the CPU has no native bf16, as train.py decides) and allocator setting, on random
   ids. The variants take turns for `--rounds` rounds, so a machine whose speed drifts slows
   them alike; each variant's speed is its fastest step relative to the baseline's.
2. **Training.** Each variant then trains through `train.py` for `--steps` x its relative speed
   steps, its warmup scaled with them, and validates once at the end on the whole validation
   split. These runs are deterministic on a CPU: their losses do not depend on how busy the
   machine was, only the timing does.

    python benchmarks/ablation.py --config small.yaml --steps 400 --text tinyshakespeare.txt
    python benchmarks/ablation.py --config char.yaml --variants baseline,muon,rope --seeds 1337,1338
    python benchmarks/ablation.py --config small.yaml --over recipes/gpt2.yaml --variants baseline,rope

Variants are named in `suite.configs.VARIANTS`; `a+b` combines levers. The table gives medians
over seeds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from minigpt.data import DataConfig, prepare
from minigpt.training.allocator import keep_freed_memory
from minigpt.training.config import OptimConfig

from suite.configs import EMA, VARIANTS, cli_overrides, config_ema, config_path, merged, read_yaml, settings
from suite.runs import log, step_timer, train


def relative_speeds(
    config: dict[str, Any], variants: list[str], vocab_size: int, rounds: int, steps: int
) -> dict[str, float]:
    """Each variant's steps per second relative to the baseline's.

    A step's time is the fastest of the variant's `rounds` x `steps` timed steps: other work on
    the machine only ever adds time, so the minimum is the measure least moved by it.
    """
    keep_freed_memory()  # as train.py does
    timers = {v: step_timer(config, settings(v, config), vocab_size) for v in ["baseline", *variants]}
    for timer in timers.values():
        timer(), timer()  # warm up: first-touch allocations, oneDNN's kernel choice
    fastest = dict.fromkeys(timers, float("inf"))
    order = list(timers)
    for r in range(rounds):
        for v in order[r % len(order) :] + order[: r % len(order)]:  # each round starts elsewhere
            fastest[v] = min(fastest[v], *(timers[v]() for _ in range(steps)))
        log(f"[timing] round {r + 1}: baseline {fastest['baseline'] * 1000:.0f} ms/step so far")
    return {v: fastest["baseline"] / fastest[v] for v in variants}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="small.yaml")
    p.add_argument("--over", default=None, help="a second config laid over the first, e.g. recipes/gpt2.yaml")
    p.add_argument("--text", default=None, help="a UTF-8 text file (default: the built-in corpus)")
    p.add_argument("--steps", type=int, default=None, help="the baseline's steps (default: the config's)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated; a+b combines levers")
    p.add_argument("--seeds", default="1337", help="comma-separated seeds; the table shows medians")
    p.add_argument("--rounds", type=int, default=7, help="timing rounds, the variants taking turns")
    p.add_argument("--timed-steps", type=int, default=5, help="steps timed per variant and round")
    p.add_argument(
        "--speeds", default=None, help="skip the timing: variant=speed,... as a timing run printed"
    )
    p.add_argument("--timing-only", action="store_true", help="print the relative speeds and stop")
    p.add_argument(
        "--validations",
        type=int,
        default=1,
        help="validate every steps // N steps; the table shows the last (the end when N divides the steps)",
    )
    p.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    args = p.parse_args()
    args.source = str(Path(args.text).resolve()) if args.text else "shakespeare"
    args.config, args.over = config_path(args.config), args.over and config_path(args.over)
    config = read_yaml(args.config)
    if args.over:
        config = merged(config, read_yaml(args.over))
    variants = [v for v in args.variants.split(",") if v]
    has_ema = config_ema(config) is not None
    for variant in variants:
        extra = settings(variant, config)  # fail on a typo before any work
        if has_ema and extra.get("trainer.callbacks+") == EMA:
            raise SystemExit(
                f"error: {args.config} already averages its weights; "
                f"variant {variant} would add a second EMAWeights"
            )
    seeds = [int(s) for s in args.seeds.split(",")]
    full_steps = int(config["trainer"]["max_steps"])
    base_steps = args.steps or full_steps
    warmup = int(config["model"].get("optim", {}).get("warmup_steps", OptimConfig.warmup_steps))

    with tempfile.TemporaryDirectory(prefix="minigpt-ablation-") as tmp:
        work = Path(tmp)
        data = dict(config["data"]["config"], source=args.source, cache_dir=str(work / "data"))
        vocab_size = prepare(DataConfig(**data)).tokenizer().n_vocab
        if args.speeds:
            speed = {
                "baseline": 1.0,
                **{k: float(v) for k, v in (x.split("=") for x in args.speeds.split(","))},
            }
        else:
            speed = relative_speeds(config, variants, vocab_size, args.rounds, args.timed_steps)
        if args.timing_only:
            print("\n".join(f"{v}: {s:.1%}" for v, s in speed.items()))
            return
        results: dict[str, list[dict[str, float]]] = {}
        for variant in variants:
            steps = max(1, round(base_steps * speed[variant]))
            for seed in seeds:
                extra = {
                    "seed_everything": seed,
                    "trainer.max_steps": steps,
                    "trainer.val_check_interval": max(1, steps // args.validations),
                    "model.optim.warmup_steps": max(1, round(warmup * steps / full_steps)),
                    **settings(variant, config),
                }
                result = train(args, work, f"{variant}-{seed}", cli_overrides(extra))
                log(f"[{variant}-{seed}] {result}")
                results.setdefault(variant, []).append(result)

    base = statistics.median(r["val_loss"] for r in results["baseline"]) if "baseline" in results else None
    lines = [
        f"`python benchmarks/ablation.py --config {args.config}"
        + (f" --over {args.over}" if args.over else "")
        + f" --steps {base_steps}"
        + (f" --text {Path(args.text).name}" if args.text else "")
        + f" --variants {args.variants} --seeds {args.seeds}"
        + (f" --speeds {args.speeds}" if args.speeds else "")
        + (f" --validations {args.validations}" if args.validations > 1 else "")
        + f"`, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; budget: the baseline's "
        f"{base_steps} steps; "
        + ("speeds as given" if args.speeds else f"timing {args.rounds} rounds x {args.timed_steps} steps")
        + "; median over "
        f"{len(seeds)} seed(s)",
        "",
        "| variant | step speed vs baseline | steps | val loss | vs baseline | val bits per byte | curve |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant, runs in results.items():
        loss = statistics.median(r["val_loss"] for r in runs)
        delta = f"{loss - base:+.3f}" if base is not None else "-"
        bpb = statistics.median(r["val_bpb"] for r in runs)
        curve = " / ".join(f"{v:.3f}" for v in runs[0]["curve"])
        row = [
            variant,
            f"{speed[variant]:.1%}",
            f"{runs[0]['steps']:.0f}",
            f"{loss:.3f}",
            delta,
            f"{bpb:.4f}",
            curve,
        ]
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
