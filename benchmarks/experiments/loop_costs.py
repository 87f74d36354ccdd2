#!/usr/bin/env python
"""Where the loop's cost per step goes, two ways:

    python benchmarks/experiments/loop_costs.py empty    # Lightning's loop around an empty step
    python benchmarks/experiments/loop_costs.py split    # train.py at the micro shape, its parts timed
    python benchmarks/experiments/loop_costs.py log      # one self.log call, with and without the wrapper
    python benchmarks/experiments/loop_costs.py gaps     # train.py's micro step as a timeline of its parts

`empty` fits a one-parameter module whose step does nothing, with 15 callbacks that do nothing,
for 3,000 steps, four ways taking turns in fresh processes: automatic or manual optimization, with
Lightning's default profiler or `QuietProfiler`; it prints the milliseconds a step from step 50 on.
`split` runs train.py in this process at step_overhead.py's micro shape in fp32 with the functions
that make up a step wrapped in timers, and prints each one's milliseconds a step (wrapped calls
nest: the training step holds the backward, which holds the callbacks' backward hooks).
`log` times `self.log` in a step that does nothing else (four values a step, 2,000 steps), in
fresh processes taking turns, with `logged_values_stay_put` installed and without it.
`gaps` runs train.py as `split` does and notes the time as each part of a step begins and ends:
the step's own work (forward, backward, clipping, the optimizer's arithmetic, the weight average),
Lightning's batch (fetching, moving to the device, the training step) and each callback hook. It
prints the milliseconds a step between each pair of marks that follow one another, from step 100
on: the spans between the work's marks are what the loop adds, and the hooks' marks say where.
"""

from __future__ import annotations

import collections
import functools
import itertools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARKS))

STEPS = 3000
WAYS = [("automatic", "default"), ("manual", "default"), ("automatic", "quiet"), ("manual", "quiet")]


