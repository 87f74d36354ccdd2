#!/usr/bin/env python
"""Which levers of the modern recipe pay at our shapes: each alone, then combinations, each given
the same wall-clock budget through `train.py`, scored by validation loss.

Every variant is `train.py --config <config>` plus its overrides, with the same data and seed.
The budget is the time the baseline (the config as it is) needs for `--steps` steps. A variant
that makes a step slower gets proportionally fewer steps, so every variant has the same time:

1. **Timing.** One training step (forward, backward, clipping, optimizer) of every variant is
   timed in this process, with the project's own model, optimizer, precision (bf16 autocast, or
   fp32 where the CPU has no native bf16, as train.py decides) and allocator setting, on random
   ids. The variants take turns for `--rounds` rounds, so a machine whose speed drifts slows
   them alike; each variant's speed is its fastest step relative to the baseline's.
2. **Training.** Each variant then trains through `train.py` for `--steps` x its relative speed
   steps, its warmup scaled with them, and validates once at the end on the whole validation
   split. These runs are deterministic on a CPU: their losses do not depend on how busy the
   machine was, only the timing does.

    python benchmarks/ablation.py --config small.yaml --steps 400 --text tinyshakespeare.txt
    python benchmarks/ablation.py --config char.yaml --variants baseline,muon,rope --seeds 1337,1338
    python benchmarks/ablation.py --config small.yaml --over recipes/gpt2.yaml --variants baseline,rope

Variants are named in VARIANTS below; `a+b` combines levers. The table gives medians over seeds.
Levers that lost here and left the model are no variants any more: benchmarks/RESULTS.md names the
commit that still runs them.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from minigpt.data import DataConfig, prepare
from minigpt.model import GPT, GPTConfig
from minigpt.training.allocator import keep_freed_memory
from minigpt.training.averaging import EMAWeights
from minigpt.training.config import OptimConfig
from minigpt.training.loss import next_token_loss
from minigpt.training.optim import build_optimizer
from minigpt.training.precision import resolve_precision
from quality import log

ROOT = Path(__file__).resolve().parents[1]
EMA = "minigpt.training.averaging.EMAWeights"
"""The weight-averaging callback; a variant appends it to the config's callbacks."""

VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "muon": {"model.optim.optimizer": "muon"},
    "adamw": {"model.optim.optimizer": "adamw"},
    "muon_ns2": {"model.optim.optimizer": "muon", "model.optim.muon_ns_steps": 2},
    "qk_heads": {"model.optim.muon_qk_per_head": True},
    "qk_whole": {"model.optim.muon_qk_per_head": False},
    "v_heads": {"model.optim.muon_v_per_head": True},
    "v_whole": {"model.optim.muon_v_per_head": False},
    "gram_norm": {"model.optim.muon_ns_norm": "gram"},
    "frobenius_norm": {"model.optim.muon_ns_norm": "frobenius"},
    "muon_ns3": {"model.optim.optimizer": "muon", "model.optim.muon_ns_steps": 3},
    "muon_ns4": {"model.optim.optimizer": "muon", "model.optim.muon_ns_steps": 4},
    "muon_ns5": {"model.optim.optimizer": "muon", "model.optim.muon_ns_steps": 5},
    "polar": {"model.optim.muon_ns_coefficients": "polar_express"},
    "jordan": {"model.optim.muon_ns_coefficients": "jordan"},
    "rope": {"model.gpt.position_embedding": "rope"},
    "qk_norm": {"model.gpt.qk_norm": True},
    "rmsnorm": {"model.gpt.norm": "rmsnorm"},
    "relu2": {"model.gpt.activation": "relu2"},
    "zero_init": {"model.gpt.zero_init_proj": True},
    "ema": {"trainer.callbacks+": EMA, "trainer.callbacks.decay": 0.995},
    "ema99": {"trainer.callbacks+": EMA, "trainer.callbacks.decay": 0.99},
    "ema998": {"trainer.callbacks+": EMA, "trainer.callbacks.decay": 0.998},
    "untied": {"model.gpt.tie_weights": False},
    "tied": {"model.gpt.tie_weights": True},
    "wsd": {"model.optim.schedule": "wsd", "model.optim.decay_fraction": 0.4},
    "linear0": {"model.optim.schedule": "wsd", "model.optim.decay_fraction": 1.0, "model.optim.min_lr": 0.0},
    "lr_x2": {"model.optim.lr": "x2", "model.optim.min_lr": "x2"},
    "lr_half": {"model.optim.lr": "x0.5", "model.optim.min_lr": "x0.5"},
    "muon_lr_x2": {"model.optim.muon_lr": 0.04},
    "muon_lr_x1.5": {"model.optim.muon_lr": 0.03},
    "min_lr_x3": {"model.optim.min_lr": "x3"},
    "muon_lr_half": {"model.optim.muon_lr": 0.01},
    "dropout": {"model.gpt.dropout": 0.1},
    "dropout2": {"model.gpt.dropout": 0.2},
    "wd_x5": {"model.optim.weight_decay": "x5"},
    "wd_x10": {"model.optim.weight_decay": "x10"},
    "wd_0": {"model.optim.weight_decay": 0.0},
    "wd_x20": {"model.optim.weight_decay": "x20"},
    "emb_lr_x10": {"model.optim.embedding_lr": "x10"},
    "emb_lr_x30": {"model.optim.embedding_lr": "x30"},
    "deep6": {"model.gpt.n_layer": 6},
    "deep8": {"model.gpt.n_layer": 8},
    "batch_x2": {"data.config.batch_size": "x2"},
    "batch_x3": {"data.config.batch_size": "x3"},
    "batch_half": {"data.config.batch_size": "x0.5"},
    "ctx256": {"model.gpt.context_length": 256, "data.config.batch_size": "x0.5"},  # same tokens a step
}
RECIPE = ("rope", "relu2", "zero_init", "untied", "qk_norm")
"""The architecture levers that paid in 75-second and char.yaml-shape runs; "recipe" adds Muon to
them. char.yaml trains this recipe; small.yaml keeps its head tied, which won at its full length."""
VARIANTS["recipe_adamw"] = {k: v for name in RECIPE for k, v in VARIANTS[name].items()}
VARIANTS["recipe"] = {**VARIANTS["recipe_adamw"], **VARIANTS["muon"]}
"""Each lever alone, as dotted settings of the config ("xF": the config's value times F)."""


def dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A YAML tree's leaves as dotted settings: {"model": {"gpt": {"n_layer": 4}}} -> model.gpt.n_layer."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def settings(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    """The variant's dotted settings, with "xF" factors applied to the config's values."""
    out: dict[str, Any] = {}
    for name in variant.split("+"):
        if name not in VARIANTS:
            raise SystemExit(f"error: unknown variant {name!r}; known: {', '.join(VARIANTS)}")
        for key, value in VARIANTS[name].items():
            if isinstance(value, str) and value.startswith("x"):
                value = float(value[1:]) * current(config, key)
                if key == "data.config.batch_size":
                    value = max(1, round(value))
            out[key] = value
    return out


def current(config: dict[str, Any], key: str) -> float:
    """The config's value at a dotted key, or the typed default where the config leaves it out."""
    *path, field = key.split(".")
    node: Any = config
    for part in path:
        node = node.get(part, {})
    default = DataConfig() if key.startswith("data.") else OptimConfig()
    value = node.get(field, getattr(default, field))
    if value is None and field == "embedding_lr":  # unset: the AdamW learning rate
        return current(config, "model.optim.lr")
    return float(value)


def section(config: dict[str, Any], extra: dict[str, Any], name: str) -> dict[str, Any]:
    """`model.<name>` of the config with the variant's settings for it applied."""
    values = dict(config["model"].get(name, {}))
    prefix = f"model.{name}."
    values.update({k[len(prefix) :]: v for k, v in extra.items() if k.startswith(prefix)})
    return values


# -- 1. timing ------------------------------------------------------------------------------------


def config_ema(config: dict[str, Any]) -> dict[str, Any] | None:
    """The config's own EMAWeights entry under `trainer.callbacks`, or None."""
    return next((c for c in config["trainer"].get("callbacks") or [] if c.get("class_path") == EMA), None)


