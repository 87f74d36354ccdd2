#!/usr/bin/env python
"""What `train.py`'s loop adds to a step: its steps against the bare step of the same model,
optimizer, clipping, schedule and data, each timed inside its own process, so that start-up and
validation cancel out.

    python benchmarks/step_overhead.py                  # the micro shape, 1,200 steps, 3 rounds
    python benchmarks/step_overhead.py --shape baby --steps 400 --every 25 --rounds 1
    python benchmarks/step_overhead.py --check          # fp32, and the same losses in both
    python benchmarks/step_overhead.py -- --model.optim.optimizer muon   # settings for both runs

Prefix `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2` to measure a CPU with native bf16 as one
without it (train.py then trains in fp32).

The bare loop parses the same command line with train.py's own parser, then trains the model that
builds with `build_optimizer`, `build_scheduler`, `clip_grad_norm_`, the config's weight average
(EMAWeights' `MovingAverage`, the recipe's work) and the data module's own loader, under the
trainer's precision: the work every step must do, and no more. `train.py` runs as a user runs it
(the config's loggers and callbacks, the console's lines), with a callback that takes its turns.
Both run at once and take turns of `--every` steps (`suite/turns.py`), so a machine whose speed
drifts within minutes slows both alike; each is timed over its turns after the first `--skip`
steps, whose one-off costs (allocations, the loader's start) are left out. With `--check`, both
run in fp32 and the script fails unless their first 30 losses are the same bit for bit: the bare
loop is then the same arithmetic as the trainer's.
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

from suite.turns import per_step, take_turns

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

SHAPES = {
    # The shape where the model's work is small and the loop's shows: 1 layer, 1 head, 32 wide,
    # context 16, batches of 4, small.yaml's recipe with AdamW.
    "micro": [
        "--config", "small.yaml",
        "--model.gpt.n_layer", "1", "--model.gpt.n_head", "1", "--model.gpt.n_embd", "32",
        "--model.gpt.context_length", "16", "--data.config.batch_size", "4",
        "--model.optim.optimizer", "adamw",
    ],
    # nanoGPT's README baby GPT through char.yaml (benchmarks/baby.yaml).
    "baby": ["--config", "char.yaml", "--config", str(BENCHMARKS / "baby.yaml")],
    "small": ["--config", "small.yaml"],
}  # fmt: skip


def train_args(shape: list[str], steps: int, extra: list[str], run_dir: Path) -> list[str]:
    """train.py's command line for one timed run: no validation, the run's own folder."""
    return [
        *shape,
        "--trainer.max_steps", str(steps),
        "--trainer.limit_val_batches", "0",
        "--trainer.default_root_dir", str(run_dir),
        *extra,
    ]  # fmt: skip


# -- the bare loop, in a process of its own ----------------------------------------------------


def bare_worker(args: list[str], out: Path) -> None:
    """Train what `args` configures in a plain loop, writing each step's end time and loss to `out`."""
    import torch

    from minigpt.cli.train import build_cli
    from minigpt.model import GPT
    from minigpt.training.callbacks.averaging import EMAWeights, MovingAverage
    from minigpt.training.loss import next_token_loss
    from minigpt.training.optim import build_optimizer, build_scheduler

    from suite.turns import Turns

    cli = build_cli(args, save_config=False)
    lit, data, trainer = cli.model, cli.datamodule, cli.trainer
    data.prepare_data()
    data.setup("fit")
    # As LitGPT.configure_model builds it, from the tokenizer's vocabulary.
    vocab = lit.gpt_config.vocab_size or data.tokenizer.n_vocab
    model = GPT(lit.gpt_config.__class__(**{**lit.gpt_config.__dict__, "vocab_size": vocab}))
    model.train()
    config = lit.optim_config
    steps = trainer.max_steps
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, steps)
    params = [p for p in model.parameters() if p.requires_grad]
    # The config's weight average, updated after each step as EMAWeights updates it.
    ema = next((c for c in trainer.callbacks if isinstance(c, EMAWeights)), None)
    average = None if ema is None else MovingAverage(model, ema.decay)
    bf16 = str(trainer.precision) == "bf16-mixed"
    loader = data.train_dataloader()
    turns = Turns.from_env()
    if turns is None:
        raise SystemExit("error: the bare loop runs under step_overhead.py, which hands out its turns")
    turns.begin()
    done = 0
    losses: list[float] = []
    while done < steps:
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = next_token_loss(model(x), y)
            loss.backward()
            if config.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            if average is not None:
                average.update_parameters(model)
            if len(losses) < 30:
                losses.append(loss.item())
            done += 1
            turns.step_done(last=done == steps)
            if done == steps:
                break
        loader.sampler.set_epoch(loader.sampler.epoch + 1)
    out.write_text(json.dumps({"turns": turns.turns, "losses": losses}))


