#!/usr/bin/env python
"""What a `train.py` run spends besides its steps: the wall time from the command to its exit
against the time of its training steps alone, and where the rest goes (starting, validations with
what follows them, ending).

By default the run is nanoGPT's README "baby GPT" through char.yaml: 4 layers x 4 heads x 128 wide,
context 64, batches of 12, 2,000 steps on tiny Shakespeare, a validation every 500 steps on
nanoGPT's budget for that command (`--eval_iters=20`: 20 batches, 15,360 tokens):

    python benchmarks/run_overhead.py --text tinyshakespeare.txt
    python benchmarks/run_overhead.py --text tinyshakespeare.txt -- --data.config.val_tokens 131072
    python benchmarks/run_overhead.py --repeat 2 --config small.yaml --text ""   # another run

Settings after `--` go to train.py as they are. Runs start from the repository root, so the
prepared data is cached (data_cache/) after the first; `--repeat 2` shows both. The steps' time is
the time from the end of one step to the end of the next, summed, less the validations between
them and what runs when each ends (samples, attention maps, checkpoints): data loading, forward,
backward, the optimizer and the loop's own bookkeeping. "Ending" is what follows the last step
and its validation: waiting for the last sample and maps, the report, closing the loggers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
BABY = ["--config", "char.yaml", "--config", str(BENCHMARKS / "baby.yaml")]
BABY += ["--trainer.max_steps", "2000", "--trainer.val_check_interval", "500"]
BABY += ["--data.config.val_tokens", "15360"]  # nanoGPT's eval_iters=20: 20 batches of 12 x 64


def one_run(configs: list[str], text: str, extra: list[str], folder: Path) -> dict[str, float]:
    events = folder / "timeline.jsonl"
    command = [sys.executable, str(ROOT / "train.py"), *configs]
    if text:
        command += ["--data.config.source", str(Path(text).resolve())]
    command += ["--trainer.default_root_dir", str(folder / "run"), "--trainer.enable_progress_bar", "false"]
    command += ["--trainer.callbacks+=suite.timeline.Timeline", f"--trainer.callbacks.path={events}", *extra]
    env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCHMARKS), env.get("PYTHONPATH")]))
    start = time.time()
    env["MINIGPT_T0"] = repr(start)
    # From the repository root, as a user runs it: the prepared data is cached there after the first run.
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    total = time.time() - start
    if result.returncode != 0:
        raise SystemExit(f"error: train.py exited {result.returncode}:\n{result.stderr[-3000:]}")
    lines = [json.loads(line) for line in events.read_text(encoding="utf-8").splitlines() if line]
    at = {e["event"]: e["s"] for e in lines}  # the last of each kind
    starts = [e["s"] for e in lines if e["event"] == "validation_start"]
    ends = [e["s"] for e in lines if e["event"] == "validation"]
    validating = sum(end - begin for begin, end in zip(starts, ends, strict=True))
    steps = next(e["steps_s"] for e in lines if e["event"] == "train_end")
    return {
        "total": total,
        "starting": at["train_start"],
        "steps": steps,
        "validations": len(ends),
        "validating": validating,
        "ending": total - at["train_start"] - steps - validating,
    }


def main() -> None:
    argv = sys.argv[1:]
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", default="", help="the training text (--data.config.source); empty: the config's")
    p.add_argument("--config", action="append", help="configs instead of the baby run's (repeatable)")
    p.add_argument("--repeat", type=int, default=1, help="runs, one after the other")
    args = p.parse_args(own)
    configs = [c for name in args.config for c in ("--config", name)] if args.config else BABY
    print(f"train.py {' '.join(configs + extra)}", file=sys.stderr)
    rows = []
    for r in range(args.repeat):
        with tempfile.TemporaryDirectory() as folder:
            rows.append(one_run(configs, args.text, extra, Path(folder)))
        print(f"run {r + 1}: {rows[-1]['total']:.1f} s", file=sys.stderr)
    print("| run | command to exit | steps alone | ratio | starting | validations | ending |")
    print("|---|---|---|---|---|---|---|")
    for r, row in enumerate(rows, 1):
        print(
            f"| {r} | {row['total']:.1f} s | {row['steps']:.1f} s | **{row['total'] / row['steps']:.3f}x** "
            f"| {row['starting']:.1f} s | {row['validations']:.0f} in {row['validating']:.1f} s "
            f"| {row['ending']:.1f} s |"
        )


if __name__ == "__main__":
    main()
