#!/usr/bin/env python
"""Small costs paid every step, which a small model's step feels: Lightning's `self.log`, and QK-norm
with the rotation as one autograd node or two.

    python benchmarks/experiments/per_step_costs.py logging --steps 300  # train.py, baby shape, calls timed
    python benchmarks/experiments/per_step_costs.py qk_node --case baby   # the node against earlier forms
    python benchmarks/experiments/per_step_costs.py maps --case baby      # the maps drawn at each validation

`logging` runs train.py in this process with `LightningModule.log` timed, and prints how many calls
the run made and what they cost. `qk_node` times training steps of a config's recipe (and their
forward and backward apart) with `attention.normalise_and_rotate` as shipped (one node, rotating a
half at a time; in bf16 it computes in fp32 and rounds once), as QK-norm's own node
(`attention.rms_normalise`, its fp32 gradient written out; `F.rms_norm` in bf16) followed by the
rotation, as before the node, and in fp32 also as the node rotating the full width (x * cos +
swap_halves(x) * sin, as it did before), taking turns in one process; the fastest step of each is
compared. All run in the precision train.py would choose on this CPU. `maps` times, in CPU
seconds, what `AttentionMaps` does after each validation (every layer's grid for its prompt, as
PNGs) at a config's shape: drawn into pixels as shipped (`viz/heatmap.py`) and as matplotlib
figures (`attention.layer_figure`, each laid out by its solver), taking turns.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

import torch

from minigpt.model import attention, fast
from minigpt.model.rotary import swap_halves
from minigpt.training.allocator import keep_freed_memory
from minigpt.training.precision import cpu_description, resolve_precision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the `suite` library
from suite.configs import BABY as BABY_SETTINGS
from suite.configs import ROOT, precision, read_yaml, section
from suite.runs import step_timer

BABY = str(ROOT / "benchmarks" / "baby.yaml")
CASES = {"baby": ("char.yaml", BABY), "char": ("char.yaml", None), "small": ("small.yaml", None)}


def logging_cost(steps: int) -> None:
    import lightning.pytorch as pl

    calls, seconds = [0], [0.0]
    log = pl.LightningModule.log

    def timed(self: pl.LightningModule, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        log(self, *args, **kwargs)
        seconds[0] += time.perf_counter() - start
        calls[0] += 1

    pl.LightningModule.log = timed
    os.environ.setdefault("WANDB_MODE", "disabled")
    sys.argv = ["train.py", "--config", "char.yaml", "--config", BABY, "--trainer.max_steps", str(steps)]
    sys.argv += ["--trainer.val_check_interval", str(steps + 1), "--trainer.enable_progress_bar", "false"]
    sys.argv += ["--trainer.default_root_dir", str(Path("runs") / "per_step_costs")]
    try:
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    except SystemExit as stop:
        if stop.code:
            raise
    print(
        f"{calls[0]} self.log calls in {steps} steps ({calls[0] / steps:.1f} a step), "
        f"{seconds[0] * 1000:.0f} ms in all, {seconds[0] / max(calls[0], 1) * 1e6:.0f} us each, "
        f"{seconds[0] / steps * 1000:.2f} ms a step"
    )


def qk_node_cost(case: str, rounds: int) -> None:
    file, over = CASES[case]
    config = read_yaml(file)
    extra = BABY_SETTINGS if over else {}
    gpt = section(config, extra, "gpt")
    if not (gpt.get("qk_norm") and gpt.get("position_embedding") == "rope"):
        raise SystemExit(f"error: {file} has no QK-norm with rotary positions to time")
    vocab = 65 if file == "char.yaml" else 4096
    bf16 = resolve_precision(precision(config), "cpu") == "bf16-mixed"
    one_node = attention.normalise_and_rotate

    def full_width(x: torch.Tensor, rotary: Any, start: int) -> torch.Tensor:
        return _FullWidthNode.apply(x, *rotary.tables(x, start))

    def two_nodes(x: torch.Tensor, rotary: Any, start: int) -> torch.Tensor:
        return rotary(attention.rms_normalise(x), start)  # the code before the node

    ways = {"one node": one_node, "two nodes": two_nodes}
    if not bf16:  # the full-width node was fp32's alone; bf16 took the two nodes before
        ways["one node, full width"] = full_width
    # A whole training step of the config's recipe per way (its own model and optimizer, the
    # same seed): the forward and backward, clipping, the optimizer's step, as train.py takes it.
    timers = {}
    for name in ways:
        torch.manual_seed(0)
        timers[name] = step_timer(config, extra, vocab)
    fastest = dict.fromkeys(ways, float("inf"))
    for r in range(rounds):
        for name in list(ways)[r % len(ways) :] + list(ways)[: r % len(ways)]:
            attention.normalise_and_rotate = ways[name]
            fastest[name] = min(fastest[name], *(timers[name]() for _ in range(3)))
    attention.normalise_and_rotate = one_node
    print(f"{case}: training steps in {'bf16' if bf16 else 'fp32'}, fastest of {rounds} x 3 steps each")
    for name, seconds in fastest.items():
        part = timers[name].fastest["forward+backward"]
        print(f"  {name}: step {seconds * 1000:.2f} ms, forward+backward {part * 1000:.2f} ms")
    for name in list(ways)[1:]:
        step = fastest[name] / fastest["one node"]
        part = timers[name].fastest["forward+backward"] / timers["one node"].fastest["forward+backward"]
        print(f"  {name} / one node: step {step:.3f}, forward+backward {part:.3f}")


def maps_cost(case: str, rounds: int) -> None:
    from minigpt.data import CharTokenizer
    from minigpt.model import GPT, GPTConfig
    from minigpt.training.callbacks.dashboard import AttentionMaps
    from minigpt.viz import attention as maps

    file, over = CASES[case]
    gpt = section(read_yaml(file), BABY_SETTINGS if over else {}, "gpt")
    prompt = AttentionMaps().prompt
    tokenizer = CharTokenizer("".join(sorted(set(prompt))))  # one token a character, as char.yaml's
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**gpt, "vocab_size": len(set(prompt))})).eval()

    weights, labels = maps.attention_of(model, tokenizer, prompt)

    def direct() -> list[bytes]:
        return list(maps.draw_attention(weights, labels, prompt).values())

    def matplotlib() -> list[bytes]:
        title = f'attention over "{maps.visible_token(prompt[:40])}"'
        figures = [maps.layer_figure(w, labels, title=f"layer {n}: {title}") for n, w in weights.items()]
        return [maps.figure_to_png(f) for f in figures]

    ways = {"pixels (shipped)": direct, "matplotlib": matplotlib}
    fastest = dict.fromkeys(ways, float("inf"))
    for r in range(rounds):
        for name in list(ways)[r % 2 :] + list(ways)[: r % 2]:
            start = time.process_time()
            pngs = ways[name]()
            fastest[name] = min(fastest[name], time.process_time() - start)
    print(
        f"{case}: {gpt['n_layer']} layers x {gpt['n_head']} heads, {len(labels)} tokens; fastest of {rounds}"
    )
    for name, seconds in fastest.items():
        print(f"  {name}: {seconds:.3f} CPU-s for {len(pngs)} PNGs")
    print(f"  matplotlib / pixels: {fastest['matplotlib'] / fastest['pixels (shipped)']:.1f}")


class _FullWidthNode(torch.autograd.Function):
    """The node as it was before it rotated a half at a time: the rotation over the full width,
    a product, a swapped copy and a sum, forward and backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        scale = fast._rms_scale(x)
        normalised = x * scale
        y = torch.addcmul(normalised * cos, swap_halves(normalised), sin)
        ctx.save_for_backward(y, scale, cos, sin)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        y, scale, cos, sin = ctx.saved_tensors
        u = fast._rms_gradient(grad, y)
        return torch.addcmul(u * cos, swap_halves(u), sin, value=-1).mul_(scale), None, None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("logging", "qk_node", "maps"))
    p.add_argument("--steps", type=int, default=300, help="logging: train.py steps")
    p.add_argument("--case", choices=sorted(CASES), default="baby", help="qk_node, maps: the shape")
    p.add_argument(
        "--rounds", type=int, default=None, help="qk_node, maps: rounds, the ways taking turns (30; maps 4)"
    )
    args = p.parse_args()
    print(f"CPU: {cpu_description()}; torch {torch.__version__}")
    keep_freed_memory()
    if args.what == "logging":
        logging_cost(args.steps)
    elif args.what == "maps":
        maps_cost(args.case, args.rounds or 4)
    else:
        qk_node_cost(args.case, args.rounds or 30)


if __name__ == "__main__":
    main()
