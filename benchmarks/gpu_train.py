#!/usr/bin/env python
"""Training-step speed on a CUDA GPU at GPT-2 small's shape: ours eager and compiled, with AdamW
and with Muon (torch's polynomial over five Newton-Schulz steps, and `polar_express` over three),
next to transformers' `GPT2LMHeadModel` at the same shape, in one run.

A step is what `train.py` does per optimizer step at accumulation 1: forward and loss under bf16
autocast (Lightning's `bf16-mixed`), backward, gradient clipping, the optimizer's step and
zeroing the gradients. Our model, loss and optimizer come from the project itself (`LitGPT.loss`,
which compiles the network, its head and the loss as one region as `--model.compile true` does,
and `build_optimizer`), built from a config's `model` section (`configs/gpt2-124m.yaml` by
default). The peer gets the same batch, autocast, loss function, clipping and AdamW; compiled, its
model, head and loss are one region too, as ours.

    python benchmarks/gpu_train.py                        # about 80 s on one H100
    python benchmarks/gpu_train.py --batch 16 --no-compile --out gpu.md
    python benchmarks/gpu_train.py --config modern-124m.yaml             # small.yaml's recipe
    python benchmarks/gpu_train.py --config modern-124m.yaml --levers    # its levers one at a time

Figures: each step's time is read between CUDA events recorded around consecutive steps (the
host runs ahead as in training), after warm-up steps; the table gives medians. MFU is model FLOPs
(`training_flops_per_token`: 6 x matmul weights + 12 x n_layer x n_embd x T per token) over the
bf16 dense peak measured in the same run: the median of large square bf16 matrix products, taken
before and after the steps (the faster of the two counts). Muon's cost is its step's time minus
AdamW's on the same model; the optimizer step alone is timed too, on the last step's gradients.

`--levers` times, eager with AdamW, GPT-2's recipe at the config's shape, that recipe with each of
the config's levers alone (each model setting where the config differs from `gpt2-124m.yaml`), and
the config in full, the models taking turns in one process: what each lever costs a step on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from minigpt.model import GPT, GPTConfig
from minigpt.training.config import OptimConfig
from minigpt.training.flops import training_flops_per_token
from minigpt.training.lit import LitGPT
from minigpt.training.loss import next_token_loss
from minigpt.training.optim import build_optimizer

from suite.configs import read_yaml
from suite.profiling import profile_calls

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""Mean next-token loss of input ids (B, T) against target ids (B, T)."""


@dataclass
class Row:
    """One contestant's figures."""

    model: str
    compiled: bool
    optimizer: str
    step_s: float
    optimizer_s: float
    first_step_s: float
    muon_s: float | None = None
    """Muon's own step (the blocks' matrices) without AdamW's, for `optimizer: muon`."""


def events_between(run: Callable[[], object], count: int) -> list[float]:
    """Seconds of each of `count` consecutive calls of `run`, read from CUDA events recorded between
    them: the device's time, launch gaps included, without a synchronisation per call."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
    events[0].record()
    for event in events[1:]:
        run()
        event.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:], strict=False)]


def matmul_peak(size: int = 8192, count: int = 20) -> float:
    """FLOP/s of a (size x size) @ (size x size) bf16 product on random data, median of `count`."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    events_between(lambda: a @ b, 3)  # cuBLAS's handle and kernel choice
    return 2 * size**3 / statistics.median(events_between(lambda: a @ b, count))


def ours(config: GPTConfig, optim: OptimConfig, compiled: bool) -> tuple[nn.Module, Loss]:
    """Our network on the GPU and its loss exactly as the training module computes it."""
    lit = LitGPT(config, optim, compile=compiled)
    lit.model = GPT(config).cuda()
    return lit.model, lit.loss


