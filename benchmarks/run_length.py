#!/usr/bin/env python
"""How long a config must run: the same recipe at several run lengths, each a whole `train.py` run.

Each length is `train.py --config <config>` with `--trainer.max_steps` set to it and everything
that follows the length scaled with it, so each run has its own full schedule rather than being a
prefix of the longest: the warmup (the config's warmup times length / its max_steps), the decay
(over max_steps, as train.py always does), the weight average, and four validations at the same
quarters of the run, the last one on the whole validation split. Losses on a CPU do not depend on
how busy the machine was; the wall clock does, so run nothing else beside it when the minutes
matter.

    python benchmarks/run_length.py --config small.yaml --lengths 500,750,1000,1250,1500
    python benchmarks/run_length.py --config small.yaml --lengths 750,1000 --seeds 1337,1338 \\
        --set model.optim.schedule=wsd

The table (markdown) goes to stdout and `--out`; each run's folder and log stay under `--work`.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from pathlib import Path

import torch

from suite.configs import config_path, read_yaml
from suite.report import cpu_flags, cpu_model
from suite.runs import log, run_train_py


def scaled_settings(config: dict, length: int, seed: int) -> list[str]:
    """The command-line overrides that make `config` a full run of `length` steps."""
    full = int(config["trainer"]["max_steps"])
    warmup = int(config["model"]["optim"]["warmup_steps"])
    return [
        "--trainer.max_steps", str(length),
        "--trainer.val_check_interval", str(max(1, round(length / 4))),
        "--model.optim.warmup_steps", str(round(warmup * length / full)),
        "--seed_everything", str(seed),
    ]  # fmt: skip


def one_run(args: argparse.Namespace, config: dict, length: int, seed: int) -> dict:
    """Train one length; its validations (step, bits per byte, nats per token) and wall clock."""
    name = f"steps{length}-seed{seed}"
    extra = scaled_settings(config, length, seed)
    for setting in args.set:
        key, _, value = setting.partition("=")
        extra += [f"--{key}", value]
    start = time.perf_counter()
    rows = run_train_py([config_path(args.config)], extra, args.work / name, Path.cwd())
    wall = time.perf_counter() - start
    vals = [(int(r["step"]) + 1, float(r["val_bpb"]), float(r["val_loss"])) for r in rows if r.get("val_bpb")]
    log(f"[{name}] {wall / 60:.1f} min, bits per byte " + " / ".join(f"{b:.3f}" for _, b, _ in vals))
    return {"length": length, "seed": seed, "wall": wall, "vals": vals}


def table(results: list[dict]) -> list[str]:
    """One row per length: the last validation of each seed, their mean, and the curve."""
    lines = [
        "| steps | seeds | wall clock (min) | val bits per byte at the quarters | at the end "
        "| nats per token |",
        "|---|---|---|---|---|---|",
    ]
    for length in sorted({r["length"] for r in results}):
        runs = [r for r in results if r["length"] == length]
        ends = [r["vals"][-1][1] for r in runs]
        curves = "; ".join(" / ".join(f"{b:.3f}" for _, b, _ in r["vals"]) for r in runs)
        seeds = ", ".join(str(r["seed"]) for r in runs)
        walls = ", ".join(f"{r['wall'] / 60:.1f}" for r in runs)
        nats = ", ".join(f"{r['vals'][-1][2]:.3f}" for r in runs)
        end = statistics.mean(ends)
        lines.append(f"| {length} | {seeds} | {walls} | {curves} | **{end:.3f}** | {nats} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small.yaml")
    p.add_argument("--lengths", default="500,750,1000,1250,1500", help="steps of each run, in the order run")
    p.add_argument("--seeds", default="1337")
    p.add_argument("--set", action="append", default=[], help="key=value, a train.py override for every run")
    p.add_argument("--work", type=Path, default=Path("runs/run-length"))
    p.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    args = p.parse_args()
    config = read_yaml(args.config)
    args.work.mkdir(parents=True, exist_ok=True)
    header = [
        f"`{args.config}` by run length, {datetime.date.today()}, torch {torch.__version__}, "
        f"{platform.machine()} {cpu_model()} ({cpu_flags()}); overrides: {', '.join(args.set) or 'none'}",
        "",
    ]
    results = []
    for length in (int(n) for n in args.lengths.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            results.append(one_run(args, config, length, seed))
            text = "\n".join([*header, *table(results)]) + "\n"
            if args.out:
                args.out.write_text(text)  # after every run: a stopped sweep keeps what it measured
    print(text, end="")


if __name__ == "__main__":
    main()
