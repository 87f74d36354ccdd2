#!/usr/bin/env python
"""Every GPU figure the project reports, in one prepared run of a few minutes on one CUDA GPU,
written as one table naming the device.

Installs nothing and reaches no network. Phases (`--phases`, in this order by default):

- `step`: the 124M training step, compiled, GPT-2's recipe (`gpt2-124m.yaml`) and small.yaml's
  (`modern-124m.yaml`), each with AdamW, Muon and Muon over polar_express 3
  (`benchmarks/gpu_train.py --no-eager --no-peer`)
- `profile`: torch.profiler over 20 compiled steps at 124M (GPT-2's recipe, AdamW) of the bare
  step and of `train.py` with the shipped callbacks and with none (`suite.profiling`): wall time
  against the GPU's busy time, the gaps where it waited for the host and what the host was doing,
  the synchronisations, with Dynamo's recompiles and graph breaks in the logs
- `loop`: `train.py` itself at 124M with the shipped callbacks, compiled, on GPT-2 tokens of the
  text: GPT-2's recipe with AdamW, small.yaml's with Muon; its steady tokens/s against the bare
  step's from `step`
- `char`: `train.py --config char.yaml` on the text (tiny Shakespeare), compiled: the best val
  loss, and the seconds from the command to it and to val <= 1.46
- `small`: `train.py --config small.yaml` on the plays, compiled: the best val bits per byte and
  the seconds from the command to it
- `char-eager`, `small-eager`: the same two runs as a user types them, eager (`char-eager`
  also profiles 20 steps in its middle, which costs it a second or two)

Each phase runs in its own process with a time limit; a phase that fails or runs out of time is
reported as such and the others still run. The table is rewritten after every phase, so what a
cut-short run measured is kept. Before a lease, cache GPT-2's ranks and the plays where the run
will read them (`MINIGPT_CACHE`), and carry the text:

    MINIGPT_CACHE=.lease/cache python -c "from minigpt.data import load_gpt2_encoding; load_gpt2_encoding()"
    python benchmarks/gpu_check.py --text .lease/tinyshakespeare.txt --out "$OUT"    # on the GPU
    python benchmarks/gpu_check.py --smoke --phases loop,char,small --text tinyshakespeare.txt  # CPU

`--smoke` runs each `train.py` phase for a few steps at whatever device there is, eager: a check
of this script's plumbing on a machine without a GPU, with no figure worth keeping.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
NO_WANDB = ["--loggers.WandbLogger", "false"]
"""Every run here logs to CSV alone: wandb may not be installed on the GPU machine."""
TIMELINE = "suite.timeline.Timeline"
SMOKE = [
    "--trainer.accelerator", "auto", "--trainer.devices", "1", "--trainer.strategy", "auto",
    "--model.gpt.n_layer", "2", "--model.gpt.n_embd", "64", "--model.gpt.n_head", "2",
    "--model.gpt.context_length", "64", "--data.config.batch_size", "4", "--data.config.val_tokens", "2048",
]  # fmt: skip
"""A `--smoke` run's settings: any device, a model and batches too small to take time."""
BARE_STEP: dict[tuple[str, str], float] = {}
"""Tokens/s of the compiled bare step by (config, optimizer), as the step phase measured it: what
the loop phase compares train.py with."""
CHAR_TARGET = 1.46
"""nanoGPT's shakespeare_char best validation loss, rounded (1.464 at its step 1,750)."""


@dataclass
class Phase:
    """One part of the check: its rows for the table, or why it has none."""

    name: str
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""
    seconds: float = 0.0


def run(command: list[str], limit: float, out: Path, env: dict[str, str] | None = None) -> tuple[int, float]:
    """Run `command` from the repository root, its output into `out`; (exit code, seconds)."""
    full = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCHMARKS), full.get("PYTHONPATH")]))
    start = time.time()
    full["MINIGPT_T0"] = repr(start)
    with open(out, "w", encoding="utf-8") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        try:
            code = subprocess.run(
                command, cwd=ROOT, env=full, stdout=log, stderr=subprocess.STDOUT, timeout=limit
            ).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, time.time() - start


def failure(code: int, seconds: float, log: Path) -> str:
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    last = lines[-1][:200] if lines else ""
    if code == 124:
        return f"ran out of its time ({seconds:.0f} s); last line: {last}"
    return f"exit {code} after {seconds:.0f} s: {last}"


# -- phases --------------------------------------------------------------------------------------


