#!/usr/bin/env python
"""How soon does each command answer? Its `--help`, a refusal, and its first useful output, beside
the two floors no command here can go below: `python -c "import torch"` and `python -c "import
lightning.pytorch"` (which train.py needs; the other commands need only torch).

Every figure is the median of `--repeats` fresh processes, each timed from its start to its exit,
or to the line that marks its first useful output (serve.py's "serving ... at", the end of
train.py's first step); the first process of each command is not counted, as it may write caches
(bytecode, prepared data). A command's margin over its floor is the median of paired differences:
each of its runs against a run of its floor made just before it, so that the machine's drift
between the floors and the command (a second of import time within minutes, on a cloud VM)
does not enter the margin. The commands read a tiny model and a small run folder made here, so
what is timed is the start, not the work. On a busy machine every figure grows: read each margin
over its floor, and run the script again before believing a difference of a tenth of a second.

    python benchmarks/startup.py                            # every command, ~5 minutes on 2 cores
    python benchmarks/startup.py --only train --repeats 5   # the commands whose name has "train"

train.py's first step is nanoGPT's "baby GPT" shape laid over char.yaml, as speed_check.py runs it
(`--config char.yaml --config benchmarks/baby.yaml`), with wandb off; a callback of this file
(`FirstStep`, passed with `--trainer.callbacks+=startup.FirstStep`) prints a line when the first
batch reaches the model (the end of start-up) and another when the step ends.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

ROOT = Path(__file__).resolve().parents[1]
FIRST_BATCH = "startup.py: first batch in"
"""The line FirstStep prints when train.py's first batch reaches the model: all before it is start-up."""
FIRST_STEP = "startup.py: first step done"
"""The line FirstStep prints when train.py's first training step has ended."""
PROBE = "startup.FirstStep"
"""This file's callback, as train.py finds it (this folder is put on the PYTHONPATH)."""
SERVING = "serving "
"""The start of serve.py's line once it listens."""
PROMPT = "ROMEO:\nWhat light through yonder window breaks?"
TEXT = "\n\n".join(
    [
        "ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.",
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name.",
    ]
    * 20
)
"""The text of the tiny model's vocabulary and of evaluate.py's --text."""


class FirstStep(Callback):
    """Prints FIRST_BATCH and FIRST_STEP around train.py's first training step."""

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == 0:
            print(FIRST_BATCH, flush=True)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == 0:
            print(FIRST_STEP, flush=True)


@dataclass(frozen=True)
class Case:
    """One command to time."""

    name: str
    """What the table calls it."""
    args: list[str]
    """The command line after `python`."""
    floor: str | None
    """The floor it is compared with: "torch" or "lightning" (None: it is a floor)."""
    until: str | None = None
    """Stop the clock at the first output line holding this, and the process; None: at its exit."""
    exit_code: int = 0
    """The exit code that says it answered (2: a refusal)."""


def cases(work: Path) -> list[Case]:
    model = str(work / "tiny.safetensors")
    read = ["--checkpoint", model, "--device", "cpu"]
    prompt = ["--prompt", PROMPT]
    readers = ["generate", "export", "visualize", "report", "evaluate", "serve", "train_tokenizer"]
    baby = ["--config", "char.yaml", "--config", "benchmarks/baby.yaml", "--trainer.max_steps", "50"]
    return [
        Case("import torch", ["-c", "import torch"], None),
        Case("import lightning.pytorch", ["-c", "import lightning.pytorch"], None),
        *[Case(f"{name}.py --help", [f"{name}.py", "--help"], "torch") for name in readers],
        Case("generate.py: a token", ["generate.py", *read, *prompt, "--max_new_tokens", "1"], "torch"),
        Case(
            "export.py: a file",
            ["export.py", *read[:2], "--out", f"{work}/copy.safetensors", "--force"],
            "torch",
        ),
        Case(
            "visualize.py: maps",
            ["visualize.py", *read, *prompt, "--out", f"{work}/maps", "--force"],
            "torch",
        ),
        Case("report.py: a report", ["report.py", "--run", f"{work}/run"], "torch"),
        Case(
            "evaluate.py: bits per byte",
            ["evaluate.py", *read, "--text", f"{work}/text.txt", "--force"],
            "torch",
        ),
        Case("serve.py: listening", ["serve.py", *read, "--port", "0"], "torch", until=SERVING),
        Case("train.py --help", ["train.py", "--help"], "lightning"),
        Case("train.py --print_config", ["train.py", "--config", "char.yaml", "--print_config"], "lightning"),
        Case("train.py: no such config", ["train.py", "--config", "no-such"], "lightning", exit_code=2),
        Case(
            "train.py: unknown key",
            ["train.py", *baby[:2], "--model.gpt.n_layr", "3"],
            "lightning",
            exit_code=2,
        ),
        Case(
            "train.py: first batch in (baby)",
            ["train.py", *baby, f"--trainer.callbacks+={PROBE}"],
            "lightning",
            FIRST_BATCH,
        ),
        Case(
            "train.py: first step (baby)",
            ["train.py", *baby, f"--trainer.callbacks+={PROBE}"],
            "lightning",
            FIRST_STEP,
        ),
    ]


