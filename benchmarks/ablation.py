#!/usr/bin/env python
"""Which levers of the modern recipe pay at our shapes: each alone, then combinations, each
trained for the same wall-clock budget through `train.py`, scored by validation loss.

Every variant is `train.py --config <config>` plus its overrides, with the same data, seed and
budget. A calibration run of the baseline against the clock alone counts the steps the budget
holds; every variant then gets that many `max_steps`, so its schedule (warmup, decay) fits the
budget, and Lightning's `max_time` as the hard limit, so a lever that slows a step loses its last steps (and
its decay) rather than getting extra time. The score is the validation loss train.py logs at the
end, over the whole validation split; tokens/s is the run's median.

    python benchmarks/ablation.py --config small.yaml --budget 90 --text tinyshakespeare.txt
    python benchmarks/ablation.py --variants baseline,muon,rope --seeds 1337,1338

Variants are named in VARIANTS below; `a+b` combines two.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quality import log, max_time

ROOT = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "muon": ["--model.optim.optimizer", "muon"],
    "rope": ["--model.gpt.position_embedding", "rope"],
    "qk_norm": ["--model.gpt.qk_norm", "true"],
    "rmsnorm": ["--model.gpt.norm", "rmsnorm"],
    "relu2": ["--model.gpt.activation", "relu2"],
    "zero_init": ["--model.gpt.zero_init_proj", "true"],
    "softcap": ["--model.gpt.logit_softcap", "30"],
    "untied": ["--model.gpt.tie_weights", "false"],
    "wsd": ["--model.optim.schedule", "wsd", "--model.optim.decay_fraction", "0.4"],
    "lr_x2": ["--model.optim.lr", "4e-3", "--model.optim.min_lr", "4e-4"],
}
"""Each lever alone, as command-line overrides of the config."""


def overrides(variant: str) -> list[str]:
    out: list[str] = []
    for name in variant.split("+"):
        if name not in VARIANTS:
            raise SystemExit(f"error: unknown variant {name!r}; known: {', '.join(VARIANTS)}")
        out += VARIANTS[name]
    return out


def train(args: argparse.Namespace, work: Path, name: str, extra: list[str]) -> dict[str, float]:
    """One train.py run; its steps, median tokens/s, last logged val loss and wall time."""
    run_dir = work / name
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "--config",
        args.config,
        "--data.config.source",
        args.source,
        "--data.config.cache_dir",
        str(work / "data"),
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.log_every_n_steps",
        "5",
        *extra,
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    log(f"[{name}] {shlex.join(command[2:])}")
    start = time.perf_counter()
    with open(work / f"{name}.log", "w") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=work, env=env)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"train.py failed for {name} (exit {result.returncode}); see {work / name}.log")
    with open(run_dir / "csv" / "version_0" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    speeds = [float(r["tokens_per_sec"]) for r in rows if r.get("tokens_per_sec")]
    vals = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    return {
        "steps": max(int(r["step"]) for r in rows) + 1,
        "tokens_per_s": statistics.median(speeds) if speeds else math.nan,
        "val_loss": vals[-1] if vals else math.nan,
        "wall_s": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="small.yaml")
    p.add_argument(
        "--text", default=None, help="a UTF-8 text file (default: the built-in Shakespeare corpus)"
    )
    p.add_argument("--budget", type=float, default=90.0, help="seconds of training per variant")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated; a+b combines levers")
    p.add_argument("--seeds", default="1337", help="comma-separated seeds; the table shows medians")
    p.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    args = p.parse_args()
    args.source = str(Path(args.text).resolve()) if args.text else "shakespeare"
    variants = args.variants.split(",")
    for variant in variants:
        overrides(variant)  # fail on a typo before any training
    seeds = [int(s) for s in args.seeds.split(",")]

    with tempfile.TemporaryDirectory(prefix="minigpt-ablation-") as tmp:
        work = Path(tmp)
        # The baseline, run against the clock alone, says how many steps the budget holds.
        calib = train(
            args,
            work,
            "calibration",
            ["--trainer.max_steps", "1000000", "--trainer.max_time", max_time(args.budget)],
        )
        steps = int(calib["steps"])
        log(f"calibration: {steps} steps in {args.budget:.0f} s")
        results: dict[str, list[dict[str, float]]] = {}
        for variant in variants:
            for seed in seeds:
                extra = [
                    "--seed_everything",
                    str(seed),
                    "--trainer.max_steps",
                    str(steps),
                    "--trainer.max_time",
                    max_time(args.budget),
                    "--trainer.val_check_interval",
                    str(steps),
                    "--model.optim.warmup_steps",
                    str(max(1, steps // 20)),
                    *overrides(variant),
                ]
                result = train(args, work, f"{variant}-{seed}", extra)
                log(f"[{variant}-{seed}] {result}")
                results.setdefault(variant, []).append(result)

    base = statistics.median(r["val_loss"] for r in results.get("baseline", [{"val_loss": math.nan}]))
    base_speed = statistics.median(
        r["tokens_per_s"] for r in results.get("baseline", [{"tokens_per_s": math.nan}])
    )
    lines = [
        f"`python benchmarks/ablation.py --config {args.config} --budget {args.budget:.0f}"
        + (f" --text {Path(args.text).name}" if args.text else "")
        + f" --seeds {args.seeds}`, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; {steps} steps planned "
        f"({args.budget:.0f} s at the baseline's rate), warmup 5%, median over {len(seeds)} seed(s)",
        "",
        "| variant | steps run | tokens/s (vs baseline) | val loss | vs baseline |",
        "|---|---|---|---|---|",
    ]
    for variant, runs in results.items():
        loss = statistics.median(r["val_loss"] for r in runs)
        speed = statistics.median(r["tokens_per_s"] for r in runs)
        run_steps = statistics.median(r["steps"] for r in runs)
        lines.append(
            f"| {variant} | {run_steps:.0f} | {speed:,.0f} ({speed / base_speed:.1%}) | {loss:.3f} | "
            f"{loss - base:+.3f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
