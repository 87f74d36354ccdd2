"""Running a config: one training step timed in this process (`step_timer`), a whole `train.py` run
in its own (`run_train_py`, `train`), and the windows a model is scored on afterwards."""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.flop_counter import FlopCounterMode

from minigpt.model import GPT, GPTConfig
from minigpt.training.config import OptimConfig
from minigpt.training.loss import next_token_loss
from minigpt.training.optim import build_optimizer
from minigpt.training.precision import resolve_precision

from .configs import ROOT, current, ema_decay, precision, section


def log(message: str) -> None:
    """A progress line on stderr, apart from the tables the scripts print on stdout."""
    print(message, file=sys.stderr, flush=True)


def step_timer(config: dict[str, Any], extra: dict[str, Any], vocab_size: int, compiled: bool = False) -> Any:
    """A function that runs one training step of the variant and returns its seconds (with the
    weight average's update after the optimizer's step, where the variant keeps one). Its
    `fastest` dict keeps the fastest forward+backward and optimizer part (clipping, the step, the
    average) seen. `compiled`: the blocks through `torch.compile`, as `--model.compile true` runs
    them (the LM head and the loss stay eager); the first call compiles."""
    vocab_size = int(extra.get("data.config.vocab_size", vocab_size))  # a variant's own vocabulary
    gpt = GPT(GPTConfig(**{**section(config, extra, "gpt"), "vocab_size": vocab_size}))
    features = torch.compile(gpt.features) if compiled else gpt.features
    optimizer = build_optimizer(gpt, OptimConfig(**section(config, extra, "optim")))
    decay = ema_decay(config, extra)
    average = None
    if decay is not None:  # what EMAWeights does after each step
        average = AveragedModel(gpt, use_buffers=False, multi_avg_fn=get_ema_multi_avg_fn(decay))
    batch = int(extra.get("data.config.batch_size", current(config, "data.config.batch_size")))
    ids = torch.randint(vocab_size, (batch, gpt.config.context_length + 1), generator=torch.Generator())
    x, y = ids[:, :-1], ids[:, 1:]
    # The precision train.py trains this config in on this machine: bf16 autocast, or fp32 where
    # the CPU has no native bf16.
    bf16 = resolve_precision(precision(config), "cpu") == "bf16-mixed"

    def step(count: bool = False) -> float:
        """One step; with `count`, also the matrix products' GFLOP of each part into `gflop`."""
        counters = [FlopCounterMode(display=False) if count else contextlib.nullcontext() for _ in range(2)]
        start = time.perf_counter()
        with counters[0]:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = next_token_loss(gpt.lm_head(features(x)), y)
            loss.backward()
        backward = time.perf_counter()
        with counters[1]:
            torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if average is not None:
                average.update_parameters(gpt)
        end = time.perf_counter()
        if count:
            for part, counter in zip(("forward+backward", "optimizer"), counters, strict=True):
                step.gflop[part] = counter.get_total_flops() / 1e9
        # The fastest of each part seen so far: where a step's time goes (speed_check --phases).
        for part, seconds in (("forward+backward", backward - start), ("optimizer", end - backward)):
            step.fastest[part] = min(step.fastest.get(part, float("inf")), seconds)
        return end - start

    step.fastest = {}  # type: ignore[attr-defined]
    step.gflop = {}  # type: ignore[attr-defined]
    return step


def run_train_py(configs: list[str], extra: list[str], run_dir: Path, cwd: Path) -> list[dict[str, str]]:
    """One `train.py` run with `configs` laid over each other and `extra` overrides, its output in
    `run_dir`, wandb off and no progress bar; the rows of its CSV log. A failed run ends the script
    with one line naming its log."""
    command = [sys.executable, str(ROOT / "train.py")]
    for config in configs:
        command += ["--config", config]
    command += [
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.enable_progress_bar",
        "false",
        *extra,
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    log(f"[{run_dir.name}] {shlex.join(command[2:])}")
    log_file = run_dir.parent / f"{run_dir.name}.log"
    with open(log_file, "w") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    if result.returncode != 0:
        raise SystemExit(f"error: train.py exited {result.returncode} for {run_dir.name}; see {log_file}")
    with open(run_dir / "csv" / "version_0" / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def train(args: argparse.Namespace, work: Path, name: str, extra: list[str]) -> dict[str, float]:
    """One train.py run; its steps, the last validation loss it logged (nats per token and bits
    per byte) and every validation loss on the way."""
    configs = [args.config, *([args.over] if args.over else [])]
    data = ["--data.config.source", args.source, "--data.config.cache_dir", str(work / "data")]
    rows = run_train_py(configs, [*data, *extra], work / name, work)
    vals = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    bpb = [float(r["val_bpb"]) for r in rows if r.get("val_bpb")]
    return {
        "steps": max(int(r["step"]) for r in rows) + 1,
        "val_loss": vals[-1],
        "curve": vals,
        "val_bpb": bpb[-1] if bpb else float("nan"),
    }


def windows(ids: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every non-overlapping (input, target) window of `ids`, each (N, context)."""
    n = (len(ids) - 1) // context
    data = torch.from_numpy(np.asarray(ids[: n * context + 1], dtype=np.int64))
    return data[:-1].view(n, context), data[1:].view(n, context)
