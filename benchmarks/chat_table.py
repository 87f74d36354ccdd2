#!/usr/bin/env python
"""README's fine-tuning table: a base model, full SFT, LoRA, DPO and RL on the held-out play questions of
both kinds (who speaks these lines, which line comes next).

Runs the commands README gives, one after the other on this machine, and times each one from
its start to its exit with its peak memory (the largest resident set of the process and the
ones it waited for, as the kernel counts it):

1. `python play_questions.py` (the questions, split by play; skipped when the files are there
   and hold both kinds)
2. `python train.py --config small.yaml` (only with `--train_base`; else `--base` is a run)
3. `python train.py --config sft.yaml` and `--config lora.yaml` from that run, on the questions
4. `python train.py --config dpo.yaml` and `--config rl.yaml` from the SFT run (not with
   `--skip_past_sft`)
5. `python evaluate.py --tasks play_speakers,play_next_line` on each of them

and writes one Markdown table naming the CPU, a column for each task. Each model is scored on the
900 questions of each kind on the six plays that fine-tuning never sees; chance is 25%. Speakers
are scored by `acc` (the likeliest name); next lines by `acc_norm` (the likeliest per character),
as `acc` prefers the shorter lines (docs/evaluation.md).

    python benchmarks/chat_table.py --base runs/small --out chat-table.md
    python benchmarks/chat_table.py --train_base --out chat-table.md   # small.yaml first
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = "data_cache/play_questions"
METRICS = {"play_speakers": "acc", "play_next_line": "acc_norm"}
"""Each task, and the metric its column shows."""


@dataclass
class Measured:
    """One command's wall time and peak resident memory."""

    seconds: float
    peak_mib: float


def run(command: list[str], log: Path) -> Measured:
    """Run `command` from the repository root, its output into `log`; stop on failure."""
    print(f"$ {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{command[1]} exited {code}; its output is in {log}")
    return Measured(seconds, usage.ru_maxrss / 1024)  # kibibytes on Linux


def cpu_name() -> str:
    """The CPU's model name, family and model, and whether it multiplies bf16 natively."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown CPU"
    flags = fields.get("flags", "").split()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    limited = os.environ.get("ATEN_CPU_CAPABILITY") == "avx2"
    bf16 = "native bf16" if native and not limited else "no native bf16"
    return (
        f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model "
        f"{fields.get('model', '?')}, {bf16}), {os.cpu_count()} cores"
    )


def questions_written() -> bool:
    """Whether the train file is there and holds both kinds (an older one asks who speaks alone)."""
    path = ROOT / QUESTIONS / "train.jsonl"
    if not path.is_file():
        return False
    kinds = {json.loads(line).get("kind") for line in path.read_text(encoding="utf-8").splitlines()}
    return {"speaker", "next_line"} <= kinds


def score(run_dir: Path, out: Path) -> dict[str, tuple[float, float]]:
    """`evaluate.py --tasks play_speakers,play_next_line` on `run_dir`: task -> its metric (see
    `METRICS`) and that metric's standard error."""
    results = out / f"{run_dir.name}-evaluation.json"
    command = [sys.executable, "evaluate.py", "--checkpoint", str(run_dir), "--tasks", ",".join(METRICS)]
    command += ["--include_path", "evaluation/tasks", "--out", str(results)]
    run(command, out / f"{run_dir.name}-evaluate.log")
    rows = json.loads(results.read_text(encoding="utf-8"))["results"]
    found = {(r["task"], r["metric"]): r for r in rows}
    return {
        task: (found[task, metric]["value"], found[task, metric]["stderr"] or 0.0)
        for task, metric in METRICS.items()
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, default=Path("runs/small"), help="the pretrained run folder")
    p.add_argument("--train_base", action="store_true", help="train --base with small.yaml first")
    p.add_argument("--out", type=Path, default=Path("chat-table"), help="folder of logs and the table")
    p.add_argument("--skip_past_sft", action="store_true", help="leave out dpo.yaml and rl.yaml")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    python = sys.executable

    if not questions_written():
        command = [python, "play_questions.py", "--out", QUESTIONS, "--force"]
        run(command, args.out / "play_questions.log")

    trained: dict[str, Measured | None] = {"base": None}
    if args.train_base:
        command = [python, "train.py", "--config", "small.yaml", "--trainer.default_root_dir", str(args.base)]
        trained["base"] = run(command, args.out / "base-train.log")
    elif not (ROOT / args.base).is_dir():
        sys.exit(f"--base {args.base}: no such run folder (train it, or pass --train_base)")

    runs = {"base": args.base}
    for name in ("sft", "lora"):
        run_dir = args.base.parent / f"{name}-plays"
        command = [python, "train.py", "--config", f"{name}.yaml", "--model.init_from", str(args.base)]
        command += ["--data.conversations.source", f"{QUESTIONS}/train.jsonl"]
        command += ["--trainer.default_root_dir", str(run_dir)]
        trained[name] = run(command, args.out / f"{name}-train.log")
        runs[name] = run_dir
    # Past fine-tuning, from the SFT run: preference pairs of the same questions, then the model's
    # own answers to the next-line questions, rewarded where they name the right choice.
    sources = {"dpo": ["--data.pairs.source", f"{QUESTIONS}/train.jsonl"]}
    sources["rl"] = ["--data.questions.source", f"{QUESTIONS}/train.jsonl"]
    sources["rl"] += ["--data.questions.val_source", f"{QUESTIONS}/test.jsonl"]
    for name in ("dpo", "rl") if not args.skip_past_sft else ():
        run_dir = args.base.parent / f"{name}-plays"
        command = [python, "train.py", "--config", f"{name}.yaml", "--model.init_from", str(runs["sft"])]
        command += [*sources[name], "--trainer.default_root_dir", str(run_dir)]
        trained[name] = run(command, args.out / f"{name}-train.log")
        runs[name] = run_dir

    scores = {name: score(ROOT / run_dir, args.out) for name, run_dir in runs.items()}
    label = {
        "base": "base: `small.yaml`, no fine-tuning",
        "sft": "full SFT: `sft.yaml`, every parameter",
        "lora": "LoRA: `lora.yaml`, rank 8 on query and value",
        "dpo": "DPO: `dpo.yaml` from the SFT run, right choice over a wrong one",
        "rl": "RL: `rl.yaml` from the SFT run, rewarded for naming the right next line",
    }
    lines = [
        f"{cpu_name()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| model | training time | peak memory | who speaks these lines? (play_speakers, acc) "
        "| which line comes next? (play_next_line, acc_norm) |",
        "|---|---|---|---|---|",
    ]
    for name, s in scores.items():
        m = trained[name]
        took = f"{m.seconds / 60:.1f} min" if m else "(a run given)"
        peak = f"{m.peak_mib / 1024:.2f} GiB" if m else ""
        cells = " | ".join(f"{value:.1%} ± {stderr:.1%}" for value, stderr in s.values())
        lines.append(f"| {label[name]} | {took} | {peak} | {cells} |")
    table = "\n".join(lines) + "\n"
    (args.out / "chat-table.md").write_text(table, encoding="utf-8")
    print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
