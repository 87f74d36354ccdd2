#!/usr/bin/env python
"""Quality per wall-clock time: the validation loss a config reaches in a fixed training budget.

Two contestants get the same budget of training-loop time (120 s by default) on the same text:

- **ours**: ``train.py --config small.yaml`` exactly as a user runs it, with only the data source
  and ``--trainer.max_time`` changed (plus wandb off). Everything small.yaml chooses counts: the
  compact vocabulary, its architecture and optimizer (the modern recipe: Muon, rotary positions,
  ...), bf16 autocast, the allocator setting, its validation turns.
- **the peer**: ``llms-from-scratch``'s GPT (``GPTModelFast`` by default, the fastest in
  ``bench.py``) at the same shape, on the same GPT-2 tokens of the same training split, with the
  same schedule: batch size, AdamW (the book's optimizer, with the config's settings and our
  weight-decay groups), warmup + the config's decay over the same ``max_steps``, gradient
  clipping, seed. It runs the book's way:
  GPT-2's 50,257-token vocabulary, non-overlapping windows shuffled each epoch, in its fastest precision (bf16
  autocast with fused AdamW, as measured by ``bench.py``), in its own process with glibc's
  default allocator. A second peer run keeps the peak learning rate from the first step (no
  warmup, no decay), which suits a model that only gets through a few dozen steps, and a third
  also gives the peer's process the allocator setting train.py applies to itself
  (``minigpt.training.allocator``), which makes the peer about 3x faster on this kind of machine.
  The report compares against the best peer run.

Both clocks start at the first training step and stop at the first step that ends past the
budget, the way Lightning's ``max_time`` does; model building, data preparation and the final
evaluation are outside it. The final weights of both are then scored by the same function: mean
next-token cross-entropy over every non-overlapping window of the validation split, in fp32. The
two tokenizations are the same tokens (``gpt2-compact`` renumbers GPT-2's ids), which the script
checks, so the losses compare nats per GPT-2 token.

    python benchmarks/quality.py --text path/to/tinyshakespeare.txt

Without ``--text`` it uses the built-in corpus (Shakespeare's plays). The peer needs
``pip install --no-deps llms-from-scratch``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F
import yaml

from minigpt.checkpoints import load_model
from minigpt.data import DataConfig, prepare
from minigpt.training.allocator import keep_freed_memory
from minigpt.training.config import OptimConfig
from minigpt.training.optim import build_optimizer, build_scheduler

from suite.configs import ROOT
from suite.peer import PEER_INSTALL
from suite.runs import log, windows

# -- shared by both contestants -----------------------------------------------------------------


@torch.no_grad()
def validation_loss(logits_of: Any, ids: np.ndarray, context: int, batch: int = 16) -> float:
    """Mean next-token cross-entropy (nats) over all non-overlapping windows of `ids`, in fp32."""
    x, y = windows(ids, context)
    total, count = 0.0, 0
    for i in range(0, len(x), batch):
        logits = logits_of(x[i : i + batch]).float()
        total += F.cross_entropy(logits.flatten(0, 1), y[i : i + batch].flatten(), reduction="sum").item()
        count += y[i : i + batch].numel()
    return total / count


def read_config(path: Path) -> dict[str, Any]:
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    model = config.get("model", {})
    data = config.get("data", {}).get("config", {})
    return {
        "gpt": model.get("gpt", {}),
        "optim": model.get("optim", {}),
        "batch_size": data.get("batch_size", DataConfig.batch_size),
        "val_fraction": data.get("val_fraction", DataConfig.val_fraction),
        "tokenizer": data.get("tokenizer", DataConfig.tokenizer),
        "max_steps": config.get("trainer", {}).get("max_steps"),
        "seed": config.get("seed_everything", 0),
    }


def max_time(seconds: float) -> str:
    """Lightning's DD:HH:MM:SS form."""
    s = int(round(seconds))
    return f"{s // 86400:02d}:{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


# -- ours ---------------------------------------------------------------------------------------


