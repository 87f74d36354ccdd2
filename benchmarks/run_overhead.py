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
    python benchmarks/run_overhead.py --text tinyshakespeare.txt --nanogpt ~/nanoGPT --repeat 2

Settings after `--` go to train.py as they are. Runs start from the repository root, so the
prepared data is cached (data_cache/) after the first; `--repeat 2` shows both. The steps' time is
the time from the end of one step to the end of the next, summed, less the validations between
them and what runs when each ends (samples, attention maps, checkpoints): data loading, forward,
backward, the optimizer and the loop's own bookkeeping. "Ending" is what follows the last step
and its validation: waiting for the last sample and maps, the report, closing the loggers.

With `--nanogpt`, a checkout of nanoGPT, each repeat also runs nanoGPT's own `train.py` on the
same text with its README's baby command (`--device=cpu --compile=False --eval_iters=20
--log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0`, evaluating every 250 steps as its config
says), the two taking turns at going first. Its files are copied into a temporary folder with the
characters of `--text` split 90/10 as its `prepare.py` splits them, so the checkout is left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
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
    best = re.search(r"best val loss ([0-9.]+)", result.stdout + result.stderr)
    return {
        "val": float(best.group(1)) if best else float("nan"),
        "total": total,
        "starting": at["train_start"],
        "steps": steps,
        "validations": len(ends),
        "validating": validating,
        "ending": total - at["train_start"] - steps - validating,
    }


NANOGPT_BABY = [
    "config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
    "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
    "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0",
]  # fmt: skip
"""nanoGPT's README command for a CPU ("baby GPT"), from the root of its checkout."""


def nanogpt_run(checkout: Path, text: str, folder: Path) -> dict[str, float]:
    """nanoGPT's baby command on the characters of `text`: its wall time and last validation loss."""
    import pickle

    import numpy as np

    for name in ("train.py", "model.py", "configurator.py", "config"):
        source = checkout / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, folder / name)
    data = Path(text).read_text(encoding="utf-8")
    chars = sorted(set(data))
    ids = {c: i for i, c in enumerate(chars)}
    prepared = folder / "data" / "shakespeare_char"
    prepared.mkdir(parents=True)
    cut = int(len(data) * 0.9)
    for split, part in (("train", data[:cut]), ("val", data[cut:])):
        np.array([ids[c] for c in part], dtype=np.uint16).tofile(prepared / f"{split}.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": ids}
    (prepared / "meta.pkl").write_bytes(pickle.dumps(meta))
    start = time.time()
    result = subprocess.run(
        [sys.executable, "train.py", *NANOGPT_BABY], cwd=folder, capture_output=True, text=True
    )
    total = time.time() - start
    if result.returncode != 0:
        raise SystemExit(f"error: nanoGPT's train.py exited {result.returncode}:\n{result.stderr[-3000:]}")
    last = [line for line in result.stdout.splitlines() if "val loss" in line][-1]
    return {"total": total, "val": float(last.rsplit(" ", 1)[1])}


def main() -> None:
    argv = sys.argv[1:]
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", default="", help="the training text (--data.config.source); empty: the config's")
    p.add_argument("--config", action="append", help="configs instead of the baby run's (repeatable)")
    p.add_argument("--repeat", type=int, default=1, help="runs, one after the other")
    p.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout: also run its baby command, taking turns")
    args = p.parse_args(own)
    if args.nanogpt and not args.text:
        raise SystemExit("error: --nanogpt needs --text, the characters both train on")
    configs = [c for name in args.config for c in ("--config", name)] if args.config else BABY
    print(f"train.py {' '.join(configs + extra)}", file=sys.stderr)
    rows, theirs = [], []
    for r in range(args.repeat):
        for ours_now in [True, False] if r % 2 == 0 else [False, True]:
            with tempfile.TemporaryDirectory() as folder:
                if ours_now:
                    rows.append(one_run(configs, args.text, extra, Path(folder)))
                    print(
                        f"run {r + 1}: {rows[-1]['total']:.1f} s, val loss {rows[-1]['val']:.4f}",
                        file=sys.stderr,
                    )
                elif args.nanogpt:
                    theirs.append(nanogpt_run(args.nanogpt, args.text, Path(folder)))
                    nano = theirs[-1]
                    print(
                        f"run {r + 1}, nanoGPT: {nano['total']:.1f} s, val loss {nano['val']:.4f}",
                        file=sys.stderr,
                    )
    header = (
        "| run | command to exit | steps alone | ratio | starting | validations | ending | best val loss |"
    )
    if theirs:
        header += " nanoGPT: command to exit | last val loss | ours / nanoGPT's wall |"
    print(header)
    print("|---" * (8 + 3 * bool(theirs)) + "|")
    for r, row in enumerate(rows, 1):
        line = (
            f"| {r} | {row['total']:.1f} s | {row['steps']:.1f} s | **{row['total'] / row['steps']:.3f}x** "
            f"| {row['starting']:.1f} s | {row['validations']:.0f} in {row['validating']:.1f} s "
            f"| {row['ending']:.1f} s | {row['val']:.4f} |"
        )
        if theirs:
            nano = theirs[r - 1]
            line += f" {nano['total']:.1f} s | {nano['val']:.4f} | **{row['total'] / nano['total']:.2f}x** |"
        print(line)


if __name__ == "__main__":
    main()