def step_phase(args: argparse.Namespace, out: Path) -> Phase:
    phase = Phase("step")
    for config in ("gpt2-124m.yaml", "modern-124m.yaml"):
        report = out / f"step-{config.removesuffix('.yaml')}.md"
        command = [sys.executable, str(BENCHMARKS / "gpu_train.py"), "--config", config]
        command += ["--no-eager", "--no-peer", "--warmup", "3", "--steps", "15", "--out", str(report)]
        log = out / f"step-{config.removesuffix('.yaml')}.log"
        code, seconds = run(command, args.limit, log)
        phase.seconds += seconds
        if code != 0:
            phase.note += f"{config}: {failure(code, seconds, log)}. "
            continue
        read_step_report(phase, config, report)
    return phase


def read_step_report(phase: Phase, config: str, report: Path) -> None:
    """`gpu_train.py`'s rows for our model into `phase` and `BARE_STEP`."""
    for line in report.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| minigpt"):  # model, compile, optimizer, ms/step, tokens/s, MFU, ...
            phase.rows.append(
                [f"124M step, {config}", cells[2], f"{cells[3]} ms", f"{cells[4]} tokens/s", cells[5]]
            )
            BARE_STEP[(config, cells[2])] = float(cells[4].replace(",", ""))
        elif match := re.search(r"bf16 peak measured [0-9,.]+ TFLOP/s", line):
            phase.note += f"{config}: {match.group(0)}. "


def train_command(*options: str) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), *options, *NO_WANDB]


def csv_rows(run_dir: Path) -> list[dict[str, str]]:
    files = sorted(run_dir.glob("**/metrics.csv"))
    if not files:
        return []
    with open(files[-1], encoding="utf-8") as f:
        return list(csv.DictReader(f))