def empty(optimization: str, profiler: str) -> float:
    """Milliseconds a step of Lightning's loop around a step that does nothing."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    from minigpt.training.profiler import QuietProfiler

    class Nothing(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.automatic_optimization = optimization == "automatic"

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if self.automatic_optimization:
                return (self.w * 1.0).sum()
            self.optimizers().step()
            return None

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD([self.w], lr=0.0)

    class Ends(L.Callback):
        def __init__(self) -> None:
            self.at: list[float] = []

        def on_train_batch_end(self, *unused: Any) -> None:
            self.at.append(time.perf_counter())

    ends = Ends()
    trainer = L.Trainer(
        accelerator="cpu", max_steps=STEPS, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ends] + [L.Callback() for _ in range(15)],
        profiler=QuietProfiler() if profiler == "quiet" else None,
    )  # fmt: skip
    batches = [torch.zeros(1) for _ in range(STEPS)]
    trainer.fit(Nothing(), DataLoader(batches, batch_size=None))
    return (ends.at[-1] - ends.at[49]) / (len(ends.at) - 50) * 1e3


def log_call(stays_put: bool) -> float:
    """Microseconds of one `self.log` call in a step that does nothing else."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    from minigpt.training.lightning_internals import logged_values_stay_put
    from minigpt.training.profiler import QuietProfiler

    if stays_put:
        logged_values_stay_put()
    spent = [0.0]

    class Logs(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            self.optimizers().step()  # a step, which max_steps counts
            start = time.perf_counter()
            for name in ("a", "b", "c", "d"):
                self.log(name, torch.tensor(1.5))
            spent[0] += time.perf_counter() - start

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD([self.w], lr=0.0)

    trainer = L.Trainer(
        accelerator="cpu", max_steps=2000, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, profiler=QuietProfiler(),
    )  # fmt: skip
    trainer.fit(Logs(), DataLoader([torch.zeros(1)] * 2000, batch_size=None))
    return spent[0] / (2000 * 4) * 1e6


def split() -> None:
    import torch
    from lightning.pytorch.core.module import LightningModule
    from lightning.pytorch.loops import training_epoch_loop
    from lightning.pytorch.trainer import call

    from minigpt.cli.train import train_main
    from minigpt.model import GPT
    from minigpt.training.callbacks.averaging import MovingAverage
    from minigpt.training.lit import LitGPT
    from step_overhead import SHAPES, train_args

    spent: collections.Counter[str] = collections.Counter()

    def timed(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - start

        setattr(owner, name, wrapper)

    timed(training_epoch_loop._TrainingEpochLoop, "advance", "Lightning's whole batch (advance)")
    timed(LitGPT, "training_step", "LitGPT.training_step")
    timed(GPT, "forward", "the forward pass")
    timed(LightningModule, "manual_backward", "the backward pass, with its hooks")
    timed(torch.nn.utils, "clip_grad_norm_", "clipping")
    timed(MovingAverage, "update_parameters", "the weight average")
    timed(LightningModule, "log", "self.log")
    timed(call, "_call_callback_hooks", "every callback hook")
    steps = 1200
    folder = Path(__import__("tempfile").mkdtemp())
    args = train_args(SHAPES["micro"], steps, ["--trainer.precision", "32-true"], folder / "run")
    train_main([*args, "--trainer.enable_progress_bar", "false"])
    for label, seconds in spent.most_common():
        print(f"| {label} | {seconds / steps * 1e3:.3f} ms |")


def gaps() -> None:
    import torch
    from lightning.pytorch.loops import fetchers, training_epoch_loop
    from lightning.pytorch.strategies import Strategy
    from lightning.pytorch.trainer import call

    from minigpt.cli import train
    from minigpt.model import GPT
    from minigpt.training.callbacks.averaging import MovingAverage
    from minigpt.training.lit import LitGPT
    from step_overhead import SHAPES, train_args

    marks: list[tuple[str, float]] = []

    def marked(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            marks.append((f"{label} begins", time.perf_counter()))
            try:
                return original(*args, **kwargs)
            finally:
                marks.append((f"{label} ends", time.perf_counter()))

        setattr(owner, name, wrapper)

    for owner, name, label in [
        (GPT, "forward", "forward"), (torch.autograd, "backward", "backward"),
        (torch.nn.utils, "clip_grad_norm_", "clipping"),
        (sys.modules["torch.optim.adam"], "adam", "AdamW's arithmetic"),
        (MovingAverage, "update_parameters", "weight average"),
        (fetchers._PrefetchDataFetcher, "__next__", "fetch"), (Strategy, "batch_to_device", "to device"),
        (LitGPT, "training_step", "training_step"),
        (training_epoch_loop._TrainingEpochLoop, "on_advance_end", "loop's batch end"),
    ]:  # fmt: skip
        marked(owner, name, label)
    install = train.hooks_reach_listeners_only

    def install_then_mark(quiet: type) -> None:  # train.py installs its hook calls: mark those
        install(quiet)
        calls = call._call_callback_hooks

        def hooks(trainer: Any, hook: str, *args: Any, **kwargs: Any) -> None:
            marks.append((f"{hook} begins", time.perf_counter()))
            calls(trainer, hook, *args, **kwargs)
            marks.append((f"{hook} ends", time.perf_counter()))

        call._call_callback_hooks = hooks

    train.hooks_reach_listeners_only = install_then_mark
    steps = 1500
    folder = Path(__import__("tempfile").mkdtemp())
    args = train_args(SHAPES["micro"], steps, ["--trainer.precision", "32-true"], folder / "run")
    train.train_main([*args, "--trainer.enable_progress_bar", "false"])
    first = [i for i, (label, _) in enumerate(marks) if label == "forward begins"][100]
    spans: collections.Counter[tuple[str, str]] = collections.Counter()
    times: collections.Counter[tuple[str, str]] = collections.Counter()
    for (label, at), (then, later) in itertools.pairwise(marks[first:]):
        spans[label, then] += later - at
        times[label, then] += 1
    counted = steps - 100
    every = {span: seconds for span, seconds in spans.items() if times[span] >= counted - 1}  # not the end's
    print("| from | to | ms a step |\n|---|---|---|")
    for (label, then), seconds in sorted(every.items(), key=lambda item: -item[1]):
        if seconds / counted * 1e3 >= 0.005:
            print(f"| {label} | {then} | {seconds / counted * 1e3:.3f} |")
    print(f"| every span that runs each step | | {sum(every.values()) / counted * 1e3:.3f} |")


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "empty"
    if what == "split":
        split()
    elif what == "gaps":
        gaps()
    elif what == "log-one":
        print(log_call(sys.argv[2] == "on"))
    elif what == "log":
        print("| self.log | us a call (3 rounds) |\n|---|---|")
        times: dict[str, list[float]] = {"with logged_values_stay_put": [], "without": []}
        for r in range(3):
            for way in ("on", "off") if r % 2 == 0 else ("off", "on"):
                out = subprocess.run(
                    [sys.executable, __file__, "log-one", way], capture_output=True, text=True
                )
                times["with logged_values_stay_put" if way == "on" else "without"].append(
                    float(out.stdout.strip().splitlines()[-1])
                )
        for way, values in times.items():
            print(f"| {way} | {', '.join(f'{v:.0f}' for v in values)} |")
    elif what == "empty-one":
        print(empty(sys.argv[2], sys.argv[3]))
    else:
        print("| optimization | profiler | ms a step (3 rounds) |\n|---|---|---|")
        times: dict[tuple[str, str], list[float]] = {way: [] for way in WAYS}
        for r in range(3):
            for way in WAYS[r % len(WAYS) :] + WAYS[: r % len(WAYS)]:
                out = subprocess.run(
                    [sys.executable, __file__, "empty-one", *way], capture_output=True, text=True
                )
                times[way].append(float(out.stdout.strip().splitlines()[-1]))
        for way, values in times.items():
            print(f"| {way[0]} | {way[1]} | {', '.join(f'{v:.3f}' for v in values)} |")


if __name__ == "__main__":
    main()