def ema_decay(config: dict[str, Any], extra: dict[str, Any]) -> float | None:
    """The decay of the EMAWeights the variant trains with (the config's or its own), or None."""
    if extra.get("trainer.callbacks+") == EMA:
        return float(extra.get("trainer.callbacks.decay", EMAWeights().decay))
    if (callback := config_ema(config)) is not None:
        return float((callback.get("init_args") or {}).get("decay", EMAWeights().decay))
    return None


def step_timer(config: dict[str, Any], extra: dict[str, Any], vocab_size: int, compiled: bool = False) -> Any:
    """A function that runs one training step of the variant and returns its seconds (with the
    weight average's update after the optimizer's step, where the variant keeps one). Its
    `fastest` dict keeps the fastest forward+backward and optimizer part (clipping, the step, the
    average) seen. `compiled`: the blocks through `torch.compile`, as `--model.compile true` runs
    them (the LM head and the loss stay eager); the first call compiles."""
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
    bf16 = resolve_precision(config["trainer"].get("precision"), "cpu") == "bf16-mixed"

    def step() -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = next_token_loss(gpt.lm_head(features(x)), y)
        loss.backward()
        backward = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if average is not None:
            average.update_parameters(gpt)
        end = time.perf_counter()
        # The fastest of each part seen so far: where a step's time goes (speed_check --phases).
        for part, seconds in (("forward+backward", backward - start), ("optimizer", end - backward)):
            step.fastest[part] = min(step.fastest.get(part, float("inf")), seconds)
        return end - start

    step.fastest = {}  # type: ignore[attr-defined]
    return step


def relative_speeds(
    config: dict[str, Any], variants: list[str], vocab_size: int, rounds: int, steps: int
) -> dict[str, float]:
    """Each variant's steps per second relative to the baseline's.

    A step's time is the fastest of the variant's `rounds` x `steps` timed steps: other work on
    the machine only ever adds time, so the minimum is the measure least moved by it.
    """
    keep_freed_memory()  # as train.py does
    timers = {v: step_timer(config, settings(v, config), vocab_size) for v in ["baseline", *variants]}
    for timer in timers.values():
        timer(), timer()  # warm up: first-touch allocations, oneDNN's kernel choice
    fastest = dict.fromkeys(timers, float("inf"))
    order = list(timers)
    for r in range(rounds):
        for v in order[r % len(order) :] + order[: r % len(order)]:  # each round starts elsewhere
            fastest[v] = min(fastest[v], *(timers[v]() for _ in range(steps)))
        log(f"[timing] round {r + 1}: baseline {fastest['baseline'] * 1000:.0f} ms/step so far")
    return {v: fastest["baseline"] / fastest[v] for v in variants}


# -- 2. training ----------------------------------------------------------------------------------


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
    """One train.py run; its steps and the last validation loss it logged."""
    configs = [args.config, *([args.over] if args.over else [])]
    data = ["--data.config.source", args.source, "--data.config.cache_dir", str(work / "data")]
    rows = run_train_py(configs, [*data, *extra], work / name, work)
    vals = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    return {"steps": max(int(r["step"]) for r in rows) + 1, "val_loss": vals[-1], "curve": vals}


def config_path(name: str) -> str:
    """`name` as train.py will find it from another working directory: a file here by its absolute
    path, anything else (a name in configs/) as it is."""
    return str(Path(name).resolve()) if Path(name).is_file() else name


def read_yaml(name: str) -> dict[str, Any]:
    path = Path(name) if Path(name).is_file() else ROOT / "configs" / name
    return yaml.safe_load(path.read_text(encoding="utf-8"))


VARIANTS["gpt2"] = dotted(read_yaml("recipes/gpt2.yaml"))
"""GPT-2's whole recipe (recipes/gpt2.yaml) as one variant, against a config's own."""


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values laid on top, section by section, as a second --config does."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and key in base else value
    return out