# -- the rounds --------------------------------------------------------------------------------


STEP_TIMES = "suite.timeline.StepTimes"
"""The callback that takes train.py's turns and notes their times."""


def one_round(args: list[str], folder: Path, bare_first: bool, every: int) -> dict[str, dict]:
    """The bare loop and train.py on the same command line, taking turns of `every` steps."""
    outs = {"bare": folder / "bare.json", "train.py": folder / "train.json"}
    commands = {
        "bare": [sys.executable, __file__, "--worker", str(outs["bare"]), "--", *args],
        "train.py": [sys.executable, str(ROOT / "train.py"), *args, f"--trainer.callbacks+={STEP_TIMES}",
                     f"--trainer.callbacks.path={outs['train.py']}"],
    }  # fmt: skip
    order = ["bare", "train.py"] if bare_first else ["train.py", "bare"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCHMARKS), env.get("PYTHONPATH")]))
    with open(folder / "log.txt", "w") as log:
        codes = take_turns([commands[n] for n in order], every, folder, env=env, cwd=ROOT, stdout=log,
                           stderr=subprocess.STDOUT)  # fmt: skip
    if any(codes):
        raise SystemExit(f"error: a run failed ({dict(zip(order, codes, strict=True))}):\n"
                         f"{(folder / 'log.txt').read_text()[-3000:]}")  # fmt: skip
    return {name: json.loads(out.read_text()) for name, out in outs.items()}


def main() -> None:
    argv = sys.argv[1:]
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="micro")
    p.add_argument("--steps", type=int, default=1200, help="steps in each run")
    p.add_argument("--skip", type=int, default=50, help="steps left out of the timing at each run's start")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--every", type=int, default=50, help="steps a turn")
    p.add_argument(
        "--check", action="store_true", help="fp32, and the first 30 losses must agree bit for bit"
    )
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(own)
    if args.worker is not None:
        bare_worker(extra, args.worker)
        return
    if args.check:
        extra = ["--trainer.precision", "32-true", *extra]
    from minigpt.training.precision import cpu_description

    print(f"CPU: {cpu_description()}", file=sys.stderr)
    rows = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            command = train_args(SHAPES[args.shape], args.steps, extra, folder / "run")
            runs = one_round(command, folder, bare_first=r % 2 == 0, every=args.every)
        bare, ours = (per_step(runs[n]["turns"], args.skip) for n in ("bare", "train.py"))
        same = runs["bare"]["losses"] == runs["train.py"]["losses"]
        rows.append((bare, ours, same))
        print(f"round {r + 1}: bare {bare * 1e3:.2f} ms, train.py {ours * 1e3:.2f} ms, "
              f"ratio {ours / bare:.3f}, first 30 losses {'the same' if same else 'differ'}",
              file=sys.stderr)  # fmt: skip
        if args.check and not same:
            pairs = list(zip(runs["bare"]["losses"], runs["train.py"]["losses"], strict=False))
            raise SystemExit(f"error: the losses differ: {pairs[:5]}")
    print(f"| round | bare step | train.py's step | ratio |  (shape {args.shape}, {args.steps} steps, "
          f"timed from step {args.skip})")  # fmt: skip
    print("|---|---|---|---|")
    for r, (bare, ours, _) in enumerate(rows, 1):
        print(f"| {r} | {bare * 1e3:.2f} ms | {ours * 1e3:.2f} ms | **{ours / bare:.3f}x** |")
    print(f"| median | | | **{statistics.median(o / b for b, o, _ in rows):.3f}x** |")


if __name__ == "__main__":
    main()