def make_inputs(work: Path) -> None:
    """A tiny model with a character vocabulary, the text it reads, and a run folder's CSV log."""
    from minigpt.checkpoints import save_safetensors
    from minigpt.data import CharTokenizer
    from minigpt.model import GPT, GPTConfig

    tokenizer = CharTokenizer.from_texts([TEXT, PROMPT])
    config = GPTConfig(vocab_size=tokenizer.n_vocab, context_length=64, n_layer=2, n_head=2, n_embd=64)
    save_safetensors(GPT(config), tokenizer, work / "tiny.safetensors")
    (work / "text.txt").write_text(TEXT, encoding="utf-8")
    log = work / "run" / "csv" / "version_0"
    log.mkdir(parents=True)
    rows = [f"{s},{4.0 - s / 100:.3f},,{1e-3 * min(1, s / 10):.6f}" for s in range(0, 200, 10)]
    rows.append("199,,2.5,")
    (log / "metrics.csv").write_text("step,train_loss,val_loss,lr-AdamW\n" + "\n".join(rows) + "\n")


def time_once(case: Case, work: Path, run: int) -> float:
    """Seconds from the start of `case`'s process to its exit, or to its `until` line."""
    args = list(case.args)
    if "train.py" in args and case.until is not None:
        args += ["--trainer.default_root_dir", str(work / f"train-{run}")]
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if case.until is not None and case.until in line:
            elapsed = time.perf_counter() - start
            proc.kill()
            proc.wait()
            return elapsed
        output.append(line)
    proc.wait()
    elapsed = time.perf_counter() - start
    if case.until is not None or proc.returncode != case.exit_code:
        tail = "".join(output[-5:])
        raise SystemExit(f"error: {case.name} exited {proc.returncode} without its answer:\n{tail}")
    return elapsed


IN_PROCESS = """
import contextlib, io, sys, time
import lightning.pytorch
start = time.perf_counter()
from minigpt.cli.train import train_main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        train_main(sys.argv[1:])
    except SystemExit:
        pass
print(time.perf_counter() - start)
"""
"""A process that imports Lightning, then times train.py's work on its arguments from there:
importing the project and parsing, printing or refusing. The margin over the floor with no
floor to subtract, which on a machine whose import times drift is the steadier figure."""


def in_process(args: list[str], repeats: int) -> float:
    """Median seconds train.py takes with `args` once Lightning is imported (`IN_PROCESS`)."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    times = []
    for _ in range(repeats + 1):
        done = subprocess.run(
            [sys.executable, "-c", IN_PROCESS, *args], cwd=ROOT, env=env, capture_output=True, text=True
        )
        times.append(float(done.stdout.strip().splitlines()[-1]))
    return statistics.median(times[1:])


def table(results: dict[str, float], margins: dict[str, float], all_cases: list[Case]) -> list[str]:
    lines = [
        "| command | seconds | over its floor (paired) |",
        "|---|---:|---:|",
    ]
    for case in all_cases:
        if case.name not in results:
            continue
        margin = f"{margins[case.name]:+.2f} over {case.floor}" if case.name in margins else ""
        lines.append(f"| {case.name} | {results[case.name]:.2f} | {margin} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed processes per command (default 3)")
    parser.add_argument(
        "--only", default="", help="time only the commands whose name contains this (the floors always)"
    )
    args = parser.parse_args()
    from minigpt.training.precision import cpu_description

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_inputs(work)
        chosen = [c for c in cases(work) if c.floor is None or args.only in c.name]
        floor_case = {c.name: c for c in chosen if c.floor is None}
        floor_of = {"torch": floor_case["import torch"], "lightning": floor_case["import lightning.pytorch"]}
        results: dict[str, float] = {}
        margins: dict[str, float] = {}
        for case in chosen:
            time_once(case, work, 0)  # not counted: it may write caches
            times, over = [], []
            for run in range(1, args.repeats + 1):
                # Each run paired with its floor, timed just before it: the machine's speed drifts
                # by more within minutes than the margins this table is for.
                floor = time_once(floor_of[case.floor], work, run) if case.floor else 0.0
                times.append(time_once(case, work, run))
                over.append(times[-1] - floor)
            results[case.name] = statistics.median(times)
            if case.floor:
                margins[case.name] = statistics.median(over)
            spread = ", ".join(f"{t:.2f}" for t in times)
            print(f"{case.name}: {results[case.name]:.2f} s (runs: {spread})", file=sys.stderr)
        after = {}
        if "train" in args.only or not args.only:
            for name, argv in (
                ("--print_config", ["--config", "char.yaml", "--print_config"]),
                ("no such config", ["--config", "no-such"]),
                ("unknown key", ["--config", "char.yaml", "--model.gpt.n_layr", "3"]),
            ):
                after[name] = in_process(argv, args.repeats)
    print(f"\nStart-up on {cpu_description()}, {os.cpu_count()} cores; median of {args.repeats} runs:\n")
    print("\n".join(table(results, margins, chosen)))
    if after:
        print("\ntrain.py's work once `import lightning.pytorch` is done, in the same process (median):\n")
        print("| train.py | seconds after the import |\n|---|---:|")
        print("\n".join(f"| {name} | {seconds:.2f} |" for name, seconds in after.items()))


if __name__ == "__main__":
    main()