def peer(config: GPTConfig, compiled: bool) -> tuple[nn.Module, Loss]:
    """transformers' GPT-2 at `config`'s shape (no dropout, as ours), with our loss function."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=config.vocab_size,
            n_positions=config.context_length,
            n_embd=config.n_embd,
            n_layer=config.n_layer,
            n_head=config.n_head,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=config.layer_norm_eps,
            attn_implementation="sdpa",  # PyTorch's fused attention, as ours on a GPU
        )
    ).cuda()

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = model.transformer(input_ids=x, use_cache=False).last_hidden_state
        return next_token_loss(model.lm_head(hidden), y)

    return model, torch.compile(loss) if compiled else loss


def training_step(
    model: nn.Module,
    loss_of: Loss,
    optimizer: torch.optim.Optimizer,
    grad_clip: float | None,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
) -> Callable[[], None]:
    """One optimizer step per call, as `train.py` takes it at accumulation 1, on the next batch."""
    turn = iter(range(10**12))

    def step() -> None:
        x, y = batches[next(turn) % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(x, y)
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def time_contestant(
    name: str,
    compiled: bool,
    optimizers: dict[str, OptimConfig],
    build: Callable[[], tuple[nn.Module, Loss]],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    warmup: int,
    steps: int,
    profile_dir: Path | None = None,
) -> list[Row]:
    """Rows for one model, one per optimizer, the optimizers taking turns on the same network (so
    a compiled body is compiled once); with `profile_dir`, a profile of each one's steps there
    (`suite.profiling`)."""
    model, loss_of = build()
    rows = []
    for label, optim in optimizers.items():
        optimizer = build_optimizer(model, optim)
        step = training_step(model, loss_of, optimizer, optim.grad_clip, batches)
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        first = time.perf_counter() - start  # compilation, cuBLAS's and the allocator's first use
        events_between(step, warmup)
        step_s = statistics.median(events_between(step, steps))
        if profile_dir is not None:
            tag = label.replace(" ", "-")
            profile_calls(step, profile_dir / f"bare-{tag}", f"bare step, {name}, {label}", steps)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(*batches[0])
        loss.backward()  # gradients for the optimizer alone, stepped on them repeatedly
        optimizer_s = statistics.median(events_between(optimizer.step, steps))
        muon = getattr(optimizer, "muon", None)
        muon_s = statistics.median(events_between(muon.step, steps)) if muon is not None else None
        optimizer.zero_grad(set_to_none=True)
        rows.append(Row(name, compiled, label, step_s, optimizer_s, first, muon_s))
        print(f"{name} {'compiled' if compiled else 'eager'} {label}: {step_s * 1e3:.1f} ms", file=sys.stderr)
        del optimizer, step
    del model, loss_of
    torch.cuda.empty_cache()
    return rows


GPT2_RECIPE = "gpt2-124m.yaml"
SHAPE = ("vocab_size", "context_length", "n_layer", "n_head", "n_embd", "dropout")
"""Settings that make the shape, not the recipe: `--levers` keeps the config's."""


def lever_variants(config: GPTConfig, base: GPTConfig) -> dict[str, GPTConfig]:
    """GPT-2's recipe (`base`'s settings) at `config`'s shape, that with each setting in which `config`
    differs from it alone, and `config` itself."""
    gpt2 = replace(base, **{name: getattr(config, name) for name in SHAPE})
    levers = [f.name for f in dataclasses.fields(config) if getattr(config, f.name) != getattr(gpt2, f.name)]
    if config.activation != "gelu" and "gelu_approximate" in levers:
        levers.remove("gelu_approximate")  # no GELU left to approximate
    variants = {"GPT-2's recipe": gpt2}
    for name in levers:
        variants[f"{name}={getattr(config, name)}"] = replace(gpt2, **{name: getattr(config, name)})
    variants["the config"] = config
    return variants


def time_levers(
    variants: dict[str, GPTConfig],
    optim: OptimConfig,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    rounds: int,
    steps: int,
) -> str:
    """Median eager step of each variant, the models taking turns `rounds` times, against the first."""
    runs = {}
    for name, config in variants.items():
        model, loss_of = ours(config, optim, False)
        runs[name] = training_step(model, loss_of, build_optimizer(model, optim), optim.grad_clip, batches)
        events_between(runs[name], 4)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name in list(variants) if r % 2 == 0 else list(reversed(variants)):
            events_between(runs[name], 2)
            times[name] += events_between(runs[name], steps)
    first = statistics.median(next(iter(times.values())))
    tokens = batches[0][0].numel()
    lines = ["| model | ms/step | tokens/s | against GPT-2's recipe |", "|---|---|---|---|"]
    for name, seconds in times.items():
        step = statistics.median(seconds)
        lines.append(f"| {name} | {step * 1e3:.1f} | {tokens / step:,.0f} | {step / first:.3f}x |")
    return "\n".join(lines)


