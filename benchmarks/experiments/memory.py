"""Resident memory of a long training run: does it stay flat?

Runs `train.py` as a user would (wandb offline, CSV, samples table, checkpoints) and samples the
process's resident set size from outside every half second. Prints a markdown table of RSS over
the run and the growth from the first validation to the end.

    python benchmarks/experiments/memory.py                   # tiny.yaml, 3000 steps, a few minutes
    python benchmarks/experiments/memory.py --steps 1000 --config small.yaml --source shakespeare
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def rss_mib(pid: int) -> float | None:
    """VmRSS of a live process, in MiB (None once it has exited)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny.yaml")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--val_every", type=int, default=100)
    parser.add_argument("--source", default=None, help="data source (default: the config's)")
    opts = parser.parse_args()

    with tempfile.TemporaryDirectory() as work:
        cmd = [
            sys.executable, str(REPO / "train.py"), "--config", opts.config,
            "--trainer.default_root_dir", str(Path(work) / "run"),
            "--trainer.max_steps", str(opts.steps),
            "--trainer.val_check_interval", str(opts.val_every),
            "--trainer.enable_progress_bar", "false",
        ]  # fmt: skip
        if opts.source:
            cmd += ["--data.config.source", opts.source]
        # The config's wandb logger defers to WANDB_MODE: offline, so the run writes what a user's does.
        env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
        log_path = Path(work) / "train.log"
        start = time.monotonic()
        with open(log_path, "w") as log:
            child = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
            samples: list[tuple[float, float]] = []
            first_val: float | None = None
            while child.poll() is None:
                rss = rss_mib(child.pid)
                if rss is not None:
                    samples.append((time.monotonic() - start, rss))
                if first_val is None and "--- sample at step" in log_path.read_text(errors="replace"):
                    first_val = time.monotonic() - start
                time.sleep(0.5)
        if child.returncode != 0:
            print(log_path.read_text(errors="replace")[-3000:])
            return child.returncode

    duration = samples[-1][0]
    print(f"| {opts.config}, {opts.steps} steps, validation + sample every {opts.val_every} | RSS (MiB) |")
    print("|---|---|")
    for fraction in (0.1, 0.25, 0.5, 0.75, 0.9, 1.0):
        t, rss = min(samples, key=lambda s: abs(s[0] - fraction * duration))
        print(f"| {t:6.0f} s ({fraction:.0%} of the run) | {rss:7.1f} |")
    after_warmup = [rss for t, rss in samples if first_val is not None and t >= first_val]
    if after_warmup:
        growth = after_warmup[-1] - after_warmup[0]
        print(f"\nfrom the first validation to the end: {after_warmup[0]:.1f} -> {after_warmup[-1]:.1f} MiB "
              f"({growth:+.1f} MiB), peak {max(after_warmup):.1f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
