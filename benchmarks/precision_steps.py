#!/usr/bin/env python
"""A config's training step on this CPU in bf16-mixed, in fp32 and in fp32 held to AVX2, through
`train.py` itself, the three taking turns: which precision this CPU should train in.

    python benchmarks/precision_steps.py                     # small.yaml, 60 steps, 2 rounds
    python benchmarks/precision_steps.py --config char.yaml --steps 30 --rounds 1

Each run trains `--steps` steps without validation, checkpoints, samples or maps; its time a step
is the Timeline callback's seconds in training steps over the steps (`suite/timeline.py`), so
start-up cancels out. bf16-mixed is asked for with `MINIGPT_CPU_BF16=1` (training/precision.py),
so that it runs in bf16 even where train.py would measure bf16 slower and train in fp32; "AVX2"
sets `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`, as a CPU without AVX-512 runs. It also
prints what train.py's own check measures here: bf16 products' speed against fp32's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WAYS = {
    "bf16-mixed": ("bf16-mixed", {"MINIGPT_CPU_BF16": "1"}),
    "fp32": ("32-true", {}),
    "fp32, AVX2": ("32-true", {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}),
}
QUIET = [
    "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
    "--callbacks.SampleText", "false", "--callbacks.AttentionMaps", "false", "--callbacks.RunReport", "false",
    "--callbacks.ModelCheckpoint", "false", "--trainer.enable_checkpointing", "false",
    "--loggers.WandbLogger", "false", "--trainer.accelerator", "cpu",
]  # fmt: skip


def step_ms(config: str, precision: str, env: dict[str, str], steps: int, work: Path) -> float:
    """Milliseconds a training step of `config` in `precision`, from one train.py run."""
    events = work / "timeline.jsonl"
    events.unlink(missing_ok=True)
    command = [
        sys.executable, str(ROOT / "train.py"), "--config", config, "--trainer.precision", precision,
        "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(work / "run"), *QUIET,
        "--trainer.callbacks+=suite.timeline.Timeline", f"--trainer.callbacks.path={events}",
    ]  # fmt: skip
    full = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT / "benchmarks"), **env}
    done = subprocess.run(command, cwd=work, env=full, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"error: train.py in {precision} failed:\n{tail}")
    end = next(e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "train_end")
    return end["steps_s"] / end["step"] * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="small.yaml")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()

    from minigpt.training.precision import bf16_gain, cpu_description

    print(f"CPU: {cpu_description()}; bf16 products at {bf16_gain():.2f}x fp32's speed (train.py's check)")
    times: dict[str, list[float]] = {name: [] for name in WAYS}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(1, args.rounds + 1):
            for name, (precision, env) in WAYS.items():
                work = Path(folder) / name.replace(", ", "-")
                work.mkdir(exist_ok=True)
                times[name].append(step_ms(args.config, precision, env, args.steps, work))
                print(f"round {round_}: {name} {times[name][-1]:.1f} ms a step", flush=True)
    fastest = min(statistics.median(t) for t in times.values())
    print(f"\n| {args.config}, {args.steps} steps | ms a step, each round | median | against the fastest |")
    print("|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {name} | {rounds} | {median:.0f} | {median / fastest:.2f}x |")


if __name__ == "__main__":
    main()