def timeline(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def loop_options(args: argparse.Namespace, run_dir: Path, steps: int) -> list[str]:
    """`train.py`'s options of a loop run at 124M on GPT-2 tokens of the text, one optimizer step
    per batch as the bare step takes them, no validation and no checkpoint."""
    options = [
        "--data.config.source", str(args.text), "--data.config.streaming", "false",
        "--data.config.tokenizer", "gpt2", "--data.config.num_workers", "2",
        "--data.config.subset", "null", "--data.config.max_tokens", "null",
        "--data.config.val_fraction", "0.1",
        "--trainer.default_root_dir", str(run_dir), "--trainer.max_steps", str(steps),
        "--trainer.limit_val_batches", "0", "--trainer.log_every_n_steps", "2" if args.smoke else "10",
        "--tokens_per_step", "256" if args.smoke else "12288",
        "--trainer.enable_progress_bar", "false",
        "--callbacks.ModelCheckpoint", "false", "--trainer.enable_checkpointing", "false",
    ]  # fmt: skip
    return options + (SMOKE if args.smoke else ["--model.compile", "true"])


PROFILE_FIGURES = [
    ("timed_ms_per_step", "ms a step, timed"),
    ("busy_ms", "GPU busy, ms"),
    ("gaps_ms", "GPU waiting, ms"),
    ("gaps_per_step", "waits"),
    ("sync_ms_per_step", "host in syncs, ms"),
    ("kernels_per_step", "kernels"),
]


def profile_phase(args: argparse.Namespace, out: Path) -> Phase:
    phase = Phase("profile")
    folder = out / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    debug = {"TORCH_LOGS": "recompiles,graph_breaks"}
    bare = (("gpt2-124m.yaml", "adamw"), ("modern-124m.yaml", "muon"))
    for config, optimizer in () if args.smoke or args.bare_reports else bare:
        tag = config.removesuffix(".yaml")
        command = [sys.executable, str(BENCHMARKS / "gpu_train.py"), "--config", config, "--no-eager"]
        command += ["--no-peer", "--optimizers", optimizer, "--warmup", "10", "--steps", "20"]
        command += ["--profile", str(folder), "--out", str(out / f"step-{tag}.md")]
        log = out / f"profile-bare-{tag}.log"
        code, seconds = run(command, args.limit, log, debug)
        phase.seconds += seconds
        if code != 0:
            phase.note += f"bare {config}: {failure(code, seconds, log)}. "
        else:
            read_step_report(phase, config, out / f"step-{tag}.md")
    start, steps = (3, 3) if args.smoke else (30, 20)
    profiler = [
        "--trainer.callbacks+=suite.profiling.ProfileSteps", f"--trainer.callbacks.start={start}",
        f"--trainer.callbacks.steps={steps}",
    ]  # fmt: skip
    for name, extra in (
        ("shipped", []),
        ("none", ["--trainer.callbacks", "[]", "--loggers.CSVLogger", "false"]),
    ):
        report = folder / f"train-{name}"
        options = [
            "--config",
            "gpt2-124m.yaml",
            *loop_options(args, out / f"profile-{name}", start + steps + 4),
        ]
        options += (
            extra
            + profiler
            + [f"--trainer.callbacks.path={report}", f"--trainer.callbacks.label=train.py, {name} callbacks"]
        )
        log = out / f"profile-{name}.log"
        command = train_command(*options)
        code, seconds = run(command, args.limit, log, debug)
        phase.seconds += seconds
        if code != 0:
            phase.note += f"train.py, {name} callbacks: {failure(code, seconds, log)}. "
    for report in sorted(folder.glob("*.json")):
        figures = json.loads(report.read_text(encoding="utf-8"))
        cells = ", ".join(f"{label} {figures[key]:.2f}" for key, label in PROFILE_FIGURES)
        syncs = ", ".join(f"{k} {v:.2f}" for k, v in figures["syncs_per_step"].items()) or "none"
        phase.rows.append(
            [
                f"profile: {figures['label']}",
                "yes" if not args.smoke else "no",
                cells,
                f"syncs a step: {syncs}",
                "",
            ]
        )
    return phase


def loop_phase(args: argparse.Namespace, out: Path) -> Phase:
    phase = Phase("loop")
    steps = 8 if args.smoke else 80
    runs = {  # name: (the bare step it compares with, the configs)
        "GPT-2's recipe, AdamW": (("gpt2-124m.yaml", "adamw"), ["--config", "gpt2-124m.yaml"]),
        "small.yaml's recipe, Muon": (("modern-124m.yaml", "muon"), [
            "--config", "gpt2-124m.yaml", "--config", str(BENCHMARKS / "modern-124m.yaml"),
            "--model.optim.optimizer", "muon",
        ]),
    }  # fmt: skip
    for index, (name, (bare, configs)) in enumerate(runs.items()):
        run_dir = out / f"loop-{index}"
        options = [*configs, *loop_options(args, run_dir, steps)]
        log = out / f"{run_dir.name}.log"
        code, seconds = run(train_command(*options), args.limit, log)
        phase.seconds += seconds
        if code != 0:
            phase.note += f"{name}: {failure(code, seconds, log)}. "
            continue
        # The steady rate: the logged intervals after the first quarter (compiling, warming up).
        rates = [
            float(r["tokens_per_sec"])
            for r in csv_rows(run_dir)
            if r.get("tokens_per_sec") and int(r["step"]) >= steps // 4
        ]
        if not rates:
            phase.note += f"{name}: no tokens_per_sec logged. "
            continue
        rate = statistics.median(rates)
        batch_tokens = 4 * 64 if args.smoke else 12 * 1024
        phase.rows.append(
            [
                f"train.py loop at 124M, {name}",
                "yes" if not args.smoke else "no",
                f"{batch_tokens / rate * 1e3:.1f} ms",
                f"{rate:,.0f} tokens/s",
                f"{rate / BARE_STEP[bare]:.1%} of the bare step's rate" if bare in BARE_STEP else "",
            ]
        )
    return phase


def end_to_end(
    args: argparse.Namespace, out: Path, name: str, options: list[str], score: str, compiled: bool = True
) -> Phase:
    phase = Phase(name)
    tag = name.replace(" ", "-")
    run_dir = out / tag
    events = out / f"{tag}-timeline.jsonl"
    options = [
        *options, "--trainer.default_root_dir", str(run_dir), "--trainer.enable_progress_bar", "false",
        f"--trainer.callbacks+={TIMELINE}", f"--trainer.callbacks.path={events}",
    ]  # fmt: skip
    if args.smoke:
        options += [*SMOKE, "--trainer.max_steps", "6", "--trainer.val_check_interval", "3"]
    elif compiled:
        options += ["--model.compile", "true"]
    log = out / f"{tag}.log"
    code, seconds = run(train_command(*options), args.limit, log)
    phase.seconds = seconds
    if code != 0:
        phase.note = failure(code, seconds, log)
    validations = [e for e in timeline(events) if e["event"] == "validation" and score in e]
    first = next((e["s"] for e in timeline(events) if e["event"] == "first_step"), None)
    if not validations:
        phase.note += " no validation finished"
        return phase
    best = min(validations, key=lambda e: e[score])
    unit = "nats per character" if score == "val_loss" else "bits per byte"
    row = [
        f"{name}: best {score}",
        "yes" if compiled and not args.smoke else "no",
        f"{best[score]:.3f} {unit}",
        f"at {best['s']:.0f} s (step {best['step']})",
        "",
    ]
    phase.rows.append(row)
    if name.startswith("char.yaml"):
        reached = next((e for e in validations if e[score] <= CHAR_TARGET), None)
        when = f"at {reached['s']:.0f} s (step {reached['step']})" if reached else "not reached"
        phase.rows.append([f"char.yaml: val <= {CHAR_TARGET}", row[1], "", when, ""])
    phase.note += (
        f"{seconds:.0f} s from the command to its exit; first step done at {first:.0f} s; "
        f"validations at {', '.join(str(e['step']) for e in validations)}"
        if first is not None
        else f"{seconds:.0f} s from the command to its exit"
    )
    return phase


def char_phase(args: argparse.Namespace, out: Path) -> Phase:
    return end_to_end(
        args, out, "char.yaml", ["--config", "char.yaml", "--data.config.source", str(args.text)], "val_loss"
    )


def small_phase(args: argparse.Namespace, out: Path) -> Phase:
    return end_to_end(args, out, "small.yaml", ["--config", "small.yaml"], "val_bpb")


def char_eager_phase(args: argparse.Namespace, out: Path) -> Phase:
    at = 3 if args.smoke else 300
    profiler = [
        "--trainer.callbacks+=suite.profiling.ProfileSteps", f"--trainer.callbacks.start={at}",
        f"--trainer.callbacks.path={out / 'profile' / 'char-eager'}",
        "--trainer.callbacks.label=char.yaml, eager",
        "--trainer.callbacks.steps=2" if args.smoke else "--trainer.callbacks.steps=20",
        "--trainer.callbacks.stack_steps=1" if args.smoke else "--trainer.callbacks.stack_steps=3",
    ]  # fmt: skip
    (out / "profile").mkdir(parents=True, exist_ok=True)
    options = ["--config", "char.yaml", "--data.config.source", str(args.text), *profiler]
    return end_to_end(args, out, "char.yaml eager", options, "val_loss", compiled=False)


def small_eager_phase(args: argparse.Namespace, out: Path) -> Phase:
    return end_to_end(args, out, "small.yaml eager", ["--config", "small.yaml"], "val_bpb", compiled=False)


PHASES: dict[str, Callable[[argparse.Namespace, Path], Phase]] = {
    "profile": profile_phase,
    "step": step_phase,
    "loop": loop_phase,
    "char": char_phase,
    "small": small_phase,
    "char-eager": char_eager_phase,
    "small-eager": small_eager_phase,
}


def device() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda})"
    return f"no CUDA device ({platform.processor() or platform.machine()}), torch {torch.__version__}"


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"


