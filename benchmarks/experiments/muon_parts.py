#!/usr/bin/env python
"""Where Muon's step goes at a config's shape: building the stacks (Nesterov's look-ahead written
into them), each stack's Newton-Schulz products with their GFLOP and GFLOP/s, the momentum, the
weight decay and the update, and the whole step, beside the step of the AdamW that takes the other
parameters and a 512 x 512 product's GFLOP/s on this machine, in train.py's precision and with its
allocator setting. The parts take turns for `--rounds` rounds; each figure is the fastest seen.

    python benchmarks/experiments/muon_parts.py                  # nanoGPT's baby shape, char.yaml
    python benchmarks/experiments/muon_parts.py --case char --rounds 10

The question it answered: is what char.yaml's recipe adds to a step at the baby shape Muon's
arithmetic, or work around it that could go ([CPU speed](../../docs/results/cpu-speed.md))?
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARKS))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from minigpt.model import GPT, GPTConfig  # noqa: E402
from minigpt.training.allocator import keep_freed_memory  # noqa: E402
from minigpt.training.config import OptimConfig  # noqa: E402
from minigpt.training.muon import newton_schulz, ns_schedule, orthogonalise  # noqa: E402
from minigpt.training.optim import build_optimizer  # noqa: E402
from speed_check import CASES, square_product_speed, vocab_size  # noqa: E402

from suite.configs import read_yaml, section  # noqa: E402


def parts(case: str, work: Path) -> tuple[dict[str, Callable[[], object]], dict[str, float]]:
    """The timed parts of one Muon step of `case`'s model with made-up gradients, and the GFLOP of
    each stack's Newton-Schulz products."""
    file, extra = CASES[case]
    config = read_yaml(file)
    gpt = GPT(GPTConfig(**{**section(config, extra, "gpt"), "vocab_size": vocab_size(config, work)}))
    optimizer = build_optimizer(gpt, OptimConfig(**section(config, extra, "optim")))
    muon = getattr(optimizer, "muon", None)
    if muon is None:
        raise SystemExit(f"error: {file} does not train with Muon")
    for param in gpt.parameters():
        param.grad = torch.randn_like(param) * 1e-3
    optimizer.step()  # the momentum buffers
    group = muon.param_groups[0]
    params = list(group["params"])
    grads = [p.grad for p in params]
    buffers = [muon.state[p]["momentum_buffer"] for p in params]
    coefficients = ns_schedule(group["ns_coefficients"], group["ns_steps"])
    blocks = [muon.row_blocks.get(p) for p in params]
    dtype = muon.orthogonalisation_dtype("cpu")
    stacks: dict[tuple[int, int], list[int]] = {}  # the parameters of each stack's shape
    for i, (param, rows) in enumerate(zip(params, blocks, strict=True)):
        stacks.setdefault((rows or param.shape[0], param.shape[1]), []).append(i)

    def look_ahead() -> None:
        """What `orthogonalise` does before its products: the look-ahead, written into each stack."""
        for (rows, cols), members in stacks.items():
            count = [params[i].numel() // (rows * cols) for i in members]
            stack = torch.empty(sum(count), rows, cols, dtype=dtype)
            start = 0
            for i, n in zip(members, count, strict=True):
                grad, buffer = grads[i].view(n, rows, cols), buffers[i].view(n, rows, cols)
                torch.lerp(grad, buffer, 0.95, out=stack[start : start + n])
                start += n

    timed: dict[str, Callable[[], object]] = {"stacks built": look_ahead}
    gflop = {}
    for (rows, cols), members in stacks.items():
        stack = torch.cat([buffers[i].view(-1, rows, cols) for i in members]).to(dtype)
        name = f"Newton-Schulz, {len(stack)} x {stack.shape[1]} x {stack.shape[2]}"
        timed[name] = lambda stack=stack: newton_schulz(stack, coefficients, group["eps"], muon.ns_norm)
        with FlopCounterMode(display=False) as counter:
            timed[name]()
        gflop[name] = counter.get_total_flops() / 1e9
    timed["orthogonalise (stacks and products)"] = lambda: orthogonalise(
        buffers, coefficients, group["eps"], dtype, blocks, norm=muon.ns_norm, lerp_from=grads, weight=0.95
    )
    timed["momentum (one foreach lerp)"] = lambda: torch._foreach_lerp_(buffers, grads, 0.05)
    timed["weight decay (one foreach mul)"] = lambda: torch._foreach_mul_(params, 1.0)
    timed["update (one foreach add)"] = lambda: torch._foreach_add_(params, grads, alpha=0.0)
    timed["Muon's whole step"] = muon.step
    timed["AdamW's whole step (the other parameters)"] = optimizer.adamw.step
    return timed, gflop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=sorted(CASES), default="baby")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    keep_freed_memory()  # as train.py runs
    with tempfile.TemporaryDirectory() as work, torch.no_grad():
        timed, gflop = parts(args.case, Path(work))
        best = dict.fromkeys(timed, float("inf"))
        for _ in range(args.rounds):
            for name, run in timed.items():
                start = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - start)
    speed = square_product_speed(torch.float32)
    print(f"{args.case}, fp32, {torch.get_num_threads()} threads; 512 x 512 products at {speed:.0f} GFLOP/s")
    print("| part | ms | GFLOP | GFLOP/s |")
    print("|---|---|---|---|")
    for name, seconds in best.items():
        work_done = gflop.get(name)
        figures = f"{work_done:.3f} | {work_done / seconds:.0f}" if work_done else " | "
        print(f"| {name} | {seconds * 1e3:.3f} | {figures} |")
    products = sum(best[name] for name in gflop) * 1e3
    print(f"| every stack's products | {products:.3f} | {sum(gflop.values()):.3f} | |")


if __name__ == "__main__":
    main()