def run_ours(
    args: argparse.Namespace, cfg: dict[str, Any], work: Path, val_ids: np.ndarray
) -> dict[str, Any]:
    run_dir = work / "ours"
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "--config",
        str(args.config),
        "--data.config.source",
        args.source,
        "--data.config.cache_dir",
        str(work / "data"),
        "--trainer.max_time",
        max_time(args.budget),
        "--trainer.default_root_dir",
        str(run_dir),
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}  # the config's wandb logger defers to it
    log(f"[ours] WANDB_MODE=disabled {shlex.join(command)}")
    with open(work / "ours.log", "w") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=work, env=env)
    if result.returncode != 0:
        raise SystemExit(f"train.py failed (exit {result.returncode}); see {work / 'ours.log'}")
    with open(run_dir / "csv" / "version_0" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    steps = max(int(r["step"]) for r in rows) + 1
    # Lightning's Timer is the budget; the step-time column gives the training time it measured.
    speeds = [float(r["tokens_per_sec"]) for r in rows if r.get("tokens_per_sec")]
    logged_val = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    model, tokenizer = load_model(run_dir / "checkpoints" / "last.ckpt")
    context = model.config.context_length
    loss = validation_loss(model, val_ids, context)
    return {
        "label": f"ours: {args.config.name} ({cfg['tokenizer']}, vocab {model.config.vocab_size:,})",
        "steps": steps,
        "tokens_per_s": float(np.median(speeds)) if speeds else float("nan"),
        "seconds": args.budget,
        "val_loss": loss,
        "logged_val_loss": logged_val[-1] if logged_val else float("nan"),
    }


# -- the peer -----------------------------------------------------------------------------------


def peer_worker(args: argparse.Namespace) -> None:
    """Train the peer for the budget in this process and write its result as JSON."""
    from llms_from_scratch import ch04

    spec = json.loads(Path(args.peer_worker).read_text())
    if spec["allocator"] == "tuned" and not keep_freed_memory():
        raise SystemExit("could not apply the allocator setting")
    cfg, work = spec["cfg"], Path(spec["work"])
    gpt, optim = cfg["gpt"], OptimConfig(**cfg["optim"])
    context, batch = gpt["context_length"], cfg["batch_size"]
    torch.manual_seed(cfg["seed"])
    model_cls = getattr(ch04, args.peer_model)
    model = model_cls(
        {
            "vocab_size": 50257,
            "context_length": context,
            "emb_dim": gpt["n_embd"],
            "n_heads": gpt["n_head"],
            "n_layers": gpt["n_layer"],
            "drop_rate": gpt.get("dropout", 0.0),
            "qkv_bias": False,
        }
    )
    # The book's optimizer, AdamW, with our settings and schedule (a config's Muon is ours, not the
    # peer's). "constant" drops the warmup and the decay: the peak rate from the first step, which
    # suits a peer that only gets through a few dozen steps in the budget.
    optim = dataclasses.replace(optim, optimizer="adamw", fused=True)
    optimizer = build_optimizer(model, optim)
    if spec["schedule"] == "constant":
        optim = dataclasses.replace(optim, warmup_steps=0, min_lr=optim.lr)
    scheduler = build_scheduler(optimizer, optim, cfg["max_steps"])
    x_all, y_all = windows(np.load(work / "train_gpt2.npy", mmap_mode="r"), context)
    order = torch.Generator().manual_seed(cfg["seed"])
    bf16 = args.peer_precision == "bf16"
    model.train()
    steps, start = 0, time.perf_counter()
    done = False
    while not done:
        perm = torch.randperm(len(x_all), generator=order)
        for i in range(0, len(perm) - batch + 1, batch):  # drop_last, as the book's loader
            index = perm[i : i + batch]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(x_all[index])
            loss = F.cross_entropy(logits.float().flatten(0, 1), y_all[index].flatten())
            loss.backward()
            if optim.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
            if time.perf_counter() - start >= spec["budget"] or steps >= cfg["max_steps"]:
                done = True
                break
    seconds = time.perf_counter() - start
    model.eval()
    val_ids = np.load(work / "val_gpt2.npy", mmap_mode="r")
    result = {
        "label": f"peer: {args.peer_model}, GPT-2 vocab 50,257, {args.peer_precision}, "
        f"{'our schedule' if spec['schedule'] == 'ours' else f'constant lr {optim.lr:g}'}"
        + (", our allocator setting" if spec["allocator"] == "tuned" else ""),
        "steps": steps,
        "tokens_per_s": steps * batch * context / seconds,
        "seconds": seconds,
        "val_loss": validation_loss(model, val_ids, context),
        "logged_val_loss": float("nan"),
    }
    (work / "peer.json").write_text(json.dumps(result))


def run_peer(args: argparse.Namespace, cfg: dict[str, Any], work: Path, run: str) -> dict[str, Any]:
    schedule, _, allocator = run.partition(":")
    if schedule not in ("ours", "constant") or allocator not in ("", "tuned"):
        raise SystemExit(f"error: unknown peer run {run!r}; use ours or constant, optionally with :tuned")
    spec = work / "peer_spec.json"
    spec.write_text(
        json.dumps(
            {
                "cfg": cfg,
                "work": str(work),
                "budget": args.budget,
                "schedule": schedule,
                "allocator": allocator,
            }
        )
    )
    command = [
        sys.executable,
        __file__,
        "--peer-worker",
        str(spec),
        "--peer-model",
        args.peer_model,
        "--peer-precision",
        args.peer_precision,
    ]
    log(f"[peer] {args.peer_model}, {args.peer_precision}, {run}, {args.budget:.0f} s")
    with open(work / "peer.log", "w") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=work)
    if result.returncode != 0:
        raise SystemExit(f"the peer failed (exit {result.returncode}); see {work / 'peer.log'}")
    return json.loads((work / "peer.json").read_text())