def cli_overrides(extra: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in extra.items():
        text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        out.append(f"--{key}={text}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="small.yaml")
    p.add_argument("--over", default=None, help="a second config laid over the first, e.g. recipes/gpt2.yaml")
    p.add_argument("--text", default=None, help="a UTF-8 text file (default: the built-in corpus)")
    p.add_argument("--steps", type=int, default=None, help="the baseline's steps (default: the config's)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated; a+b combines levers")
    p.add_argument("--seeds", default="1337", help="comma-separated seeds; the table shows medians")
    p.add_argument("--rounds", type=int, default=7, help="timing rounds, the variants taking turns")
    p.add_argument("--timed-steps", type=int, default=5, help="steps timed per variant and round")
    p.add_argument(
        "--speeds", default=None, help="skip the timing: variant=speed,... as a timing run printed"
    )
    p.add_argument("--timing-only", action="store_true", help="print the relative speeds and stop")
    p.add_argument(
        "--validations",
        type=int,
        default=1,
        help="validate every steps // N steps; the table shows the last (the end when N divides the steps)",
    )
    p.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    args = p.parse_args()
    args.source = str(Path(args.text).resolve()) if args.text else "shakespeare"
    args.config, args.over = config_path(args.config), args.over and config_path(args.over)
    config = read_yaml(args.config)
    if args.over:
        config = merged(config, read_yaml(args.over))
    variants = [v for v in args.variants.split(",") if v]
    has_ema = config_ema(config) is not None
    for variant in variants:
        extra = settings(variant, config)  # fail on a typo before any work
        if has_ema and extra.get("trainer.callbacks+") == EMA:
            raise SystemExit(
                f"error: {args.config} already averages its weights; "
                f"variant {variant} would add a second EMAWeights"
            )
    seeds = [int(s) for s in args.seeds.split(",")]
    full_steps = int(config["trainer"]["max_steps"])
    base_steps = args.steps or full_steps
    warmup = int(config["model"].get("optim", {}).get("warmup_steps", OptimConfig.warmup_steps))

    with tempfile.TemporaryDirectory(prefix="minigpt-ablation-") as tmp:
        work = Path(tmp)
        data = dict(config["data"]["config"], source=args.source, cache_dir=str(work / "data"))
        vocab_size = prepare(DataConfig(**data)).tokenizer().n_vocab
        if args.speeds:
            speed = {
                "baseline": 1.0,
                **{k: float(v) for k, v in (x.split("=") for x in args.speeds.split(","))},
            }
        else:
            speed = relative_speeds(config, variants, vocab_size, args.rounds, args.timed_steps)
        if args.timing_only:
            print("\n".join(f"{v}: {s:.1%}" for v, s in speed.items()))
            return
        results: dict[str, list[dict[str, float]]] = {}
        for variant in variants:
            steps = max(1, round(base_steps * speed[variant]))
            for seed in seeds:
                extra = {
                    "seed_everything": seed,
                    "trainer.max_steps": steps,
                    "trainer.val_check_interval": max(1, steps // args.validations),
                    "model.optim.warmup_steps": max(1, round(warmup * steps / full_steps)),
                    **settings(variant, config),
                }
                result = train(args, work, f"{variant}-{seed}", cli_overrides(extra))
                log(f"[{variant}-{seed}] {result}")
                results.setdefault(variant, []).append(result)

    base = statistics.median(r["val_loss"] for r in results["baseline"]) if "baseline" in results else None
    lines = [
        f"`python benchmarks/ablation.py --config {args.config}"
        + (f" --over {args.over}" if args.over else "")
        + f" --steps {base_steps}"
        + (f" --text {Path(args.text).name}" if args.text else "")
        + f" --variants {args.variants} --seeds {args.seeds}"
        + (f" --speeds {args.speeds}" if args.speeds else "")
        + (f" --validations {args.validations}" if args.validations > 1 else "")
        + f"`, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; budget: the baseline's "
        f"{base_steps} steps; "
        + ("speeds as given" if args.speeds else f"timing {args.rounds} rounds x {args.timed_steps} steps")
        + "; median over "
        f"{len(seeds)} seed(s)",
        "",
        "| variant | step speed vs baseline | steps | val loss | vs baseline |",
        "|---|---|---|---|---|",
    ]
    for variant, runs in results.items():
        loss = statistics.median(r["val_loss"] for r in runs)
        delta = f"{loss - base:+.3f}" if base is not None else "-"
        lines.append(f"| {variant} | {speed[variant]:.1%} | {runs[0]['steps']:.0f} | {loss:.3f} | {delta} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