def table(rows: list[Row], tokens: int, flops_per_token: int, peak: float) -> str:
    lines = [
        "| model | compile | optimizer | ms/step | tokens/s | MFU | optimizer step ms | Muon's cost per step "
        "| first step s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    adamw = {(r.model, r.compiled): r.step_s for r in rows if r.optimizer == "adamw"}
    for r in rows:
        rate = tokens / r.step_s
        cost = ""
        if r.optimizer.startswith("muon") and (r.model, r.compiled) in adamw:
            extra = r.step_s - adamw[(r.model, r.compiled)]
            cost = f"{extra * 1e3:+.1f} ms ({extra / adamw[(r.model, r.compiled)]:+.1%})"
        optimizer = f"{r.optimizer_s * 1e3:.1f}"
        if r.muon_s is not None:
            optimizer += f" (Muon's part {r.muon_s * 1e3:.1f})"
        lines.append(
            f"| {r.model} | {'yes' if r.compiled else 'no'} | {r.optimizer} | {r.step_s * 1e3:.1f} "
            f"| {rate:,.0f} | {rate * flops_per_token / peak:.1%} | {optimizer} | {cost} "
            f"| {r.first_step_s:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="gpt2-124m.yaml", help="the model and optimizer settings to time")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: the config's)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps after the first")
    p.add_argument("--steps", type=int, default=20, help="timed steps per contestant")
    p.add_argument("--no-compile", action="store_true", help="eager contestants only")
    p.add_argument("--no-eager", action="store_true", help="compiled contestants only")
    p.add_argument("--no-peer", action="store_true", help="without transformers' GPT2LMHeadModel")
    p.add_argument(
        "--levers", action="store_true", help="the config's levers one at a time on GPT-2's recipe, eager"
    )
    p.add_argument("--rounds", type=int, default=6, help="--levers: rounds, the models taking turns")
    p.add_argument("--out", type=Path, default=None, help="also write the report here")
    p.add_argument(
        "--optimizers", default=None, help="comma-separated, of adamw, muon, 'muon polar_express 3'"
    )
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="also profile each of our steps into this folder (suite.profiling)",
    )
    args = p.parse_args()
    config = read_yaml(args.config)  # a bare name: configs/ first, then benchmarks/
    if not torch.cuda.is_available():
        raise SystemExit(
            f"error: gpu_train.py times training on a CUDA GPU; torch {torch.__version__} sees none"
        )
    gpt = GPTConfig(**config["model"]["gpt"])
    if gpt.vocab_size is None:
        raise SystemExit(f"error: {args.config} leaves model.gpt.vocab_size to the tokenizer; set it")
    batch = args.batch or int(config["data"]["config"]["batch_size"])
    adamw = OptimConfig(**{**config["model"].get("optim", {}), "optimizer": "adamw"})
    optimizers = {
        "adamw": adamw,
        "muon": replace(adamw, optimizer="muon"),  # torch's polynomial, 5 steps
        "muon polar_express 3": replace(
            adamw, optimizer="muon", muon_ns_coefficients="polar_express", muon_ns_steps=3
        ),
    }
    if args.optimizers:
        chosen = [name.strip() for name in args.optimizers.split(",")]
        unknown = [name for name in chosen if name not in optimizers]
        if unknown:
            raise SystemExit(
                f"error: --optimizers: unknown {unknown[0]!r}; choose from {', '.join(optimizers)}"
            )
        optimizers = {name: optimizers[name] for name in chosen}
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator(device="cuda").manual_seed(0)
    ids = [
        torch.randint(gpt.vocab_size, (batch, gpt.context_length + 1), device="cuda", generator=generator)
        for _ in range(4)
    ]
    batches = [(i[:, :-1], i[:, 1:]) for i in ids]

    start = time.perf_counter()
    tokens = batch * gpt.context_length
    if args.levers:
        base = GPTConfig(**read_yaml(GPT2_RECIPE)["model"]["gpt"])
        result = time_levers(lever_variants(gpt, base), adamw, batches, args.rounds, args.steps // 2)
        report = (
            f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}); "
            f"{gpt.n_layer} layers x {gpt.n_head} heads x {gpt.n_embd} wide, context {gpt.context_length}, "
            f"batch {batch} ({tokens:,} tokens per step), bf16 autocast, eager, AdamW; medians of "
            f"{args.rounds} x {args.steps // 2} steps, the models taking turns; "
            f"{time.perf_counter() - start:.0f} s in all\n\n{result}"
        )
        print(report)
        if args.out:
            args.out.write_text(report + "\n", encoding="utf-8")
        return
    peaks = [matmul_peak()]
    rows: list[Row] = []
    ways = [
        compiled
        for compiled in (False, True)
        if not (args.no_compile and compiled or args.no_eager and not compiled)
    ]
    if not ways:
        raise SystemExit("error: --no-compile and --no-eager leave nothing to time")
    for compiled in ways:
        ours_built = functools.partial(ours, gpt, adamw, compiled)
        rows += time_contestant(
            "minigpt", compiled, optimizers, ours_built, batches, args.warmup, args.steps, args.profile
        )
        if not args.no_peer:
            rows += time_contestant(
                "transformers GPT2LMHeadModel (sdpa)",
                compiled,
                {"adamw": adamw},
                functools.partial(peer, gpt, compiled),
                batches,
                args.warmup,
                args.steps,
            )
    peaks.append(matmul_peak())
    peak = max(peaks)

    flops = training_flops_per_token(gpt)
    report = (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}); "
        f"{gpt.n_layer} layers x {gpt.n_head} heads x {gpt.n_embd} wide, context {gpt.context_length}, "
        f"vocab {gpt.vocab_size:,}, batch {batch} ({tokens:,} tokens per step), bf16 autocast; "
        f"{flops / 1e6:.1f} MFLOPs per token; bf16 peak measured {peak / 1e12:.0f} TFLOP/s "
        f"(8192³ products: {', '.join(f'{x / 1e12:.0f}' for x in peaks)}); medians of {args.steps} steps "
        f"after {args.warmup + 1} warm-up; {time.perf_counter() - start:.0f} s in all\n\n"
        + table(rows, tokens, flops, peak)
    )
    print(report)
    if args.out:
        args.out.write_text(report + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