def peer_installed() -> bool:
    try:
        import llms_from_scratch  # noqa: F401
    except ImportError:
        log(f"NOTE: llms-from-scratch is not installed; the peer is skipped ({PEER_INSTALL})")
        return False
    return True


# -- main ---------------------------------------------------------------------------------------


def prepare_tokens(args: argparse.Namespace, cfg: dict[str, Any], work: Path) -> np.ndarray:
    """Prepare the corpus both ways; check they are the same tokens; return ours' val ids."""
    common = dict(source=args.source, val_fraction=cfg["val_fraction"], cache_dir=str(work / "data"))
    ours = prepare(DataConfig(tokenizer=cfg["tokenizer"], **common))
    gpt2 = prepare(DataConfig(tokenizer="gpt2", **common))
    for split in ("train", "val"):
        if ours.num_tokens(split) != gpt2.num_tokens(split):
            raise SystemExit(f"the two tokenizations differ in length on {split}; losses would not compare")
        np.save(work / f"{split}_gpt2.npy", np.asarray(gpt2.tokens(split)))
    if cfg["tokenizer"] == "gpt2-compact":
        from minigpt.data import tokenizer_from_spec

        compact = tokenizer_from_spec(ours.meta["tokenizer"])
        if not np.array_equal(
            compact.to_compact(np.asarray(gpt2.tokens("val"))), np.asarray(ours.tokens("val"))
        ):
            raise SystemExit(
                "the compact validation ids are not GPT-2's renumbered; losses would not compare"
            )
    log(f"[data] train {ours.num_tokens('train'):,} tokens, val {ours.num_tokens('val'):,} tokens")
    return np.asarray(ours.tokens("val"))


def report(args: argparse.Namespace, results: list[dict[str, Any]], val_tokens: int) -> str:
    lines = [
        f"# Quality per time — {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"- text: {args.source_label}; validation split {val_tokens:,} GPT-2 tokens",
        f"- budget: {args.budget:.0f} s of training-loop time each; config {args.config.name}",
        f"- torch {torch.__version__}, {torch.get_num_threads()} threads; python {platform.python_version()}",
        f"- command: `python {shlex.join(['benchmarks/quality.py', *sys.argv[1:]])}`",
        "",
        "| contestant | steps | tokens/s | val loss (nats/token) | perplexity |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['label']} | {r['steps']:,} | {r['tokens_per_s']:,.0f} | {r['val_loss']:.3f} "
            f"| {math.exp(r['val_loss']):,.1f} |"
        )
    if len(results) > 1:
        best = min(results[1:], key=lambda r: r["val_loss"])
        gap = best["val_loss"] - results[0]["val_loss"]
        lines += ["", f"Ours ends {gap:.2f} nats below the best peer run ({best['label']})."]
    if not math.isnan(results[0]["logged_val_loss"]):
        lines += [
            "",
            f"train.py's own validation at its last step logged {results[0]['logged_val_loss']:.3f} "
            "(its windows are placed differently; the table scores both models on the same windows).",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--text", default=None, help="a UTF-8 text file (default: the built-in Shakespeare corpus)"
    )
    p.add_argument("--budget", type=float, default=120.0, help="seconds of training per contestant")
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "small.yaml")
    p.add_argument("--peer-model", default="GPTModelFast", choices=["GPTModelFast", "GPTModel"])
    p.add_argument("--peer-precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument(
        "--peer-runs",
        default="ours,constant,constant:tuned",
        help="comma-separated peer runs: the schedule, 'ours' (the config's warmup + cosine) or "
        "'constant' (its peak lr throughout), optionally followed by ':tuned' to give the peer's "
        "process train.py's allocator setting; empty for none",
    )
    p.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    p.add_argument("--peer-worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.peer_worker:
        peer_worker(args)
        return
    args.config = args.config.resolve()
    if args.text is not None and not Path(args.text).is_file():
        raise SystemExit(f"error: --text {args.text} is not a file")
    args.source = str(Path(args.text).resolve()) if args.text else "shakespeare"
    args.source_label = Path(args.text).name if args.text else "the built-in Shakespeare corpus"
    cfg = read_config(args.config)
    if cfg["tokenizer"] not in ("gpt2", "gpt2-compact"):
        raise SystemExit(
            f"error: {args.config.name} uses the {cfg['tokenizer']} tokenizer; the peer needs GPT-2's"
        )
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="minigpt-quality-") as tmp:
        work = Path(tmp)
        val_ids = prepare_tokens(args, cfg, work)
        results = [run_ours(args, cfg, work, val_ids)]
        log(f"[ours] {results[0]['steps']} steps, val loss {results[0]['val_loss']:.3f}")
        if args.peer_runs and peer_installed():
            for run in args.peer_runs.split(","):
                peer = run_peer(args, cfg, work, run)
                results.append(peer)
                log(f"[peer] {peer['steps']} steps, val loss {peer['val_loss']:.3f}")
        text = report(args, results, len(val_ids))
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