def write_table(path: Path, header: str, phases: list[Phase]) -> str:
    lines = [
        header,
        "",
        "| what | compiled | per step / figure | rate / when | MFU, or against the bare step |",
        "|---|---|---|---|---|",
    ]
    for phase in phases:
        lines += ["| " + " | ".join(row) + " |" for row in phase.rows]
    lines.append("")
    for phase in phases:
        lines.append(f"- {phase.name} ({phase.seconds:.0f} s): {phase.note.strip() or 'done'}")
    text = "\n".join(lines) + "\n"
    path.write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check"), help="folder of results"
    )
    p.add_argument("--text", type=Path, required=True, help="tiny Shakespeare (char and loop phases)")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    p.add_argument("--limit", type=float, default=150.0, help="seconds each process may run")
    p.add_argument("--smoke", action="store_true", help="a few steps of each phase: checks the plumbing")
    p.add_argument(
        "--bare-reports",
        type=Path,
        nargs="*",
        default=[],
        help="gpu_train.py reports (step-<config>.md) of an earlier run: the bare steps the loop compares"
        " with, and no bare profile",
    )
    args = p.parse_args(argv)
    chosen = [name.strip() for name in args.phases.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in PHASES]
    if unknown:
        p.error(f"unknown phase {unknown[0]!r}: choose from {', '.join(PHASES)}")
    if not args.text.is_file():
        p.error(f"--text {args.text}: no such file")
    args.text = args.text.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    header = f"{device()}; commit {commit()}; {time.strftime('%Y-%m-%d')}" + (
        " (smoke run)" if args.smoke else ""
    )
    phases: list[Phase] = []
    if args.bare_reports:
        earlier = Phase("bare steps read from " + ", ".join(path.name for path in args.bare_reports))
        for path in args.bare_reports:
            read_step_report(earlier, path.stem.removeprefix("step-") + ".yaml", path)
        phases.append(earlier)
    for name in chosen:
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        phases.append(PHASES[name](args, args.out))
        table = write_table(args.out / "gpu_check.md", header, phases)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
